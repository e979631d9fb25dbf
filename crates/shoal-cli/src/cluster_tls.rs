//! `shoal cluster ca`, `shoal cluster keygen --ca` and `shoal cluster
//! revoke`: the cluster's TLS material for a hand-written cluster file
//! (docs/deployment.md, "TLS between hosts").

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use shoal_cluster::tls::issue;

const DAY: Duration = Duration::from_secs(86_400);

#[derive(clap::Args, Debug)]
pub struct CaArgs {
    /// The directory to write `ca.crt` and `ca.key` (owner-only) into;
    /// neither may exist yet. Keep `ca.key` off the cluster's hosts.
    #[arg(long)]
    pub out: PathBuf,
    /// How long the CA is valid.
    #[arg(long, default_value_t = 3650)]
    pub days: u64,
}

#[derive(clap::Args, Debug)]
pub struct CertArgs {
    /// The CA's directory (`ca.key`).
    #[arg(long)]
    pub ca: PathBuf,
    /// The node the certificate is for.
    #[arg(long)]
    pub node: u32,
    /// The node's X25519 public key (its `public_key`, 64 hex digits), which
    /// the certificate is bound to; leave out in a cluster without per-node
    /// keys.
    #[arg(long)]
    pub public_key: Option<String>,
    /// Where to write: `<out>.crt` and its private key `<out>.tls`
    /// (owner-only); existing ones are replaced.
    #[arg(long)]
    pub out: PathBuf,
    /// How long the certificate is valid.
    #[arg(long, default_value_t = 365)]
    pub days: u64,
}

#[derive(clap::Args, Debug)]
pub struct RevokeArgs {
    /// The CA's directory (`ca.key`).
    #[arg(long)]
    pub ca: PathBuf,
    /// The certificate to revoke; without it the list is written again as
    /// it is (made empty if absent: what nodes read before any revocation,
    /// or a list renewed before its next update).
    #[arg(long)]
    pub cert: Option<PathBuf>,
    /// The revocation list to add it to (written whole again, atomically;
    /// made if absent): every host's `tls_crl`.
    #[arg(long)]
    pub crl: PathBuf,
    /// How long the list is valid (its next update).
    #[arg(long, default_value_t = 365)]
    pub days: u64,
}

/// Writes `contents` to a new file `path` with `mode`.
fn write_new(path: &Path, contents: &str, mode: u32) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("write {}", path.display()))
}

/// Writes `contents` over `path` through a new file renamed into place: a
/// daemon reading it (it looks again every second) never sees half.
fn replace(path: &Path, contents: &str, mode: u32) -> Result<()> {
    let fresh = path.with_extension("new");
    let _ = std::fs::remove_file(&fresh);
    write_new(&fresh, contents, mode)?;
    std::fs::rename(&fresh, path)
        .with_context(|| format!("rename {} to {}", fresh.display(), path.display()))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))
}

pub fn ca(args: CaArgs) -> Result<()> {
    let cert = make_ca(&args)?;
    println!("tls_ca = {:?}", cert.display().to_string());
    Ok(())
}

/// Writes a new CA into `args.out`; returns its certificate's path.
fn make_ca(args: &CaArgs) -> Result<PathBuf> {
    std::fs::create_dir_all(&args.out).with_context(|| format!("create {}", args.out.display()))?;
    let pem = issue::new_ca(DAY * args.days as u32)?;
    write_new(&args.out.join("ca.key"), &pem.key, 0o600)?;
    let cert = args.out.join("ca.crt");
    write_new(&cert, &pem.cert, 0o644)?;
    Ok(cert)
}

/// `shoal cluster cert`: a node's certificate, issued on the CA's machine
/// for the public key the node's host sent (its private key never leaves
/// that host).
pub fn cert(args: CertArgs) -> Result<()> {
    let public_key = match &args.public_key {
        None => None,
        Some(hex) => Some(
            shoal_cluster::node_keys::from_hex(hex)
                .with_context(|| format!("--public-key {hex:?} is not 64 hex digits"))?,
        ),
    };
    let (cert, tls_key) = node_cert(
        &args.ca,
        args.node,
        public_key.as_ref(),
        &args.out,
        args.days,
    )?;
    println!(
        "tls_cert = {:?}\ntls_key = {:?}",
        cert.display().to_string(),
        tls_key.display().to_string()
    );
    Ok(())
}

/// Node `node`'s certificate (bound to its X25519 `public_key`, if the
/// cluster has per-node keys), beside `out`: `<out>.crt` and `<out>.tls`
/// (owner-only). Existing ones are replaced (a rotation: the daemon
/// reloads them).
pub fn node_cert(
    ca_dir: &Path,
    node: u32,
    public_key: Option<&[u8; 32]>,
    out: &Path,
    days: u64,
) -> Result<(PathBuf, PathBuf)> {
    let ca_key = shoal_cluster::node_keys::read_private(&ca_dir.join("ca.key"), "CA key")?;
    let now = SystemTime::now();
    let pem = issue::node_cert(
        &ca_key,
        node,
        public_key,
        now - Duration::from_secs(60),
        now + DAY * days as u32,
    )?;
    let cert = out.with_extension("crt");
    let tls_key = out.with_extension("tls");
    replace(&tls_key, &pem.key, 0o600)?;
    replace(&cert, &pem.cert, 0o644)?;
    Ok((cert, tls_key))
}

/// `cluster up --tls`: a CA in `dir/tls` (made anew each time) and a
/// certificate per node bound to its key.
pub fn emulated(
    dir: &Path,
    identities: &[shoal_cluster::NodeIdentity],
) -> Result<(shoal_cluster::TlsTrust, Vec<shoal_cluster::NodeTls>)> {
    let tls = dir.join("tls");
    let _ = std::fs::remove_dir_all(&tls);
    std::fs::create_dir(&tls).with_context(|| format!("create {}", tls.display()))?;
    make_ca(&CaArgs {
        out: tls.clone(),
        days: 30,
    })?;
    let certificates = identities
        .iter()
        .enumerate()
        .map(|(i, identity)| {
            let (cert, key) = node_cert(
                &tls,
                i as u32,
                Some(&identity.public_key),
                &tls.join(format!("n{i}")),
                30,
            )?;
            Ok(shoal_cluster::NodeTls { cert, key })
        })
        .collect::<Result<_>>()?;
    let trust = shoal_cluster::TlsTrust {
        ca: tls.join("ca.crt"),
        crl: None,
    };
    Ok((trust, certificates))
}

pub fn revoke(args: RevokeArgs) -> Result<()> {
    let ca_key = shoal_cluster::node_keys::read_private(&args.ca.join("ca.key"), "CA key")?;
    let mut serials = match args.crl.exists() {
        true => issue::revoked_serials(&read(&args.crl)?)?,
        false => Vec::new(),
    };
    if let Some(cert) = &args.cert {
        let serial = issue::serial_of(&read(cert)?)?;
        if serials.contains(&serial) {
            bail!(
                "{} is revoked already in {}",
                cert.display(),
                args.crl.display()
            );
        }
        serials.push(serial);
    }
    // Numbered by the time: each list supersedes the one before.
    let number = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let crl = issue::revocation_list(&ca_key, &serials, number, DAY * args.days as u32)?;
    replace(&args.crl, &crl, 0o644)?;
    match &args.cert {
        Some(cert) => print!("revoked {} ", cert.display()),
        None => print!("written "),
    }
    println!(
        "({} certificates in {}); tls_crl = {:?}",
        serials.len(),
        args.crl.display(),
        args.crl.display().to_string()
    );
    Ok(())
}

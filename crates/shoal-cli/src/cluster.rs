//! `shoal cluster up | down | status` and `shoal ls --cluster`.
//!
//! `up` emulates a cluster on this host: one daemon per node, each with its
//! own socket, /dev/shm region and peer RPC port, described by a cluster file
//! it writes (the same format `shoal serve --cluster FILE --node N` reads on
//! real multi-host clusters). `status` and `ls --cluster` ask every node over
//! the peer RPC as a node of the cluster (with the key of the first node
//! whose key file is readable here), so they work on real clusters too.
//! `up` gives every node a key pair of its own (`nK.key`, owner-only; the
//! public keys go into the cluster file), so no node can speak as another.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use shoal_cluster::auth::{Credentials, PeerIdentity};
use shoal_cluster::node_keys::NodeKey;
use shoal_cluster::proto::peer_client::PeerClient;
use shoal_cluster::proto::{Empty, NodeStatus};
use shoal_cluster::tls::TlsMaterial;
use shoal_cluster::{Access, Address, Node, NodeIdentity, NodeTiers, Topology};
use shoal_core::coherence::CoherenceMode;
use shoal_core::units::{format_size, parse_size};

use crate::node_process::{Found, NodeProcess};
use rustix::process::Signal;

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Number of nodes (daemons) to start.
    #[arg(long, short = 'n', default_value_t = 3)]
    pub nodes: u32,
    /// Directory for the cluster file, sockets, logs and pid files
    /// [default: cluster/ beside the default socket].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Memory per node, e.g. 256MiB.
    #[arg(long, short = 'm', value_parser = parse_size, default_value = "256MiB")]
    pub capacity: u64,
    /// Access mode per node, comma-separated and cycled (e.g. "mapped,network").
    #[arg(long, default_value = "mapped")]
    pub modes: String,
    /// coherent (one host) or noncoherent (flush before seal, invalidate before read).
    #[arg(long, default_value = "coherent")]
    pub coherence: String,
    /// Emulate the caches of a non-coherent fabric (needs --coherence noncoherent):
    /// clients see peers' memory only through flush and invalidate.
    #[arg(long)]
    pub simulate_caches: bool,
    /// How long a node keeps a remote reference after its clients released it
    /// (a loan: a repeated get needs no round trip); 0 returns it at once.
    #[arg(long, default_value_t = 1000)]
    pub linger_ms: u64,
    /// First port: node i of n gets base+2i (peer RPC), base+2i+1 (data) and
    /// base+2n+i (metrics); 0 picks free ports.
    #[arg(long, default_value_t = 0)]
    pub base_port: u16,
    /// Do not serve /metrics and the status page (by default each node
    /// serves them on a loopback port of its own).
    #[arg(long)]
    pub no_metrics: bool,
    /// Cluster name (prefix of the /dev/shm regions).
    #[arg(long, default_value = "local")]
    pub name: String,
    /// Memory only: no burst buffer or backing store below it (by default
    /// each node gets a burst buffer in DIR/nI/burst, 4× its memory, and a
    /// backing directory DIR/backing/nI, standing for a shared file system).
    #[arg(long)]
    pub no_tiers: bool,
    /// Default durability of every node's seals: memory, local or backing.
    #[arg(long, default_value = "memory", conflicts_with = "no_tiers")]
    pub durability: String,
    /// Peer traffic over TLS 1.3 even on this host (what hosts apart
    /// require): a CA in DIR/tls and a certificate per node.
    #[arg(long)]
    pub tls: bool,
}

#[derive(clap::Args, Debug)]
pub struct DirArgs {
    /// The cluster's directory [default: cluster/ beside the default socket].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// A cluster file instead of a directory made by `cluster up`.
    #[arg(long, conflicts_with = "dir")]
    pub file: Option<PathBuf>,
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct KeygenArgs {
    /// Where to write the private key (must not exist yet, unless --ca
    /// issues a new certificate for it); the node's `key_file`.
    #[arg(long)]
    pub out: PathBuf,
    /// Also issue the node's TLS certificate with the CA in this directory
    /// (`shoal cluster ca`): `<out>.crt` and its key `<out>.tls`.
    #[arg(long, requires = "node")]
    pub ca: Option<PathBuf>,
    /// The node the certificate is for (with --ca).
    #[arg(long)]
    pub node: Option<u32>,
    /// How long the certificate is valid (with --ca).
    #[arg(long, default_value_t = 365)]
    pub days: u64,
}

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The cluster file.
    pub file: PathBuf,
    /// Count warnings as errors (exit status 1).
    #[arg(long)]
    pub strict: bool,
}

/// `shoal cluster check FILE`: what the daemons would refuse (errors), what
/// is valid but probably not meant (warnings; some checked from this
/// machine: host names that do not resolve here, a token others can read),
/// and, for a valid file, how every node is reached.
pub fn check(args: CheckArgs) -> Result<()> {
    let file = &args.file;
    let text = std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
    let checked = Topology::check(&text, file.parent());
    let mut warnings = checked.warnings;
    if let Some(topology) = &checked.topology {
        let token = shoal_cluster::check::token_source(&text, file);
        warnings.extend(shoal_cluster::check::environment(
            topology,
            token.as_deref(),
            Address::resolve,
        ));
        print_layout(topology);
    }
    for error in &checked.errors {
        println!("error: {error}");
    }
    for warning in &warnings {
        println!("warning: {warning}");
    }
    let (errors, warned) = (checked.errors.len(), warnings.len());
    let counts = format!(
        "{errors} error{}, {warned} warning{}",
        if errors == 1 { "" } else { "s" },
        if warned == 1 { "" } else { "s" }
    );
    if errors > 0 || (args.strict && warned > 0) {
        bail!("{}: {counts}", file.display());
    }
    println!("{}: valid ({counts})", file.display());
    Ok(())
}

/// A valid file as the daemons will read it: hosts, addresses dialed and
/// bound, and who maps or pulls each node's memory.
fn print_layout(t: &Topology) {
    let hosts = shoal_cluster::check::hosts(t);
    println!(
        "cluster {:?}: {} node{} on {} host{}, {}, {}",
        t.name,
        t.nodes.len(),
        if t.nodes.len() == 1 { "" } else { "s" },
        hosts.len(),
        if hosts.len() == 1 { "" } else { "s" },
        t.coherence,
        if t.has_identities() {
            "per-node keys"
        } else {
            "shared token only"
        }
    );
    println!(
        "peer traffic: {}",
        match (&t.tls, t.insecure_cleartext) {
            (Some(tls), _) => format!("TLS 1.3, CA {}", tls.ca.display()),
            (None, true) => "cleartext between hosts (insecure_cleartext)".to_owned(),
            (None, false) => "cleartext, every address on loopback".to_owned(),
        }
    );
    let list = |ids: &[u32]| {
        ids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (host, ids) in &hosts {
        println!(
            "host {host:?}: node{} {}",
            if ids.len() == 1 { "" } else { "s" },
            list(ids)
        );
        for &id in ids {
            let Ok(n) = t.node(id) else { continue };
            let (mapped, pulled): (Vec<u32>, Vec<u32>) = t
                .nodes
                .iter()
                .map(|m| m.id)
                .filter(|&m| m != id)
                .partition(|&m| t.maps(m, id));
            let mut reach = format!("access {}", n.access.as_str());
            if !mapped.is_empty() {
                reach += &format!(", mapped by {}", list(&mapped));
            }
            if !pulled.is_empty() {
                reach += &format!(", pulled by {}", list(&pulled));
            }
            println!(
                "  node {id}: rpc {} (binds {}), data {} (binds {}), {reach}",
                n.rpc,
                n.listen_address(),
                n.data,
                n.data_listen_address()
            );
        }
    }
}

pub fn keygen(args: KeygenArgs) -> Result<()> {
    // With --ca, an existing key gets a new certificate (a rotation).
    let key = match (&args.ca, args.out.exists()) {
        (Some(_), true) => NodeKey::load(&args.out)?,
        _ => {
            let key = NodeKey::generate()?;
            key.save(&args.out)?;
            key
        }
    };
    println!(
        "public_key = \"{}\"\nkey_file = {:?}",
        shoal_cluster::node_keys::to_hex(&key.public()),
        args.out.display().to_string()
    );
    if let (Some(ca), Some(node)) = (&args.ca, args.node) {
        let (cert, tls_key) =
            crate::cluster_tls::node_cert(ca, node, Some(&key.public()), &args.out, args.days)?;
        println!(
            "tls_cert = {:?}\ntls_key = {:?}",
            cert.display().to_string(),
            tls_key.display().to_string()
        );
    }
    Ok(())
}

pub fn default_dir() -> PathBuf {
    shoal_core::local_auth::default_socket()
        .parent()
        .map_or_else(|| PathBuf::from("/tmp"), Path::to_path_buf)
        .join("cluster")
}

fn cluster_file(dir: &Path) -> PathBuf {
    dir.join("cluster.toml")
}

fn free_ports(n: usize) -> Result<Vec<u16>> {
    // Held together so the ports differ; released just before the daemons bind them.
    let listeners: Vec<_> = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<std::io::Result<_>>()?;
    Ok(listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<_>>()?)
}

/// A new key pair per node, its private half in `dir/nK.key` (0600; a key
/// left by an earlier cluster in this directory is replaced).
fn node_identities(dir: &Path, nodes: u32) -> Result<Vec<NodeIdentity>> {
    (0..nodes)
        .map(|i| {
            let key_file = dir.join(format!("n{i}.key"));
            match std::fs::remove_file(&key_file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("remove {}", key_file.display()))
                }
                _ => {}
            }
            let key = NodeKey::generate()?;
            key.save(&key_file)?;
            Ok(NodeIdentity {
                public_key: key.public(),
                key_file,
            })
        })
        .collect()
}

fn random_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn up(args: UpArgs, self_command: &[String], log_format: &str) -> Result<()> {
    if args.nodes == 0 {
        bail!("a cluster needs at least one node");
    }
    let dir = args.dir.unwrap_or_else(default_dir);
    if cluster_file(&dir).exists() {
        bail!(
            "a cluster is already up in {} (run `shoal cluster down` first)",
            dir.display()
        );
    }
    // Owner-only, and refused if another user could change its entries: it
    // holds the token, the sockets and the pid files `down` acts on.
    shoal_core::local_auth::ensure_trusted_dir(&dir)?;
    // Absolute, so the daemons' command lines name their cluster file
    // wherever `down` runs from (it checks them before signalling).
    let dir = dir
        .canonicalize()
        .with_context(|| format!("resolve {}", dir.display()))?;
    let modes: Vec<Access> = args
        .modes
        .split(',')
        .map(|m| m.trim().parse())
        .collect::<Result<_, _>>()?;
    let coherence: CoherenceMode = args.coherence.parse()?;
    args.durability
        .parse::<shoal_core::durability::Durability>()?;
    let uid = shoal_core::local_auth::my_uid();
    let identities = node_identities(&dir, args.nodes)?;
    // Ports picked free are released before the daemons bind them, so another
    // process may take one meanwhile: then the cluster is started again on
    // fresh ports. Fixed ports (--base-port) are tried once.
    let attempts = if args.base_port == 0 { 3 } else { 1 };
    let mut attempt = 0;
    let topology = loop {
        attempt += 1;
        // Per node: peer RPC, then the bulk data channel; after them all,
        // one metrics port per node.
        let ports = if args.base_port == 0 {
            free_ports(3 * args.nodes as usize)?
        } else {
            (0..3 * args.nodes)
                .map(|i| {
                    u16::try_from(i)
                        .ok()
                        .and_then(|i| args.base_port.checked_add(i))
                        .context("--base-port leaves too few ports for the nodes")
                })
                .collect::<Result<_>>()?
        };
        let nodes: Vec<Node> = (0..args.nodes)
            .map(|i| Node {
                id: i,
                host: None,
                rpc: SocketAddr::from((Ipv4Addr::LOCALHOST, ports[2 * i as usize])).into(),
                data: SocketAddr::from((Ipv4Addr::LOCALHOST, ports[2 * i as usize + 1])).into(),
                listen: None,
                data_listen: None,
                socket: dir.join(format!("n{i}.sock")),
                region: PathBuf::from(format!("/dev/shm/shoal-{uid}-{}-n{i}", args.name)),
                region_size: args.capacity,
                access: modes[i as usize % modes.len()],
                elastic: None,
                tiers: if args.no_tiers {
                    NodeTiers::default()
                } else {
                    NodeTiers {
                        burst: Some(dir.join(format!("n{i}")).join("burst")),
                        burst_capacity: Some(args.capacity.saturating_mul(4)),
                        backing: Some(
                            dir.join("backing")
                                .join(format!("n{i}"))
                                .display()
                                .to_string(),
                        ),
                        backing_capacity: None,
                        durability: Some(args.durability.clone()),
                    }
                },
                metrics: (!args.no_metrics).then(|| {
                    SocketAddr::from((Ipv4Addr::LOCALHOST, ports[(2 * args.nodes + i) as usize]))
                }),
                identity: Some(identities[i as usize].clone()),
                tls: None,
            })
            .collect();
        let tls = if args.tls {
            Some(crate::cluster_tls::emulated(&dir, &identities)?)
        } else {
            None
        };
        let mut nodes = nodes;
        if let Some((_, certificates)) = &tls {
            for (node, certificate) in nodes.iter_mut().zip(certificates) {
                node.tls = Some(certificate.clone());
            }
        }
        let topology = Topology {
            name: args.name.clone(),
            token: random_token(),
            coherence,
            simulate_caches: args.simulate_caches,
            heartbeat: Duration::from_millis(200),
            lease: Duration::from_millis(2000),
            linger: Duration::from_millis(args.linger_ms),
            quarantine: None,
            membership: None,
            tls: tls.map(|(trust, _)| trust),
            insecure_cleartext: false,
            nodes,
        };
        let bar = crate::progress::bar(
            u64::from(args.nodes),
            &format!("starting {} daemons", args.nodes),
        );
        let started = start_daemons(&topology, &dir, self_command, log_format, &bar)?;
        bar.finish_and_clear();
        match started {
            None => break topology,
            Some(failure) if failure.port_taken && attempt < attempts => {
                tracing::debug!("{}; starting again on other ports", failure.message);
            }
            Some(failure) => bail!("{}", failure.message),
        }
    };
    let file = cluster_file(&dir);
    let deadline = Instant::now() + Duration::from_secs(30);
    // Up means ready: every node's directory rebuilt (its peers told it
    // what they hold), so creates anywhere succeed at once.
    let bar = crate::progress::bar(
        topology.nodes.len() as u64,
        "nodes rebuilding their directories",
    );
    let speaker = speaking_as(&topology)?;
    let ready = block_on(async {
        for node in &topology.nodes {
            loop {
                let rebuilding = match connect(&speaker, node).await {
                    Ok(mut rpc) => rpc
                        .status(Empty {})
                        .await
                        .map(|r| r.into_inner().rebuilding),
                    Err(err) => Err(tonic::Status::unavailable(err.to_string())),
                };
                if let Ok(false) = rebuilding {
                    bar.inc(1);
                    break;
                }
                if Instant::now() > deadline {
                    bail!("node {} did not finish starting: {rebuilding:?}", node.id);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(())
    });
    bar.finish_and_clear();
    if let Err(err) = ready {
        // Nothing is left running of a cluster that did not come up.
        let _ = down(DirArgs {
            dir: Some(dir.clone()),
            file: None,
            json: false,
        });
        return Err(err);
    }
    println!(
        "shoal cluster {:?} up: {} nodes, {} each, {} ({})",
        topology.name,
        topology.nodes.len(),
        format_size(args.capacity),
        topology.coherence,
        file.display()
    );
    for n in &topology.nodes {
        println!(
            "  node {}  socket {}  rpc {}  data {}  {}  region {}",
            n.id,
            n.socket.display(),
            n.rpc,
            n.data,
            n.access.as_str(),
            n.region.display()
        );
        if let Some(metrics) = n.metrics {
            println!("          metrics http://{metrics}/metrics  status http://{metrics}/");
        }
    }
    Ok(())
}

/// Why the daemons of a cluster did not all come up.
struct StartFailure {
    message: String,
    /// A daemon found one of its ports taken.
    port_taken: bool,
}

/// Writes the cluster file and starts one daemon per node, until each
/// accepts clients. On a failure every daemon started is stopped and the
/// files are removed again, so the caller may simply try again.
fn start_daemons(
    topology: &Topology,
    dir: &Path,
    self_command: &[String],
    log_format: &str,
    bar: &indicatif::ProgressBar,
) -> Result<Option<StartFailure>> {
    let file = cluster_file(dir);
    write_private(&file, &topology.to_toml())?;
    let (program, prefix) = self_command
        .split_first()
        .context("no command to start daemons with")?;
    let mut children = Vec::new();
    let mut failure = None;
    for node in &topology.nodes {
        let log = shoal_core::local_auth::open_private_log(&dir.join(format!("n{}.log", node.id)))?;
        // Each start's log on its own: a failure is diagnosed from it below.
        log.set_len(0)?;
        let mut command = Command::new(program);
        command
            .args(prefix)
            .args(["--log-format", log_format, "serve", "--cluster"])
            .arg(&file)
            .args(["--node", &node.id.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Its own session: the daemons outlive this command and a ^C to it.
        // SAFETY: the hook runs in the child between fork and exec and calls
        // only setsid(2), which is async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("start node {}", node.id))?;
        std::fs::write(
            dir.join(format!("n{}.pid", node.id)),
            child.id().to_string(),
        )?;
        children.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    'nodes: for (node, child) in topology.nodes.iter().zip(&mut children) {
        while shoal_client::Client::connect(&node.socket).is_err() {
            let exited = child.try_wait().ok().flatten().is_some();
            if exited || Instant::now() > deadline {
                let log = dir.join(format!("n{}.log", node.id));
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                failure = Some(StartFailure {
                    port_taken: tail.contains("Address already in use"),
                    message: format!("node {} did not come up; its log:\n{tail}", node.id),
                });
                break 'nodes;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bar.inc(1);
    }
    if failure.is_some() {
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for node in &topology.nodes {
            let _ = std::fs::remove_file(dir.join(format!("n{}.pid", node.id)));
            let _ = std::fs::remove_file(&node.region);
        }
        let _ = std::fs::remove_file(&file);
    }
    Ok(failure)
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // The file holds the cluster token: owner-only.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("write {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

pub fn down(args: DirArgs) -> Result<()> {
    let dir = args.dir.unwrap_or_else(default_dir);
    if !dir.exists() {
        bail!("no cluster in {}", dir.display());
    }
    // Pid files in a directory another user can write could be anyone's.
    shoal_core::local_auth::check_trusted_dir(&dir)?;
    let file = cluster_file(&dir);
    let topology = Topology::load(&file).ok();
    let mut nodes = Vec::new();
    for entry in
        std::fs::read_dir(&dir).with_context(|| format!("no cluster in {}", dir.display()))?
    {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "pid") {
            continue;
        }
        let node = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.strip_prefix('n'))
            .and_then(|s| s.parse::<u32>().ok());
        let pid = std::fs::read_to_string(&path)?.trim().parse::<i32>().ok();
        std::fs::remove_file(&path)?;
        let (Some(node), Some(pid)) = (node, pid) else {
            eprintln!("shoal: ignoring {}: not a node's pid file", path.display());
            continue;
        };
        // Only a process proven to be that node's daemon is signalled: the
        // file may be stale (its pid reused) or planted.
        match NodeProcess::find(pid, &file, node)? {
            Found::Node(process) => nodes.push(process),
            Found::Gone => {}
            Found::Other(why) => {
                eprintln!(
                    "shoal: not stopping pid {pid} named by {}: {why}",
                    path.display()
                )
            }
        }
    }
    for process in &nodes {
        process.signal(Signal::TERM)?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for process in &nodes {
        if !process.wait_exit(deadline)? {
            process.signal(Signal::KILL)?;
        }
    }
    // Regions of nodes that were killed are left behind by them.
    if let Some(t) = &topology {
        for n in &t.nodes {
            let _ = std::fs::remove_file(&n.region);
            if let Some(identity) = &n.identity {
                let _ = std::fs::remove_file(&identity.key_file);
            }
        }
        // `up --tls`'s CA and certificates (only there: in the cluster's own directory).
        if t.tls
            .as_ref()
            .is_some_and(|tls| tls.ca == dir.join("tls").join("ca.crt"))
        {
            let _ = std::fs::remove_dir_all(dir.join("tls"));
        }
    }
    let _ = std::fs::remove_file(&file);
    println!("shoal cluster down: stopped {} daemons", nodes.len());
    Ok(())
}

pub fn load(args: &DirArgs) -> Result<Topology> {
    let file = args
        .file
        .clone()
        .unwrap_or_else(|| cluster_file(&args.dir.clone().unwrap_or_else(default_dir)));
    Topology::load(&file).map_err(Into::into)
}

/// Runs peer calls from the command line (one short-lived runtime).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}

type Rpc = PeerClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Credentials>,
>;

/// Who the command line is to peers, and its TLS material if the cluster
/// has TLS.
struct Speaker {
    identity: PeerIdentity,
    tls: Option<std::sync::Arc<TlsMaterial>>,
}

/// The command line speaks to peers as a node whose key it can read here
/// (node 0 with a shared token), with that node's TLS certificate if the
/// cluster has TLS; without them it stops with the reason.
fn speaking_as(topology: &Topology) -> Result<Speaker> {
    let identity = PeerIdentity::for_command_line(topology)?;
    let tls = TlsMaterial::load(topology, identity.me(), identity.clone())?;
    Ok(Speaker { identity, tls })
}

async fn connect(speaker: &Speaker, node: &Node) -> Result<Rpc> {
    let credentials = speaker.identity.credentials(node.id)?;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", node.rpc))?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2));
    let channel = shoal_cluster::tls::rpc::channel(endpoint, speaker.tls.as_ref(), node.id);
    Ok(PeerClient::with_interceptor(channel, credentials).max_decoding_message_size(256 << 20))
}

/// Nodes the file lacks that answering nodes learned from the membership
/// (their records, checked against this file), admitted by `identity`.
fn learned_nodes(topology: &Topology, speaker: &Speaker, answers: &[NodeStatus]) -> Vec<Node> {
    let mut learned: Vec<Node> = Vec::new();
    for record in answers.iter().flat_map(|s| &s.learned) {
        if topology.node(record.node).is_ok() || learned.iter().any(|n| n.id == record.node) {
            continue;
        }
        match topology.parse_record(record.node, &record.record) {
            Ok(node) if speaker.identity.learn(&node).is_ok() => learned.push(node),
            Ok(_) => {}
            Err(err) => eprintln!("shoal cluster: node {}'s record: {err}", record.node),
        }
    }
    learned
}

async fn node_status(speaker: &Speaker, node: &Node) -> Option<NodeStatus> {
    match connect(speaker, node).await {
        Ok(mut rpc) => rpc.status(Empty {}).await.map(|r| r.into_inner()).ok(),
        Err(_) => None,
    }
}

/// Every node the file lists and (with a membership) every member the
/// answering ones learned, each with its status (`None`: it did not
/// answer); the learned nodes join `topology`, and `identity` admits them.
async fn every_node(topology: &mut Topology, speaker: &Speaker) -> Vec<(Node, Option<NodeStatus>)> {
    let mut rows = Vec::new();
    for node in &topology.nodes {
        rows.push((node.clone(), node_status(speaker, node).await));
    }
    let answers: Vec<NodeStatus> = rows.iter().filter_map(|(_, s)| s.clone()).collect();
    for node in learned_nodes(topology, speaker, &answers) {
        let status = node_status(speaker, &node).await;
        rows.push((node, status));
    }
    rows.sort_by_key(|(node, _)| node.id);
    for (node, _) in &rows {
        topology.put_node(node.clone());
    }
    rows
}

pub fn status(args: DirArgs) -> Result<()> {
    let mut topology = load(&args)?;
    let speaker = speaking_as(&topology)?;
    let rows = block_on(every_node(&mut topology, &speaker));
    // With a membership service: the newest view a node that answered acts
    // on (etcd holds the cluster's; a node cut off from it may be behind).
    let newest = rows
        .iter()
        .filter_map(|(_, status)| status.as_ref())
        .max_by_key(|s| s.view_epoch)
        .filter(|s| s.view_epoch > 0)
        .map(|s| (s.view_epoch, s.view_members.clone()));
    let membership = topology.membership.as_ref();
    if !args.json {
        println!(
            "cluster {:?}: {} nodes, {}",
            topology.name,
            topology.nodes.len(),
            topology.coherence
        );
        if let Some(config) = membership {
            match &newest {
                Some((epoch, members)) => println!(
                    "membership {}: view {epoch}, members {}",
                    config.url,
                    list(members)
                ),
                None => println!("membership {}: no node answered with a view", config.url),
            }
        }
        println!(
            "{:>4} {:<12} {:<8} {:<21} {:>10} {:>10} {:>8} {:>7} {:>7}{}",
            "NODE",
            "STATE",
            "ACCESS",
            "RPC",
            "CAPACITY",
            "USED",
            "OBJECTS",
            "CLIENTS",
            "LOANS",
            if membership.is_some() { "  VIEW" } else { "" }
        );
    }
    // Objects of nodes removed for good: served from an adopted backing
    // store, or lost (each home reports those it knew).
    let (mut lost, mut adopted) = (0u64, Vec::new());
    for (node, status) in &rows {
        if let Some(s) = status {
            lost += s.lost_objects;
            if s.adopted_objects > 0 {
                adopted.push(format!("node {} {}", node.id, s.adopted_objects));
            }
        }
    }
    for (node, status) in rows {
        let member = newest
            .as_ref()
            .is_none_or(|(_, members)| members.contains(&node.id));
        let state = match &status {
            None => "down",
            // Its membership lease is not being renewed: it acts as no home
            // while its peers are in touch (docs/cluster.md, "Losing etcd").
            Some(s) if !s.membership_in_touch => "out of touch",
            // Up, but not (or no longer) in the cluster's newest view.
            Some(_) if !member => "not member",
            // Up, but its directory is still being rebuilt after a start.
            Some(s) if s.rebuilding => "rebuilding",
            Some(_) => "up",
        };
        let answered = status.is_some();
        let s = status.unwrap_or_default();
        if args.json {
            println!(
                "{{\"node\":{},\"state\":\"{state}\",\"access\":\"{}\",\"rpc\":\"{}\",\"capacity\":{},\"used\":{},\"objects\":{},\"clients\":{},\"loans\":{},\"socket\":{:?},\"view_epoch\":{},\"view_members\":[{}],\"adopted_objects\":{},\"lost_objects\":{},\"lost_ids\":[{}]}}",
                node.id, node.access.as_str(), node.rpc, s.capacity, s.used, s.objects, s.clients, s.loans, node.socket.display().to_string(), s.view_epoch, list(&s.view_members),
                s.adopted_objects, s.lost_objects, lost_ids(&s.lost_ids)
            );
        } else {
            let view = match (membership, answered) {
                (None, _) => String::new(),
                (Some(_), false) => format!("  {:>4}", "-"),
                (Some(_), true) => format!("  {:>4}", s.view_epoch),
            };
            println!(
                "{:>4} {:<12} {:<8} {:<21} {:>10} {:>10} {:>8} {:>7} {:>7}{view}",
                node.id,
                state,
                node.access.as_str(),
                node.rpc.to_string(),
                format_size(s.capacity),
                format_size(s.used),
                s.objects,
                s.clients,
                s.loans
            );
        }
    }
    if !args.json {
        if !adopted.is_empty() {
            println!(
                "adopted: objects of removed nodes' backing stores served by {}",
                adopted.join(", ")
            );
        }
        if lost > 0 {
            println!(
                "lost: {lost} objects of removed nodes were only in their memory or burst \
                 buffers (their ids: --json)"
            );
        }
    }
    Ok(())
}

/// Packed ids (n × 20 bytes) as a JSON list of hex strings.
fn lost_ids(packed: &[u8]) -> String {
    shoal_cluster::ids::unpack(packed)
        .unwrap_or_default()
        .iter()
        .map(|id| format!("\"{id}\""))
        .collect::<Vec<_>>()
        .join(",")
}

/// Node ids as the views print them: `0,1,2`.
fn list(nodes: &[u32]) -> String {
    nodes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

pub fn ls(args: DirArgs) -> Result<()> {
    let mut topology = load(&args)?;
    let speaker = speaking_as(&topology)?;
    let rows = block_on(async {
        let mut rows = Vec::new();
        // With a membership, the members the file lacks too.
        if topology.membership.is_some() {
            every_node(&mut topology, &speaker).await;
        }
        for node in &topology.nodes {
            let listed = match connect(&speaker, node).await {
                Ok(mut rpc) => rpc.list(Empty {}).await.map(|r| r.into_inner().objects),
                Err(err) => Err(tonic::Status::unavailable(err.to_string())),
            };
            rows.push((node.id, listed));
        }
        rows
    });
    if !args.json {
        println!(
            "{:>4} {:<40} {:>12} {:>8} {:>6} {:>8}",
            "NODE", "ID", "DATA", "META", "REFS", "STATE"
        );
    }
    for (node, listed) in rows {
        let objects = match listed {
            Ok(objects) => objects,
            Err(status) => {
                eprintln!("shoal: node {node}: {}", status.message());
                continue;
            }
        };
        for o in objects {
            let id: String = o.id.iter().map(|b| format!("{b:02x}")).collect();
            let state = if o.sealed { "sealed" } else { "created" };
            if args.json {
                println!(
                    "{{\"node\":{node},\"id\":\"{id}\",\"data_size\":{},\"meta_size\":{},\"refs\":{},\"state\":\"{state}\"}}",
                    o.data_size, o.meta_size, o.ref_count
                );
            } else {
                println!(
                    "{node:>4} {id:<40} {:>12} {:>8} {:>6} {:>8}",
                    o.data_size, o.meta_size, o.ref_count, state
                );
            }
        }
    }
    Ok(())
}

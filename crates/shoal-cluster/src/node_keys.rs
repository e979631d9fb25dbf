//! Per-node identities: every node holds an X25519 key pair of its own, the
//! cluster file lists every node's public key, and any two nodes i and j
//! share a secret only they can compute (X25519(sk_i, pk_j) =
//! X25519(sk_j, pk_i)). From it each derives the credential a call from i to
//! j carries: HMAC-SHA256 over the direction, the cluster's name and token.
//!
//! So a member can prove who it is to every other member, and no member can
//! speak as another: node k knows neither sk_i nor sk_j, so it cannot compute
//! the credential of i → j; and what j receives from i is good only as
//! "i → j", which j could only present to itself. Credentials are computed
//! once per peer at start: a call costs what the shared token cost
//! (one constant-time comparison), with no handshake and no per-call crypto.
//!
//! Why not mutual TLS: it would also encrypt, but the bulk channel sends
//! object bytes with sendfile(2) straight from the region, which TLS rules
//! out (docs/security.md, "Cluster members and the network").
//!
//! Private key files hold the 32-byte secret as 64 hex digits; they must be
//! owned by us, not readable by anyone else and not a symbolic link.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use ring::hmac;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use x25519_dalek::{PublicKey, StaticSecret};

/// What a credential's MAC covers before the cluster-specific fields, so a
/// credential cannot be mistaken for any other use of the pair's secret.
const CONTEXT: &[u8] = b"shoal peer credential v1\0";

/// A node's key pair.
pub struct NodeKey {
    secret: StaticSecret,
    public: PublicKey,
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        write!(f, "NodeKey({})", to_hex(self.public.as_bytes()))
    }
}

impl NodeKey {
    /// A new key pair from the operating system's random source.
    pub fn generate() -> Result<Self> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| ShoalError::io("the OS random source", e))?;
        Ok(Self::from_secret(bytes))
    }

    fn from_secret(bytes: [u8; 32]) -> Self {
        let secret = StaticSecret::from(bytes);
        let public = PublicKey::from(&secret);
        Self { secret, public }
    }

    pub fn public(&self) -> [u8; 32] {
        *self.public.as_bytes()
    }

    /// Writes the secret to a new file `path`, owner-only (0600); an
    /// existing file or a symbolic link there is refused.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| ShoalError::io(&format!("create node key {}", path.display()), e))?;
        file.write_all(format!("{}\n", to_hex(self.secret.as_bytes())).as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| ShoalError::io(&format!("write node key {}", path.display()), e))
    }

    /// Reads a key file written by [`save`](Self::save) (or by hand: 64 hex
    /// digits). Refused unless it is a regular file of ours (or root's) that
    /// nobody else may read or write.
    pub fn load(path: &Path) -> Result<Self> {
        let text = read_private(path, "node key")?;
        let bytes = from_hex(text.trim()).ok_or_else(|| {
            ShoalError::invalid(format!("node key {}: not 64 hex digits", path.display()))
        })?;
        Ok(Self::from_secret(bytes))
    }

    /// The credential a call from node `from` to node `to` carries, as
    /// printable ASCII (it travels as gRPC metadata). One of the two nodes
    /// must be this key's; `peer_public` is the other's public key.
    pub fn credential(
        &self,
        peer_public: &[u8; 32],
        cluster: &str,
        token: &str,
        from: u32,
        to: u32,
    ) -> Result<String> {
        let shared = self.secret.diffie_hellman(&PublicKey::from(*peer_public));
        // A low-order public key makes the "shared" secret a constant any
        // node can compute: refuse it rather than derive a guessable credential.
        if !shared.was_contributory() {
            return Err(ShoalError::invalid(format!(
                "the public key {} is not a usable X25519 key",
                to_hex(peer_public)
            )));
        }
        let key = hmac::Key::new(hmac::HMAC_SHA256, shared.as_bytes());
        let mut context = hmac::Context::with_key(&key);
        context.update(CONTEXT);
        for field in [cluster.as_bytes(), token.as_bytes()] {
            context.update(&(field.len() as u32).to_le_bytes());
            context.update(field);
        }
        context.update(&from.to_le_bytes());
        context.update(&to.to_le_bytes());
        Ok(to_hex(context.sign().as_ref()))
    }
}

/// Reads a private key file (`what` names it in errors): refused unless it
/// is a regular file of ours (or root's), not a symbolic link, that nobody
/// else may read or write.
pub fn read_private(path: &Path, what: &str) -> Result<String> {
    let denied = |why: &str| {
        ShoalError::new(
            ErrorKind::PermissionDenied,
            format!("{what} {} {why}", path.display()),
        )
    };
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                denied("is a symbolic link")
            } else {
                ShoalError::io(&format!("read {what} {}", path.display()), e)
            }
        })?;
    let meta = file
        .metadata()
        .map_err(|e| ShoalError::io(&format!("inspect {what} {}", path.display()), e))?;
    if !meta.is_file() {
        return Err(denied("is not a regular file"));
    }
    if !shoal_core::local_auth::is_trusted_uid(meta.uid()) {
        return Err(denied(&format!("is owned by uid {}", meta.uid())));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(denied(&format!(
            "is readable or writable by others (mode {:o}; chmod 600 it)",
            meta.mode() & 0o777
        )));
    }
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|e| ShoalError::io(&format!("read {what} {}", path.display()), e))?;
    Ok(text)
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 32 bytes from 64 hex digits; `None` for anything else (`u8::from_str_radix`
/// alone takes a sign: "+f" would read as 0x0f).
pub fn from_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_keys_are_exactly_64_hex_digits() {
        let key = [0xabu8; 32];
        assert_eq!(from_hex(&to_hex(&key)), Some(key));
        assert_eq!(from_hex(&to_hex(&key).to_uppercase()), Some(key));
        let signed = format!("+{}", &to_hex(&key)[1..]);
        assert_eq!(from_hex(&signed), None, "a sign is no digit");
        assert_eq!(from_hex(&to_hex(&key)[2..]), None);
    }

    #[test]
    fn both_ends_of_a_pair_derive_the_same_credential_and_no_third_node_can() {
        let (a, b, c) = (
            NodeKey::generate().unwrap(),
            NodeKey::generate().unwrap(),
            NodeKey::generate().unwrap(),
        );
        let sent = a.credential(&b.public(), "x", "t", 0, 1).unwrap();
        let expected = b.credential(&a.public(), "x", "t", 0, 1).unwrap();
        assert_eq!(sent, expected);
        assert_eq!(sent.len(), 64);
        // Node 2 with its own key, claiming to be node 0 towards node 1.
        let forged = c.credential(&b.public(), "x", "t", 0, 1).unwrap();
        assert_ne!(forged, expected);
        // Bound to the direction, the cluster and its token.
        assert_ne!(a.credential(&b.public(), "x", "t", 1, 0).unwrap(), sent);
        assert_ne!(a.credential(&b.public(), "y", "t", 0, 1).unwrap(), sent);
        assert_ne!(a.credential(&b.public(), "x", "u", 0, 1).unwrap(), sent);
    }

    #[test]
    fn a_low_order_public_key_is_refused() {
        let a = NodeKey::generate().unwrap();
        let err = a.credential(&[0u8; 32], "x", "t", 0, 1).unwrap_err();
        assert!(err.message().contains("not a usable"), "{err}");
    }

    #[test]
    fn key_files_round_trip_and_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n0.key");
        let key = NodeKey::generate().unwrap();
        key.save(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(NodeKey::load(&path).unwrap().public(), key.public());
        assert!(
            key.save(&path).is_err(),
            "an existing key is never overwritten"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = NodeKey::load(&path).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link.key");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert_eq!(
            NodeKey::load(&link).unwrap_err().kind(),
            ErrorKind::PermissionDenied
        );
        let bad = dir.path().join("bad.key");
        std::fs::write(&bad, "not hex").unwrap();
        std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            NodeKey::load(&bad).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn hex_round_trips_and_refuses_other_lengths() {
        let bytes = [0xabu8; 32];
        assert_eq!(from_hex(&to_hex(&bytes)), Some(bytes));
        assert_eq!(from_hex("ab"), None);
        assert_eq!(from_hex(&"zz".repeat(32)), None);
    }
}

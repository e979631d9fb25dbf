//! Peer traffic over TLS 1.3, both channels: the peer RPC (`rpc`: an
//! acceptor tonic serves from, a connector its channels dial with) and the
//! bulk data channel (`data`).
//!
//! Trust is the cluster's: a CA (`shoal cluster ca`) signs each node's
//! certificate (`shoal cluster keygen --ca`), whose name binds it to the
//! node's id and X25519 public key (`cert_name`). A peer is admitted when
//! its chain leads to a CA of `tls_ca`, it is not expired nor revoked
//! (`tls_crl`), and its name is the one [`PeerIdentity`] expects for a
//! node it knows: the one check both channels make, mutual on both ends.
//! Only TLS 1.3 is offered or accepted, so nothing can be downgraded.
//!
//! The per-node credentials still travel inside the tunnel, and a call's
//! claimed node must be the one the certificate proved (`auth::TlsPeer`).
//!
//! [`PeerIdentity`]: crate::auth::PeerIdentity

pub mod data;
#[cfg(feature = "issue")]
pub mod issue;
pub mod kernel;
mod material;
pub mod records;
pub mod rpc;
mod verify;

pub use material::{Configs, TlsMaterial};
pub use verify::node_of;

/// How long a handshake may take before the connection is dropped: a peer
/// that connects and says nothing must not hold a task.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// An answering end's handshake, bounded by [`HANDSHAKE_TIMEOUT`]; its
/// failure in words, for the refusing node's log.
async fn handshake<T>(
    accepting: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, accepting).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(err)) => Err(format!("TLS handshake failed: {err}")),
        Err(_) => Err(format!("no TLS handshake within {HANDSHAKE_TIMEOUT:?}")),
    }
}

/// The node the dialing end's certificate proved, on the answering end.
fn proven(tls: &TlsMaterial, connection: &rustls::ServerConnection) -> Result<u32, String> {
    connection
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|cert| node_of(tls.identity(), cert))
        .ok_or_else(|| "a certificate of no known node".to_owned())
}

/// The TLS failure somewhere in `err`'s chain of causes, if there is one:
/// a refused certificate, an alert the peer sent, a record that failed
/// its integrity check.
pub fn refusal_in(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        if let Some(tls) = err
            .downcast_ref::<std::io::Error>()
            .and_then(data::tls_error)
        {
            return Some(tls.to_string());
        }
        cause = err.source();
    }
    None
}

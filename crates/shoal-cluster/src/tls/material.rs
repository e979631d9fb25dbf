//! A node's TLS material as rustls configurations: its certificate chain
//! and key, the CA certificates it trusts and the revocation lists. The
//! files are looked at again at most once a second, on a handshake, and
//! the configurations rebuilt when one changed: rotating a certificate or
//! the CA, or revoking one, takes effect without a restart. A rebuild that
//! fails (a half-written file) keeps the configurations in use and says so.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime,
};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use shoal_core::error::{ErrorKind, Result, ShoalError};

use super::verify::NodeCertCheck;
use crate::auth::PeerIdentity;
use crate::topology::{NodeTls, TlsTrust, Topology};

/// How often the files are looked at again.
const RECHECK: Duration = Duration::from_secs(1);

/// The configurations of one load of the files.
#[derive(Clone)]
pub struct Configs {
    /// What this node answers peers with (its data channel and RPC server).
    pub server: Arc<ServerConfig>,
    /// What this node dials peers with.
    pub client: Arc<ClientConfig>,
}

/// This node's TLS material (`tls_ca`, `tls_crl`, its `tls_cert` and
/// `tls_key`) and the identity its peers' certificates are checked against.
pub struct TlsMaterial {
    me: u32,
    trust: TlsTrust,
    own: NodeTls,
    identity: PeerIdentity,
    loaded: Mutex<Loaded>,
}

struct Loaded {
    configs: Configs,
    /// The files' modification times the configurations were built from.
    built_from: Vec<Option<SystemTime>>,
    checked: Instant,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsMaterial(node {}, {:?})", self.me, self.own.cert)
    }
}

impl TlsMaterial {
    /// Node `me`'s material if `topology` has TLS (`None`: cleartext). The
    /// node's own certificate must be valid now and carry its name.
    pub fn load(topology: &Topology, me: u32, identity: PeerIdentity) -> Result<Option<Arc<Self>>> {
        let Some(trust) = topology.tls.clone() else {
            return Ok(None);
        };
        let own = topology.node(me)?.tls.clone().ok_or_else(|| {
            ShoalError::invalid(format!(
                "node {me} has no tls_cert and tls_key, and the cluster has tls_ca"
            ))
        })?;
        let material = Self {
            me,
            loaded: Mutex::new(Loaded {
                built_from: stamps(&trust, &own),
                configs: build(me, &trust, &own, &identity)?,
                checked: Instant::now(),
            }),
            trust,
            own,
            identity,
        };
        Ok(Some(Arc::new(material)))
    }

    /// The identity peers' certificates are checked against.
    pub fn identity(&self) -> &PeerIdentity {
        &self.identity
    }

    /// The configurations now: rebuilt first if a file changed since.
    pub fn configs(&self) -> Configs {
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if loaded.checked.elapsed() >= RECHECK {
            loaded.checked = Instant::now();
            let now = stamps(&self.trust, &self.own);
            if now != loaded.built_from {
                match build(self.me, &self.trust, &self.own, &self.identity) {
                    Ok(configs) => {
                        tracing::info!("TLS certificates, CA or revocations changed: reloaded");
                        loaded.configs = configs;
                        loaded.built_from = now;
                    }
                    Err(err) => tracing::error!(
                        %err,
                        "TLS files changed but do not load: the ones loaded before stay in use"
                    ),
                }
            }
        }
        loaded.configs.clone()
    }

    /// The name node `to`'s certificate must carry, as rustls checks it.
    pub fn server_name(&self, to: u32) -> Result<ServerName<'static>> {
        let name = self.identity.cert_name(to).ok_or_else(|| {
            ShoalError::new(
                ErrorKind::NodeUnavailable,
                format!("node {to} is not known here yet"),
            )
        })?;
        ServerName::try_from(name).map_err(|e| ShoalError::invalid(e.to_string()))
    }
}

fn stamps(trust: &TlsTrust, own: &NodeTls) -> Vec<Option<SystemTime>> {
    [
        Some(&trust.ca),
        trust.crl.as_ref(),
        Some(&own.cert),
        Some(&own.key),
    ]
    .into_iter()
    .map(|path| path.and_then(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok()))
    .collect()
}

fn invalid(path: &Path, what: &str, e: impl std::fmt::Display) -> ShoalError {
    ShoalError::invalid(format!("{what} {}: {e}", path.display()))
}

fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| invalid(path, what, e))?;
    if certs.is_empty() {
        return Err(invalid(path, what, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// ring's suites, AES-128-GCM first: the data channel's bytes are most of
/// what is encrypted, and it is the fastest suite where the CPU has AES
/// instructions (4.8 against AES-256-GCM's 4.2 GB/s on this project's
/// machines, `openssl speed -evp`). The dialing end's order decides.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

fn build(me: u32, trust: &TlsTrust, own: &NodeTls, identity: &PeerIdentity) -> Result<Configs> {
    let provider = provider();
    let mut roots = RootCertStore::empty();
    for ca in certificates(&trust.ca, "tls_ca")? {
        roots.add(ca).map_err(|e| invalid(&trust.ca, "tls_ca", e))?;
    }
    let roots = Arc::new(roots);
    let crls = match &trust.crl {
        None => Vec::new(),
        Some(path) => CertificateRevocationListDer::pem_file_iter(path)
            .and_then(|crls| crls.collect::<std::result::Result<Vec<_>, _>>())
            .map_err(|e| invalid(path, "tls_crl", e))?,
    };
    let chain = certificates(&own.cert, "tls_cert")?;
    let key = PrivateKeyDer::from_pem_slice(
        crate::node_keys::read_private(&own.key, "TLS key")?.as_bytes(),
    )
    .map_err(|e| invalid(&own.key, "tls_key", e))?;
    let versions = &[&rustls::version::TLS13];
    // Revocation lists are per CA: a certificate of a CA that has none (a
    // new CA during a rotation) is not refused for that.
    let server_verifier =
        WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .with_crls(crls.clone())
            .allow_unknown_revocation_status()
            .build()
            .map_err(|e| invalid(&trust.ca, "tls_ca", e))?;
    check_own(me, &chain, identity, &server_verifier, own)?;
    let client_verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .with_crls(crls)
        .allow_unknown_revocation_status()
        .build()
        .map_err(|e| invalid(&trust.ca, "tls_ca", e))?;
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| ShoalError::invalid(e.to_string()))?
        .with_client_cert_verifier(Arc::new(NodeCertCheck::new(
            client_verifier,
            identity.clone(),
        )))
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(|e| invalid(&own.key, "tls_key", e))?;
    // The data channel keeps its sessions' records itself (`records`), or
    // hands them to the kernel (`kernel`).
    server.enable_secret_extraction = true;
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| ShoalError::invalid(e.to_string()))?
        .with_webpki_verifier(server_verifier)
        .with_client_auth_cert(chain, key)
        .map_err(|e| invalid(&own.key, "tls_key", e))?;
    client.enable_secret_extraction = true;
    Ok(Configs {
        server: Arc::new(server),
        client: Arc::new(client),
    })
}

/// A node refuses to start with a certificate its peers would refuse:
/// not from the cluster's CA, expired, revoked, or made for another node
/// or key.
fn check_own(
    me: u32,
    chain: &[CertificateDer<'static>],
    identity: &PeerIdentity,
    verifier: &WebPkiServerVerifier,
    own: &NodeTls,
) -> Result<()> {
    use rustls::client::danger::ServerCertVerifier;
    let name = identity
        .cert_name(me)
        .ok_or_else(|| ShoalError::invalid(format!("node {me} is not known to itself")))?;
    let server_name =
        ServerName::try_from(name.clone()).map_err(|e| ShoalError::invalid(e.to_string()))?;
    verifier
        .verify_server_cert(&chain[0], &chain[1..], &server_name, &[], UnixTime::now())
        .map(|_| ())
        .map_err(|e| {
            ShoalError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "node {me}'s tls_cert {} would be refused by its peers: {e} (it must be \
                     signed by a CA of tls_ca, valid now, not revoked, and name {name})",
                    own.cert.display()
                ),
            )
        })
}

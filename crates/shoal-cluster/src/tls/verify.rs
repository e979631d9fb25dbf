//! Which node a certificate is: the known node whose certificate name
//! (`cert_name`) it carries. On the server end this runs inside the
//! handshake, after webpki checked the chain, the validity and revocation,
//! so a certificate of no known node fails the handshake itself.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::auth::PeerIdentity;

/// The node whose certificate `cert` is, if it names one this node knows.
/// The chain is not checked here (webpki did, in the handshake).
pub fn node_of(identity: &PeerIdentity, cert: &CertificateDer<'_>) -> Option<u32> {
    let cert = webpki::EndEntityCert::try_from(cert).ok()?;
    identity.node_by_cert_name(|name| {
        ServerName::try_from(name)
            .is_ok_and(|name| cert.verify_is_valid_for_subject_name(&name).is_ok())
    })
}

/// webpki's check of a client's chain, then [`node_of`].
pub(super) struct NodeCertCheck {
    chain: Arc<dyn ClientCertVerifier>,
    identity: PeerIdentity,
}

impl NodeCertCheck {
    pub(super) fn new(chain: Arc<dyn ClientCertVerifier>, identity: PeerIdentity) -> Self {
        Self { chain, identity }
    }
}

impl std::fmt::Debug for NodeCertCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeCertCheck(node {})", self.identity.me())
    }
}

impl ClientCertVerifier for NodeCertCheck {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.chain
            .verify_client_cert(end_entity, intermediates, now)?;
        match node_of(&self.identity, end_entity) {
            Some(_) => Ok(ClientCertVerified::assertion()),
            // From the cluster's CA but for no node known here, or for a
            // node's key the cluster no longer lists.
            None => Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

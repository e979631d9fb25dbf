//! Making the cluster's TLS material (`shoal cluster ca`, `shoal cluster
//! keygen --ca`, `shoal cluster revoke`): a CA, node certificates it signs,
//! and its revocation list. rcgen writes them; keys are ECDSA P-256.
//!
//! The CA's name is derived from its key ("shoal cluster CA" and 16 hex
//! digits of its public key's digest), so signing with a CA needs only its
//! key file, never a parse of its certificate, and two CAs of one cluster
//! (a rotation) never share a name.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData,
    RevokedCertParams, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use shoal_core::error::{Result, ShoalError};

use crate::cert_name::node_cert_name;

/// A certificate and its private key, PEM.
pub struct Pem {
    pub cert: String,
    pub key: String,
}

fn failed(what: &str, e: impl std::fmt::Display) -> ShoalError {
    ShoalError::invalid(format!("{what}: {e}"))
}

fn time_of(at: SystemTime) -> time::OffsetDateTime {
    let secs = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    time::OffsetDateTime::from_unix_timestamp(secs as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS random source");
    bytes[0] &= 0x7f; // a positive INTEGER
    SerialNumber::from_slice(&bytes)
}

/// The CA's parameters as an issuer: its name from its key.
fn ca_params(key: &KeyPair) -> CertificateParams {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.der_bytes());
    let tag: String = digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, format!("shoal cluster CA {tag}"));
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// A new CA valid for `valid` from now.
pub fn new_ca(valid: Duration) -> Result<Pem> {
    let key = KeyPair::generate().map_err(|e| failed("a CA key", e))?;
    let mut params = ca_params(&key);
    let now = SystemTime::now();
    params.not_before = time_of(now - Duration::from_secs(60));
    params.not_after = time_of(now + valid);
    params.serial_number = Some(random_serial());
    let cert = params
        .self_signed(&key)
        .map_err(|e| failed("the CA certificate", e))?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

fn ca_key(ca_key_pem: &str) -> Result<KeyPair> {
    KeyPair::from_pem(ca_key_pem).map_err(|e| failed("the CA key", e))
}

/// A certificate for node `id` (with per-node identities, bound to its
/// X25519 `public_key`), signed by the CA whose key is `ca_key_pem`, valid
/// from `not_before` to `not_after`, with a new key pair.
pub fn node_cert(
    ca_key_pem: &str,
    id: u32,
    public_key: Option<&[u8; 32]>,
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<Pem> {
    let ca = ca_key(ca_key_pem)?;
    let issuer = Issuer::new(ca_params(&ca), ca);
    let key = KeyPair::generate().map_err(|e| failed("a node key", e))?;
    let mut params = CertificateParams::new(vec![node_cert_name(id, public_key)])
        .map_err(|e| failed("a node certificate", e))?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("shoal node {id}"));
    params.not_before = time_of(not_before);
    params.not_after = time_of(not_after);
    params.serial_number = Some(random_serial());
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Both ends of a peer connection present it.
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| failed("a node certificate", e))?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// The serial number of the first certificate in `cert_pem`.
pub fn serial_of(cert_pem: &str) -> Result<Vec<u8>> {
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
        .map_err(|e| failed("the certificate", e))?;
    let cert = webpki::EndEntityCert::try_from(&der).map_err(|e| failed("the certificate", e))?;
    Ok(cert.serial().to_vec())
}

/// The serials a revocation list (PEM) revokes.
pub fn revoked_serials(crl_pem: &str) -> Result<Vec<Vec<u8>>> {
    let mut serials = Vec::new();
    for crl in CertificateRevocationListDer::pem_slice_iter(crl_pem.as_bytes()) {
        let crl = crl.map_err(|e| failed("the revocation list", e))?;
        let parsed = webpki::BorrowedCertRevocationList::from_der(crl.as_ref())
            .map_err(|e| failed("the revocation list", e))?;
        for revoked in &parsed {
            let revoked = revoked.map_err(|e| failed("the revocation list", e))?;
            serials.push(revoked.serial_number.to_vec());
        }
    }
    Ok(serials)
}

/// A revocation list signed by the CA whose key is `ca_key_pem` revoking
/// `serials`, numbered `number` (higher than the list it replaces), valid
/// for `valid`.
pub fn revocation_list(
    ca_key_pem: &str,
    serials: &[Vec<u8>],
    number: u64,
    valid: Duration,
) -> Result<String> {
    let ca = ca_key(ca_key_pem)?;
    let issuer = Issuer::new(ca_params(&ca), ca);
    let now = SystemTime::now();
    let params = CertificateRevocationListParams {
        this_update: time_of(now - Duration::from_secs(60)),
        next_update: time_of(now + valid),
        crl_number: SerialNumber::from(number),
        issuing_distribution_point: None,
        revoked_certs: serials
            .iter()
            .map(|serial| RevokedCertParams {
                serial_number: SerialNumber::from_slice(serial),
                revocation_time: time_of(now - Duration::from_secs(60)),
                reason_code: None,
                invalidity_date: None,
            })
            .collect(),
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    };
    params
        .signed_by(&issuer)
        .and_then(|crl| crl.pem())
        .map_err(|e| failed("the revocation list", e))
}

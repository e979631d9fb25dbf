//! The name a node's TLS certificate carries: it binds the certificate to
//! the node's id and, with per-node identities, to the X25519 public key
//! the cluster lists for it, so a certificate made for an old or foreign
//! key is refused even when the cluster's CA signed it.
//!
//! A DNS name (subjectAltName dNSName), not a custom extension: webpki,
//! which checks the chain, expiry and revocation, checks a name too, and
//! `openssl verify -verify_hostname` can check a node's certificate by hand.
//! DNS labels hold at most 63 characters, so the key's 64 hex digits are
//! two labels.

/// The name node `id`'s certificate must carry: `n<id>.<hex 0..32>.<hex
/// 32..64>.node.shoal` with a public key, `n<id>.node.shoal` without.
pub fn node_cert_name(id: u32, public_key: Option<&[u8; 32]>) -> String {
    match public_key {
        Some(key) => {
            let hex = crate::node_keys::to_hex(key);
            format!("n{id}.{}.{}.node.shoal", &hex[..32], &hex[32..])
        }
        None => format!("n{id}.node.shoal"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_a_valid_dns_name_that_tells_keys_apart() {
        let a = node_cert_name(3, Some(&[0xab; 32]));
        let b = node_cert_name(3, Some(&[0xac; 32]));
        assert_ne!(a, b);
        assert!(a.split('.').all(|label| label.len() <= 63));
        assert!(rustls::pki_types::ServerName::try_from(a.clone()).is_ok());
        assert_eq!(node_cert_name(12, None), "n12.node.shoal");
    }
}

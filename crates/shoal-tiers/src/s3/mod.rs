//! A backing store in an S3-compatible object store: [`S3Config`] says where,
//! [`S3Tier`] is the tier.
//!
//! ```text
//! <prefix>/shoal-tier.id        owner marker (identity.rs)
//! <prefix>/objects/<id hex>     one image per object (format.rs)
//! ```
//!
//! A PUT is atomic and durable once acknowledged, so there is no temp name:
//! the image is uploaded whole in one PUT (S3 allows 5 GiB per PUT; larger
//! objects would need a multipart upload, not done yet) straight from the
//! caller's memory (`Bytes::from_owner` over the `SourceRange`, no copy).
//! Requests are retried only briefly here (`S3Config::max_retries`): a store
//! that is down must surface quickly as `NodeUnavailable`, so the drain's own
//! backoff (retry.rs) decides what to do, with the object safe in memory or
//! the burst buffer meanwhile.
//!
//! The client is this crate's `s3` feature, off unless asked for: the
//! command line's own `s3` feature turns it on. A build without it has the same names, but its [`S3Tier`]
//! is a type with no values whose `open` refuses with [`MissingFeature`];
//! [`require`] says so before anything starts.

use std::time::Duration;

use shoal_core::error::MissingFeature;

#[cfg(feature = "s3")]
mod client;
#[cfg(feature = "s3")]
pub use client::S3Tier;

#[cfg(not(feature = "s3"))]
mod absent;
#[cfg(not(feature = "s3"))]
pub use absent::S3Tier;

/// Whether this build has the S3 client (the `s3` feature).
pub const BUILT: bool = cfg!(feature = "s3");

/// `Ok` in a build with the S3 client; else the error that names the feature,
/// for `needed_for` (what the user asked for, e.g. "an s3:// backing store").
pub fn require(needed_for: &str) -> Result<(), MissingFeature> {
    refuse_unless(BUILT, needed_for)
}

fn refuse_unless(built: bool, needed_for: &str) -> Result<(), MissingFeature> {
    if built {
        Ok(())
    } else {
        Err(MissingFeature::new("s3", needed_for))
    }
}

/// Where and how to reach the store.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// e.g. `http://127.0.0.1:8014`.
    pub endpoint: String,
    /// The bucket, which must exist: the tier does not create it.
    pub bucket: String,
    /// Key prefix of this node's tier (e.g. `cluster/node-3`); may be empty.
    pub prefix: String,
    /// Access key id of the credentials.
    pub access_key: String,
    /// Secret access key of the credentials. The derived `Debug` prints it:
    /// do not log a config.
    pub secret_key: String,
    /// Region the requests are signed for; `us-east-1` from
    /// [`S3Config::new`], what most S3-compatible stores expect.
    pub region: String,
    /// Plain HTTP (a store on loopback or a private network).
    pub allow_http: bool,
    /// Bytes of images this tier may hold.
    pub capacity: u64,
    /// Retries of one request inside the client; keep them few.
    pub max_retries: usize,
    /// The first wait before a retry; each next one doubles, up to
    /// [`S3Config::max_backoff`].
    pub init_backoff: Duration,
    /// The longest wait between retries.
    pub max_backoff: Duration,
    /// No retry starts after this long since the request's first try.
    pub retry_timeout: Duration,
    /// How long a connection may take to set up before the request fails;
    /// 2 s from [`S3Config::new`], so a store that is down surfaces quickly.
    pub connect_timeout: Duration,
}

impl S3Config {
    /// A config with short retries (2 retries, 100 ms → 1 s, 5 s in all) and a
    /// 2 s connect timeout.
    pub fn new(
        endpoint: &str,
        bucket: &str,
        prefix: &str,
        access_key: &str,
        secret_key: &str,
    ) -> Self {
        Self {
            endpoint: endpoint.to_string(),
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            access_key: access_key.to_string(),
            secret_key: secret_key.to_string(),
            region: "us-east-1".to_string(),
            allow_http: endpoint.starts_with("http://"),
            capacity: u64::MAX,
            max_retries: 2,
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            retry_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_without_the_client_refuses_naming_the_feature() {
        assert_eq!(require("an s3:// backing store").is_ok(), BUILT);
        let err = refuse_unless(false, "an s3:// backing store").unwrap_err();
        assert_eq!(err.feature, "s3");
        let text = err.to_string();
        assert!(
            text.starts_with("an s3:// backing store needs the `s3` feature"),
            "{text}"
        );
    }
}

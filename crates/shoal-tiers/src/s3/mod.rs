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

use shoal_core::error::MissingFeature;

mod config;
pub use config::S3Config;

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

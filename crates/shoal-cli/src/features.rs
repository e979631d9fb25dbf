//! The optional parts of this build of `shoal` (Cargo features; docs/hacking.md,
//! "Optional parts"): `s3` (an S3 backing store), `fuse` (`shoal mount`), `top`
//! (`shoal top`), `etcd` (membership on etcd). The commands and settings that need one are there in every
//! build; without the feature they refuse with a [`MissingFeature`] before
//! they start anything.

use shoal_core::MissingFeature;

/// Every optional feature, in the order [`built`] lists them.
pub const ALL: [&str; 4] = ["s3", "fuse", "top", "etcd"];

/// The optional features this build has (the Python package's
/// `shoal.features()`).
pub fn built() -> Vec<&'static str> {
    let on = [
        // The tiers' own answer: their client is what counts.
        shoal_tiers::s3::BUILT,
        cfg!(feature = "fuse"),
        cfg!(feature = "top"),
        // The daemon's: it is the one that joins etcd.
        shoal_daemon::ETCD_BUILT,
    ];
    ALL.iter()
        .zip(on)
        .filter_map(|(name, on)| on.then_some(*name))
        .collect()
}

/// The error a command gives in a build without `feature`.
pub fn missing(feature: &'static str, needed_for: &str) -> anyhow::Error {
    MissingFeature::new(feature, needed_for).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_feature_is_a_typed_error_naming_it() {
        let err = missing("fuse", "`shoal mount`");
        let typed = err
            .downcast_ref::<MissingFeature>()
            .expect("a MissingFeature");
        assert_eq!(typed.feature, "fuse");
        assert!(err
            .to_string()
            .starts_with("`shoal mount` needs the `fuse` feature"));
    }
}

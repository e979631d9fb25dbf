//! The tiers against real directories, a real S3-compatible server and
//! crashes, one test binary (one link instead of one per file; `cargo test
//! -p shoal-tiers --test integration s3::` runs one module). `common` holds
//! the conformance suite every backend passes.

mod common;
mod conformance;
mod crash;
mod drain;
mod engine;
// The S3 client is the `s3` feature: on in the workspace's test build (through
// shoal-cli), off in `cargo test -p shoal-tiers` unless `--features s3`.
#[cfg(feature = "s3")]
mod s3;
#[cfg(not(feature = "s3"))]
#[test]
fn s3_tests_need_the_s3_feature() {
    eprintln!(
        "SKIPPED s3::*: built without the `s3` feature (cargo test -p shoal-tiers --features s3)"
    );
}
mod segments;

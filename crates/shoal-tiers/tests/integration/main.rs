//! The tiers against real directories, a real S3-compatible server and
//! crashes, one test binary (one link instead of one per file; `cargo test
//! -p shoal-tiers --test integration s3::` runs one module). `common` holds
//! the conformance suite every backend passes.

mod common;
mod conformance;
mod crash;
mod drain;
mod engine;
mod s3;
mod segments;

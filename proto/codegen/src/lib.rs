//! The peer RPC's Rust code from its proto: [`generate`] writes it, `cargo
//! run` puts it where shoal-cluster includes it, and `cargo test` checks that
//! the checked-in file is what the proto gives.

use std::path::{Path, PathBuf};

/// The proto tree (`proto/` of the repository).
pub fn proto_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The checked-in file shoal-cluster includes (`src/lib.rs`, `mod proto`).
pub fn checked_in() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/shoal-cluster/generated")
        .join(FILE)
}

/// The file tonic-build writes for the package `shoal.peer.v1`.
pub const FILE: &str = "shoal.peer.v1.rs";

/// Compiles peer.proto with protox (no protoc needed) and writes the
/// messages and the gRPC service (prost, tonic) to `out_dir`/[`FILE`].
pub fn generate(out_dir: &Path) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let root = proto_root();
    let descriptors = protox::compile([root.join("shoal/peer/v1/peer.proto")], [&root])?;
    tonic_prost_build::configure()
        .out_dir(out_dir)
        .compile_fds(descriptors)?;
    Ok(out_dir.join(FILE))
}

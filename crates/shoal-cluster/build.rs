//! Generates the peer RPC code from proto/shoal/peer/v1/peer.proto.
//! protox compiles the proto in Rust, so building needs no protoc binary.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let proto = root.join("shoal/peer/v1/peer.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let descriptors = protox::compile([&proto], [&root])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}

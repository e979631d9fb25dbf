//! Rewrites crates/shoal-cluster/generated/shoal.peer.v1.rs from peer.proto.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let target = shoal_proto_codegen::checked_in();
    let written = shoal_proto_codegen::generate(target.parent().expect("a directory"))?;
    assert_eq!(written, target);
    println!("wrote {}", target.display());
    Ok(())
}

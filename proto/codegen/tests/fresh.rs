//! The checked-in peer RPC code is what peer.proto gives today.

#[test]
fn the_checked_in_code_is_what_the_proto_gives() {
    let dir = std::env::temp_dir().join(format!("shoal-proto-codegen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fresh = std::fs::read_to_string(shoal_proto_codegen::generate(&dir).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let target = shoal_proto_codegen::checked_in();
    let kept = std::fs::read_to_string(&target).unwrap_or_default();
    assert!(
        fresh == kept,
        "{} is not what proto/shoal/peer/v1/peer.proto gives: run `cargo run` in proto/codegen \
         and commit the file",
        target.display()
    );
}

//! Records the optimisation level the extension is compiled at, for
//! `shoal.build_info()`: the test command builds it under the `checks` profile
//! (opt-level 1, its dependencies shared with the tests' build), and the
//! benchmarks refuse such a build (`shoal.testing.require_optimized_build`).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let level = std::env::var("OPT_LEVEL").unwrap_or_default();
    println!("cargo:rustc-env=SHOAL_OPT_LEVEL={level}");
}

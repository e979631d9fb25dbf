//! The optional parts (the `s3`, `fuse`, `top` and `etcd` features): in a build
//! without one, what needs it exits 1 with a message naming the feature and
//! how to build with it, having started nothing; in a build with it, the
//! same command gets past that point (and fails later, for want of an S3
//! endpoint, a daemon or a cluster). The test command's build has every
//! feature; `cargo test -p shoal-cli --no-default-features --test
//! integration features::` runs the other side.

use std::path::Path;
use std::process::Output;

use crate::support::shoal;

/// The refusal of a build without `feature`, for `needed_for`.
fn refusal(needed_for: &str, feature: &str) -> String {
    format!(
        "shoal: {needed_for} needs the `{feature}` feature, which this build of shoal leaves out"
    )
}

/// Exit status 1, and the refusal exactly when the feature is off.
fn check(output: &Output, built: bool, needed_for: &str, feature: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let refused = stderr.contains(&refusal(needed_for, feature));
    assert_eq!(refused, !built, "built with `{feature}`: {built}; {stderr}");
    if refused {
        assert!(
            stderr.contains("SHOAL_FEATURES=full ./scripts/setup.sh")
                && stderr.contains("cargo build --release -p shoal-cli"),
            "says how to build with it: {stderr}"
        );
    }
}

#[test]
fn an_s3_backing_store_needs_the_s3_feature() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s3.sock");
    let output = shoal()
        .args(["serve", "--capacity", "16MiB", "--no-prefault"])
        .args(["--backing", "s3://bucket/prefix", "--socket"])
        .arg(&socket)
        .env_remove("SHOAL_S3_ENDPOINT")
        .env_remove("AWS_ENDPOINT_URL")
        .output()
        .unwrap();
    check(
        &output,
        cfg!(feature = "s3"),
        "the backing store s3://bucket/prefix",
        "s3",
    );
    if cfg!(feature = "s3") {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("needs --s3-endpoint"), "{stderr}");
    }
    assert!(!socket.exists(), "nothing started");
}

#[test]
fn mount_needs_the_fuse_feature() {
    let dir = tempfile::tempdir().unwrap();
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let output = shoal()
        .args(["mount", "--socket"])
        .arg(dir.path().join("none.sock"))
        .arg(&mountpoint)
        .output()
        .unwrap();
    check(&output, cfg!(feature = "fuse"), "`shoal mount`", "fuse");
    assert!(!mounted(&mountpoint));
}

#[test]
fn top_needs_the_top_feature() {
    let dir = tempfile::tempdir().unwrap();
    let output = shoal()
        .args(["top", "--dir"])
        .arg(dir.path().join("no-cluster"))
        .output()
        .unwrap();
    check(&output, cfg!(feature = "top"), "`shoal top`", "top");
}

#[test]
fn a_membership_in_etcd_needs_the_etcd_feature() {
    let dir = tempfile::tempdir().unwrap();
    let topology =
        shoal_testing::loopback_topology("features", 1, 16 << 20, Default::default(), dir.path());
    let file = dir.path().join("cluster.toml");
    std::fs::write(&file, topology.to_toml()).unwrap();
    // Port 1: nothing answers there, so a build with the feature fails
    // joining, after the point a build without it refuses at.
    let output = shoal()
        .args(["serve", "--no-prefault", "--node", "0", "--cluster"])
        .arg(&file)
        .args(["--membership", "etcd://127.0.0.1:1/shoal/features"])
        .output()
        .unwrap();
    check(&output, cfg!(feature = "etcd"), "`--membership`", "etcd");
    if cfg!(feature = "etcd") {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("membership etcd://127.0.0.1:1/shoal/features"),
            "{stderr}"
        );
    }
    assert!(!topology.nodes[0].socket.exists(), "nothing left behind");
}

fn mounted(path: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_str().unwrap();
    table
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(path))
}

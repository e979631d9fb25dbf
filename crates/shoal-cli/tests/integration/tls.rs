//! TLS between nodes from the command line: `cluster up --tls` runs a
//! cluster whose peer traffic is TLS 1.3 (shown by `shoal stat` and the
//! metrics, and a network pull through it returns the bytes), and `cluster
//! ca`, `keygen --ca`, `cert` and `revoke` make what a hand-written file
//! needs.

use std::process::Output;

use shoal_testing::metric;

use crate::support::{shoal, Cluster};

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn a_cluster_up_with_tls_pulls_over_it_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::up_with(
        dir.path(),
        2,
        "cli-tls",
        &["--tls", "--modes", "network", "--no-tiers"],
    );
    assert!(cluster.topology.tls.is_some());
    let stat = ok(&shoal()
        .args(["stat", "--socket"])
        .arg(cluster.socket(0))
        .output()
        .unwrap());
    assert!(
        stat.contains("traffic tls1.3, data channel tls-userspace"),
        "{stat}"
    );
    // A file put on node 1, read through node 0: pulled over TLS.
    let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i * 13 + 1) as u8).collect();
    let file = dir.path().join("in.bin");
    std::fs::write(&file, &payload).unwrap();
    let id = ok(&shoal()
        .args(["put", "--socket"])
        .arg(cluster.socket(1))
        .arg(&file)
        .output()
        .unwrap());
    let id = id.split_whitespace().next().unwrap().to_owned();
    let out = dir.path().join("out.bin");
    ok(&shoal()
        .args(["get", "--timeout-ms", "10000", "--socket"])
        .arg(cluster.socket(0))
        .arg(&id)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap());
    assert!(std::fs::read(&out).unwrap() == payload, "the bytes, whole");
    let sent = metric(
        cluster.metrics(1),
        "shoal_data_channel_transfers_total",
        &[("encryption", "tls-userspace")],
    );
    assert!(sent.is_some_and(|n| n >= 1.0), "{sent:?}");
    let mode = metric(
        cluster.metrics(0),
        "shoal_peer_encryption",
        &[("channel", "data"), ("mode", "tls-userspace")],
    );
    assert_eq!(mode, Some(1.0));
}

#[test]
fn the_commands_make_a_ca_certificates_and_revocations() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let out = ok(&shoal()
        .args(["cluster", "ca", "--out"])
        .arg(&ca)
        .output()
        .unwrap());
    assert!(out.contains("tls_ca = "), "{out}");
    // A second CA in the same place is refused: nothing is overwritten.
    let again = shoal()
        .args(["cluster", "ca", "--out"])
        .arg(&ca)
        .output()
        .unwrap();
    assert!(!again.status.success());
    // keygen --ca: a key pair and its certificate on one machine.
    let key = dir.path().join("n0.key");
    let out = ok(&shoal()
        .args(["cluster", "keygen", "--node", "0", "--ca"])
        .arg(&ca)
        .arg("--out")
        .arg(&key)
        .output()
        .unwrap());
    assert!(
        out.contains("public_key = ") && out.contains("tls_cert = ") && out.contains("tls_key = "),
        "{out}"
    );
    assert!(dir.path().join("n0.crt").exists() && dir.path().join("n0.tls").exists());
    // cert: for a public key sent from another host.
    let public_key = "ab".repeat(32);
    let out = ok(&shoal()
        .args([
            "cluster",
            "cert",
            "--node",
            "1",
            "--public-key",
            &public_key,
            "--ca",
        ])
        .arg(&ca)
        .arg("--out")
        .arg(dir.path().join("n1"))
        .output()
        .unwrap());
    assert!(out.contains("n1.crt"), "{out}");
    let bad = shoal()
        .args([
            "cluster",
            "cert",
            "--node",
            "1",
            "--public-key",
            "xyz",
            "--ca",
        ])
        .arg(&ca)
        .arg("--out")
        .arg(dir.path().join("n1"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    // revoke: once, then refused as done already.
    let crl = dir.path().join("revoked.crl");
    let revoke = || {
        shoal()
            .args(["cluster", "revoke", "--ca"])
            .arg(&ca)
            .arg("--cert")
            .arg(dir.path().join("n1.crt"))
            .arg("--crl")
            .arg(&crl)
            .output()
            .unwrap()
    };
    let out = ok(&revoke());
    assert!(out.contains("1 certificates"), "{out}");
    let twice = revoke();
    assert!(!twice.status.success());
    assert!(
        String::from_utf8_lossy(&twice.stderr).contains("revoked already"),
        "{}",
        String::from_utf8_lossy(&twice.stderr)
    );
    let serials =
        shoal_cluster::tls::issue::revoked_serials(&std::fs::read_to_string(&crl).unwrap())
            .unwrap();
    let n1 = shoal_cluster::tls::issue::serial_of(
        &std::fs::read_to_string(dir.path().join("n1.crt")).unwrap(),
    )
    .unwrap();
    assert_eq!(serials, vec![n1]);
}

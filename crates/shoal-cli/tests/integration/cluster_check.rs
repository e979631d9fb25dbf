//! `shoal cluster check FILE`: a hand-written cluster file validated the way
//! the daemons read it, every problem said in words naming the node and the
//! key, exit status 1 on an error (and with --strict on a warning). The
//! files name hosts by IP address, so nothing is resolved.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use crate::support::shoal;

/// Two nodes on host alpha mapped to each other, one on beta reached over
/// the network, with the same paths as node 0; a token file and per-node
/// keys.
fn hosts_file(dir: &Path) -> String {
    std::fs::write(dir.join("token"), "secret\n").unwrap();
    std::fs::set_permissions(dir.join("token"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let key = |c: char| c.to_string().repeat(64);
    format!(
        r#"[cluster]
name = "prod"
token_file = "token"
tls_ca = "/etc/shoal/ca.crt"

[[node]]
id = 0
host = "alpha"
rpc = "10.0.0.1:7700"
listen = "0.0.0.0:7700"
socket = "/run/shoal/n0.sock"
region = "/dev/shm/shoal-n0"
region_size = "1GiB"
access = "host"
public_key = "{}"
key_file = "/etc/shoal/node0.key"
tls_cert = "/etc/shoal/node0.crt"
tls_key = "/etc/shoal/node0.tls"

[[node]]
id = 1
host = "alpha"
rpc = "10.0.0.1:7710"
listen = "0.0.0.0:7710"
socket = "/run/shoal/n1.sock"
region = "/dev/shm/shoal-n1"
region_size = "1GiB"
access = "host"
public_key = "{}"
key_file = "/etc/shoal/node1.key"
tls_cert = "/etc/shoal/node1.crt"
tls_key = "/etc/shoal/node1.tls"

[[node]]
id = 2
host = "beta"
rpc = "10.0.0.2:7700"
listen = "0.0.0.0:7700"
socket = "/run/shoal/n0.sock"
region = "/dev/shm/shoal-n0"
region_size = "1GiB"
access = "host"
public_key = "{}"
key_file = "/etc/shoal/node0.key"
tls_cert = "/etc/shoal/node0.crt"
tls_key = "/etc/shoal/node0.tls"
"#,
        key('a'),
        key('b'),
        key('c')
    )
}

fn check(dir: &Path, text: &str, extra: &[&str]) -> Output {
    let file = dir.join("cluster.toml");
    std::fs::write(&file, text).unwrap();
    // Owner-only, as a file holding the token must be.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    shoal()
        .args(["cluster", "check"])
        .args(extra)
        .arg(&file)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_valid_file_for_every_host_shows_how_each_node_is_reached() {
    let dir = tempfile::tempdir().unwrap();
    let out = check(dir.path(), &hosts_file(dir.path()), &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("cluster \"prod\": 3 nodes on 2 hosts, coherent, per-node keys"),
        "{stdout}"
    );
    assert!(
        stdout.contains("peer traffic: TLS 1.3, CA /etc/shoal/ca.crt"),
        "{stdout}"
    );
    assert!(stdout.contains("host \"alpha\": nodes 0, 1"), "{stdout}");
    assert!(
        stdout.contains(
            "  node 0: rpc 10.0.0.1:7700 (binds 0.0.0.0:7700), data 10.0.0.1:7701 (binds \
             0.0.0.0:7701), access host, mapped by 1, pulled by 2"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("  node 2: rpc 10.0.0.2:7700 (binds 0.0.0.0:7700), data 10.0.0.2:7701 (binds 0.0.0.0:7701), access host, pulled by 0, 1"),
        "{stdout}"
    );
    assert!(stdout.contains("valid (0 errors, 0 warnings)"), "{stdout}");
    assert!(!stdout.contains("error:") && !stdout.contains("warning:"));
}

#[test]
fn every_error_is_said_in_words_and_the_exit_status_is_1() {
    let dir = tempfile::tempdir().unwrap();
    let broken = hosts_file(dir.path())
        // node 1 takes node 0's socket on their host
        .replace("/run/shoal/n1.sock", "/run/shoal/n0.sock")
        // node 2: a size that is none
        .replacen("region_size = \"1GiB\"\naccess = \"host\"\npublic_key = \"cccc", "region_size = \"lots\"\naccess = \"host\"\npublic_key = \"cccc", 1)
        // node 0: a misspelt key
        .replace("listen = \"0.0.0.0:7700\"\nsocket = \"/run/shoal/n0.sock\"\nregion = \"/dev/shm/shoal-n0\"\nregion_size = \"1GiB\"\naccess = \"host\"\npublic_key = \"aaaa",
                 "lissen = \"0.0.0.0:7700\"\nsocket = \"/run/shoal/n0.sock\"\nregion = \"/dev/shm/shoal-n0\"\nregion_size = \"1GiB\"\naccess = \"host\"\npublic_key = \"aaaa");
    let out = check(dir.path(), &broken, &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let errors: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 2, "{stdout}");
    assert!(
        errors[0].starts_with("error: node 0: unknown field `lissen`"),
        "{stdout}"
    );
    assert!(
        errors[1].starts_with("error: node 2: region_size \"lots\""),
        "{stdout}"
    );
    assert!(
        stderr.contains("cluster.toml: 2 errors, 0 warnings"),
        "{stderr}"
    );
    // With those fixed, the rules between nodes: the socket shared on alpha.
    let shared = hosts_file(dir.path()).replace("/run/shoal/n1.sock", "/run/shoal/n0.sock");
    let out = check(dir.path(), &shared, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("error: node 1: socket /run/shoal/n0.sock is used by another node on host \"alpha\" (node 0's socket)"),
        "{stdout}"
    );
    // Hosts apart in cleartext only when the file says so.
    let cleartext: String = hosts_file(dir.path())
        .lines()
        .filter(|l| !l.starts_with("tls_"))
        .collect::<Vec<_>>()
        .join("\n");
    let out = check(dir.path(), &cleartext, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("error: nodes [0, 1, 2] are reached from other hosts (node 0's rpc 10.0.0.1:7700 is not a loopback address)"),
        "{stdout}"
    );
    let allowed = cleartext.replace(
        "token_file = \"token\"",
        "token_file = \"token\"\ninsecure_cleartext = true",
    );
    let out = check(dir.path(), &allowed, &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("peer traffic: cleartext between hosts (insecure_cleartext)"),
        "{stdout}"
    );
    // A node without its certificate, in a file with the CA.
    let missing = hosts_file(dir.path()).replace(
        "tls_cert = \"/etc/shoal/node1.crt\"\ntls_key = \"/etc/shoal/node1.tls\"\n",
        "",
    );
    let out = check(dir.path(), &missing, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(
            "error: [cluster] tls_ca needs every node's tls_cert and tls_key (not on nodes [1])"
        ),
        "{stdout}"
    );
    // A file that is not TOML says where.
    let out = check(dir.path(), "[cluster\nname = 1", &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("error: TOML parse error at line 1"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn warnings_leave_the_file_valid_unless_strict() {
    let dir = tempfile::tempdir().unwrap();
    // The token in the file, no keys, and node 0 mapped by node 2 on beta.
    let mut text_ = hosts_file(dir.path()).replace("token_file = \"token\"", "token = \"secret\"");
    text_ = text_
        .lines()
        .filter(|l| !l.starts_with("public_key") && !l.starts_with("key_file"))
        .collect::<Vec<_>>()
        .join("\n");
    let text_ = text_
        .replacen("access = \"host\"", "access = \"mapped\"", 1)
        .replace(
            "region = \"/dev/shm/shoal-n0\"\nregion_size = \"1GiB\"\naccess = \"host\"",
            "region = \"/dev/shm/shoal-n2\"\nregion_size = \"1GiB\"\naccess = \"host\"",
        );
    let out = check(dir.path(), &text_, &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let warnings: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .collect();
    assert_eq!(warnings.len(), 3, "{stdout}");
    assert!(warnings[0].starts_with("warning: [cluster] token is written in the file"));
    assert!(warnings[1].starts_with("warning: no node has public_key and key_file"));
    assert!(warnings[2].starts_with("warning: node 0: access = \"mapped\" (the default) has every node map its region /dev/shm/shoal-n0 at that path, also node 2 on \"beta\""), "{stdout}");
    // The token is in this file, readable by others.
    std::fs::set_permissions(
        dir.path().join("cluster.toml"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let file = dir.path().join("cluster.toml");
    let out = shoal()
        .args(["cluster", "check", "--strict"])
        .arg(&file)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("(mode 644): chmod 600"), "{stdout}");
    assert!(
        text(&out.stderr).contains("0 errors, 4 warnings"),
        "{}",
        text(&out.stderr)
    );
}

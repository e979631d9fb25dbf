//! Real etcd servers for the membership tests: one process per member, on
//! loopback ports, data in a temporary directory, killed at drop.
//! Debian's etcd-server and etcd-client (etcdctl; scripts/setup-test-tools.sh
//! installs both).

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_ports;

/// An etcd cluster of one or more members.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    initial: String,
}

struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

impl EtcdCluster {
    /// Starts `count` members and waits until each takes client connections.
    /// Panics, saying how to install it, if `etcd` is not on PATH.
    pub fn start(count: usize) -> Self {
        assert!(
            crate::installed("etcd"),
            "etcd is not on PATH: scripts/setup-test-tools.sh installs Debian's etcd-server"
        );
        let ports = free_ports(count * 2);
        let members: Vec<Member> = (0..count)
            .map(|i| Member {
                name: format!("e{i}"),
                client: ports[2 * i],
                peer: ports[2 * i + 1],
                child: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Self {
            dir: tempfile::tempdir().unwrap(),
            members,
            initial,
        };
        for i in 0..count {
            cluster.spawn(i);
        }
        for i in 0..count {
            cluster.wait_serving(i);
        }
        cluster.wait_healthy();
        cluster
    }

    /// Waits until the cluster has a leader and commits (`etcdctl endpoint
    /// health` writes nothing: it reads through the leader).
    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let healthy = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args([
                    "--endpoints",
                    &self.endpoints().join(","),
                    "endpoint",
                    "health",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if healthy {
                return;
            }
            assert!(Instant::now() < deadline, "etcd did not become healthy");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn spawn(&mut self, i: usize) {
        let data = self.dir.path().join(&self.members[i].name);
        let log = std::fs::File::create(self.log(i)).unwrap();
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let child = Command::new("etcd")
            .args(["--name", &m.name, "--data-dir"])
            .arg(&data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args([
                "--initial-cluster",
                &self.initial,
                "--initial-cluster-state",
                "new",
            ])
            .args(["--initial-cluster-token", "shoal-test"])
            // Fast elections: a test kills the leader and measures the gap.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.members[i].child = Some(child);
    }

    fn log(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[i].name))
    }

    fn wait_serving(&self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let address = format!("127.0.0.1:{}", self.members[i].client);
        while TcpStream::connect(&address).is_err() {
            assert!(
                Instant::now() < deadline,
                "etcd {} did not start; its log:\n{}",
                self.members[i].name,
                std::fs::read_to_string(self.log(i)).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `host:port` of every member's client endpoint.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect()
    }

    /// The membership URL of a shoal cluster under `prefix` in this etcd.
    pub fn url(&self, prefix: &str) -> String {
        format!(
            "etcd://{}/{}",
            self.endpoints().join(","),
            prefix.trim_matches('/')
        )
    }

    /// The value of `key` as `etcdctl get` reads it (`None`: absent).
    pub fn get(&self, key: &str) -> Option<String> {
        let output = Command::new("etcdctl")
            .arg(format!("--endpoints={}", self.endpoints().join(",")))
            .args(["get", key, "--print-value-only"])
            .env("ETCDCTL_API", "3")
            .output()
            .expect("run etcdctl");
        assert!(
            output.status.success(),
            "etcdctl get {key}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let value = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        (!value.is_empty()).then_some(value)
    }

    /// kill -9 of member `i` (its data stays, [`EtcdCluster::restart`] brings it back).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) to member `i`.
    pub fn pause(&self, i: usize, stopped: bool) {
        if let Some(child) = &self.members[i].child {
            let signal = if stopped {
                libc::SIGSTOP
            } else {
                libc::SIGCONT
            };
            // SAFETY: kill(2) on a child we spawned and have not reaped.
            unsafe { libc::kill(child.id() as i32, signal) };
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_serving(i);
        self.wait_healthy();
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.pause(i, false);
            self.kill(i);
        }
    }
}

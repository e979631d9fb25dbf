//! What these tests share beyond `shoal-testing`: the `shoal` binary this
//! crate builds, and an emulated cluster started with the real `shoal
//! cluster up` (and stopped with `cluster down`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use shoal_cluster::Topology;

pub fn shoal() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shoal"))
}

/// A cluster of `shoal cluster up`, down again when dropped.
pub struct Cluster {
    pub dir: PathBuf,
    pub topology: Topology,
    pub up_output: String,
}

impl Cluster {
    pub fn up(dir: &Path, nodes: u32, name: &str) -> Self {
        Self::up_with(dir, nodes, name, &[])
    }

    /// [`up`](Self::up) with more of `cluster up`'s arguments.
    pub fn up_with(dir: &Path, nodes: u32, name: &str, more: &[&str]) -> Self {
        let output = shoal()
            .args([
                "cluster",
                "up",
                "--nodes",
                &nodes.to_string(),
                "--capacity",
                "64MiB",
            ])
            .args(["--linger-ms", "0", "--name", name])
            .args(more)
            .arg("--dir")
            .arg(dir)
            .output()
            .expect("run shoal cluster up");
        let up_output = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "cluster up: {up_output}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // Not a terminal: no progress bar in the output.
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !stderr.contains("starting") && !stderr.contains("rebuilding"),
            "{stderr}"
        );
        let topology = Topology::load(&dir.join("cluster.toml")).unwrap().sorted();
        Self {
            dir: dir.to_owned(),
            topology,
            up_output,
        }
    }

    pub fn metrics(&self, node: u32) -> SocketAddr {
        self.topology.nodes[node as usize]
            .metrics
            .expect("cluster up serves metrics")
    }

    pub fn socket(&self, node: u32) -> &Path {
        &self.topology.nodes[node as usize].socket
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = shoal()
            .args(["cluster", "down", "--dir"])
            .arg(&self.dir)
            .output();
    }
}

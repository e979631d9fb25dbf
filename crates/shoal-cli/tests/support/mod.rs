//! What the operations tests share: an emulated cluster started with the
//! real `shoal cluster up` (and stopped with `cluster down`), and plain
//! HTTP GETs to its metrics endpoints and to Prometheus.

#![allow(dead_code)] // each test file uses part of it

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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
        let output = shoal()
            .args([
                "cluster",
                "up",
                "--nodes",
                &nodes.to_string(),
                "--capacity",
                "64MiB",
            ])
            .args(["--linger-ms", "0", "--name", name, "--dir"])
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

/// `GET path` (path and query, already encoded): the status and the body.
pub fn http_get(address: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// Percent-encodes a query parameter (PromQL is full of braces and quotes).
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Whether `program` is on PATH.
pub fn installed(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

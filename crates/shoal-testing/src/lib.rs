//! What shoal's tests share, so that no test file starts a daemon its own
//! way: a daemon on a thread of the test ([`TestDaemon`]) or as a process
//! of its own ([`ServeProcess`]: kill -9, signals, restarts), clusters of
//! them on loopback ([`TestCluster`], [`LoneNode`], [`ClusterNode`]), objects
//! a test tells apart ([`pattern`], [`read_object`]), free ports, waiting
//! with a deadline, logs, plain HTTP to the metrics endpoints, real etcd
//! servers ([`EtcdCluster`]) and a link to one of them a test cuts
//! ([`TcpProxy`]).
//!
//! A dev-dependency only: every crate's integration tests use it; nothing
//! shipped does. It depends on the daemon, so the daemon's own unit tests
//! (inside `src/`) cannot use it; its integration tests (`tests/`) do.

mod cluster;
mod daemon;
mod etcd;
mod http;
mod logs;
mod objects;
mod ports;
mod process;
mod proxy;
mod wait;

pub use cluster::{
    loopback_topology, with_node_keys, with_peer, with_tls, ClusterNode, LoneNode, PeerRpc, TestCa,
    TestCluster,
};
pub use daemon::TestDaemon;
pub use etcd::EtcdCluster;
pub use http::{encode, http_get, metric};
pub use logs::init_logs;
pub use objects::{pattern, put_patterns, read_object};
pub use ports::free_ports;
pub use process::ServeProcess;
pub use proxy::TcpProxy;
pub use wait::{eventually, eventually_within, wait_started, START_WAIT};

/// Whether `program` is on PATH (tests that need fio, Prometheus or a
/// browser skip, saying so, where it is not).
pub fn installed(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

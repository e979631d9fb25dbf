//! A real cluster node (node 0 of two) and this test acting as node 1 over
//! the peer RPC: what node 0 does with the references a caller takes.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shoal_client::Client;
use shoal_cluster::auth::Credentials;
use shoal_cluster::home_of;
use shoal_cluster::ids::pack;
use shoal_cluster::proto::peer_client::PeerClient;
use shoal_cluster::proto::{AcquireRequest, AllocateRequest, HeartbeatRequest};
use shoal_core::error::Result;
use shoal_core::ObjectId;
use shoal_daemon::{ClusterConfig, DaemonConfig, Shutdown};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const REGION_SIZE: u64 = 8 << 20;
const TOKEN: &str = "peer-calls-token";

/// Node 0 of a two-node cluster; node 1's addresses have no one behind them.
struct NodeZero {
    socket: PathBuf,
    rpc: SocketAddr,
    shutdown: Shutdown,
    thread: Option<JoinHandle<Result<()>>>,
    _dir: tempfile::TempDir,
}

impl NodeZero {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut topology = support::loopback_topology(
            "peer-calls",
            2,
            REGION_SIZE,
            Duration::from_millis(1000),
            dir.path(),
        );
        // Long: nothing here may expire during a test.
        topology.lease = Duration::from_secs(30);
        assert_eq!(topology.token, TOKEN);
        let socket = topology.nodes[0].socket.clone();
        let rpc = topology.nodes[0].rpc;
        let mut config = DaemonConfig::new(&socket, REGION_SIZE);
        config.prefault = false;
        config.cluster = Some(ClusterConfig { topology, node: 0 });
        let shutdown = Shutdown::new();
        let thread = {
            let shutdown = shutdown.clone();
            std::thread::spawn(move || shoal_daemon::serve_blocking(config, shutdown))
        };
        support::wait_serving(&socket, Instant::now() + Duration::from_secs(10));
        Self {
            socket,
            rpc,
            shutdown,
            thread: Some(thread),
            _dir: dir,
        }
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    /// Node 0's references on `id` (its own clients' and its peers').
    fn refs(&self, id: ObjectId) -> Option<u32> {
        let objects = self.client().list().unwrap();
        objects.iter().find(|o| o.id == id).map(|o| o.refs)
    }
}

impl Drop for NodeZero {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap().unwrap();
        }
    }
}

/// An id whose home is node 0 (node 1 cannot answer its Register).
fn homed_at_zero() -> ObjectId {
    loop {
        let id = ObjectId::random();
        if home_of(&id, 2) == 0 {
            return id;
        }
    }
}

fn heartbeat(incarnation: u64) -> HeartbeatRequest {
    HeartbeatRequest {
        node: 1,
        incarnation,
    }
}

/// Runs `calls` as node 1 against `node` (a current-thread runtime of its own).
fn as_node_1<F: std::future::Future<Output = ()>>(
    node: &NodeZero,
    calls: impl FnOnce(PeerClient<InterceptedService<Channel, Credentials>>) -> F,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.rpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        calls(PeerClient::with_interceptor(
            channel,
            Credentials::new(TOKEN, 1).unwrap(),
        ))
        .await
    });
}

// Node 1 has never sent node 0 a heartbeat when it first takes references
// there (its first heartbeat was lost, say); then it restarts. Node 0 learnt
// its incarnation from the Acquire or the Allocate itself, so the restarted
// node's first heartbeat drops what its previous incarnation took.

#[test]
fn references_acquired_before_any_heartbeat_go_when_the_caller_restarts() {
    // (Without the incarnation in Acquire, node 0 took 222 for a first
    // contact and kept the references until they were released.)
    let node = NodeZero::start();
    let id = homed_at_zero();
    // Creates wait until node 0's directory is ready (node 1 never answers).
    node.client().put(id, b"sealed at node 0", b"").unwrap();
    let n = &node;
    as_node_1(n, |mut peer| async move {
        let request = AcquireRequest {
            ids: pack(&[id]),
            incarnation: 111,
        };
        let reply = peer.acquire(request).await.unwrap().into_inner();
        assert_eq!(reply.entries[0], 1, "found and referenced");
        assert_eq!(n.refs(id), Some(1));
        // Node 1's first heartbeat, from a new incarnation: a restart.
        peer.heartbeat(heartbeat(222)).await.unwrap();
        assert_eq!(n.refs(id), Some(0));
    });
}

#[test]
fn objects_allocated_before_any_heartbeat_go_when_the_caller_restarts() {
    let node = NodeZero::start();
    let id = homed_at_zero();
    node.client().put(homed_at_zero(), b"ready", b"").unwrap();
    let n = &node;
    as_node_1(n, |mut peer| async move {
        let request = AllocateRequest {
            ids: pack(&[id]),
            data_sizes: vec![100],
            meta_sizes: vec![0],
            timeout_ms: 0,
            incarnation: 111,
        };
        let reply = peer.allocate(request).await.unwrap().into_inner();
        assert_eq!(reply.code, 0, "{}", reply.message);
        assert_eq!(n.refs(id), Some(1), "the creator's reference");
        peer.heartbeat(heartbeat(222)).await.unwrap();
        assert_eq!(n.refs(id), None, "the unsealed allocation was aborted");
    });
}

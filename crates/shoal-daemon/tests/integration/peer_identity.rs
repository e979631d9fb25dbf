//! Per-node identities (issue 15 item 8): a real node 0 of a three-node
//! cluster whose nodes have keys of their own, and this test holding node
//! 1's and node 2's keys. Node 2 is a member in good standing; it must not be
//! able to speak as node 1 — not in a heartbeat (which, with a new
//! incarnation, would make node 0 drop node 1's references while node 1's
//! clients still read the object), and not on the bulk data channel.

use std::time::Duration;

use shoal_cluster::auth::{Credentials, PeerIdentity};
use shoal_cluster::bulk::{fetch_range, Kind, Request};
use shoal_cluster::home_of;
use shoal_cluster::ids::pack;
use shoal_cluster::proto::{AcquireRequest, HeartbeatRequest};
use shoal_core::error::{ErrorKind, Result};
use shoal_core::ObjectId;
use shoal_daemon::ClusterConfig;
use shoal_testing::{LoneNode, PeerRpc, TestDaemon};

const REGION_SIZE: u64 = 8 << 20;
const PAYLOAD: &[u8] = b"read by node 1's clients in place";

/// Node 0 of three with per-node keys; the test plays nodes 1 and 2.
struct NodeZero(LoneNode);

impl std::ops::Deref for NodeZero {
    type Target = LoneNode;
    fn deref(&self) -> &LoneNode {
        &self.0
    }
}

impl NodeZero {
    fn start() -> Self {
        Self(LoneNode::start(
            "peer-identity",
            3,
            REGION_SIZE,
            true,
            Duration::from_secs(30),
        ))
    }

    /// Node `n` as the test plays it, with the key from its key file.
    fn as_node(&self, n: u32) -> PeerIdentity {
        PeerIdentity::for_node(&self.topology, n).unwrap()
    }

    /// Runs `calls` against node 0 with `credentials`.
    fn call<F: std::future::Future<Output = ()>>(
        &self,
        credentials: Credentials,
        calls: impl FnOnce(PeerRpc) -> F,
    ) {
        shoal_testing::with_peer(&self.topology.nodes[0].rpc, credentials, calls)
    }

    /// Reads `id` from node 0's data channel as the request says.
    fn fetch(&self, id: ObjectId, from: u32, token: &[u8]) -> Result<Vec<u8>> {
        let mut bytes = vec![0u8; PAYLOAD.len()];
        let request = Request {
            kind: Kind::Pull,
            from,
            token: token.to_vec(),
            id,
            offset: 0,
            len: PAYLOAD.len() as u64,
        };
        fetch_range(
            0,
            &self.topology.nodes[0].data,
            &request,
            &mut bytes,
            Duration::from_secs(5),
            None,
        )?;
        Ok(bytes)
    }
}

/// A heartbeat of node 1 at `incarnation`.
fn beat(incarnation: u64) -> HeartbeatRequest {
    HeartbeatRequest {
        node: 1,
        incarnation,
        ..Default::default()
    }
}

fn homed_at_zero() -> ObjectId {
    loop {
        let id = ObjectId::random();
        if home_of(&id, 3) == 0 {
            return id;
        }
    }
}

/// `identity`'s credential to node 0, with node `claimed`'s id in the
/// node header (what a forger controls).
fn claiming(identity: &PeerIdentity, claimed: u32) -> Credentials {
    let token = identity.token_for(0).unwrap();
    Credentials::new(std::str::from_utf8(&token).unwrap(), claimed).unwrap()
}

#[test]
fn a_member_cannot_speak_as_another_member() {
    let node = NodeZero::start();
    let id = homed_at_zero();
    node.client().put(id, PAYLOAD, b"").unwrap();
    let (one, two) = (node.as_node(1), node.as_node(2));
    let n = &node;

    // Node 1 takes a reference (its clients read the object in place).
    n.call(one.credentials(0).unwrap(), |mut peer| async move {
        peer.heartbeat(beat(111)).await.unwrap();
        let reply = peer
            .acquire(AcquireRequest {
                ids: pack(&[id]),
                incarnation: 111,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.entries[0], 1, "found and referenced");
    });
    assert_eq!(n.refs(id), Some(1));

    // Node 2, with its own valid key, claims to be node 1 restarting: with a
    // shared token this dropped node 1's reference.
    n.call(claiming(&two, 1), |mut peer| async move {
        let refused = peer.heartbeat(beat(222)).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    });
    // Node 1's credential to node 2, replayed by node 2 to node 0.
    let replayed =
        Credentials::new(std::str::from_utf8(&one.token_for(2).unwrap()).unwrap(), 1).unwrap();
    n.call(replayed, |mut peer| async move {
        let refused = peer.heartbeat(beat(333)).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    });
    // The shared cluster token alone no longer admits a caller.
    let token = node.topology.token.clone();
    n.call(
        Credentials::new(&token, 1).unwrap(),
        |mut peer| async move {
            let refused = peer.heartbeat(beat(444)).await.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
        },
    );
    assert_eq!(
        n.refs(id),
        Some(1),
        "node 1's reference survived every forgery"
    );

    // The data channel: node 2 asking for node 1's reference's bytes.
    let err = n.fetch(id, 1, &two.token_for(0).unwrap()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("credential"), "{err}");
    let err = n.fetch(id, 1, token.as_bytes()).unwrap_err();
    assert!(err.message().contains("credential"), "{err}");
    // Node 2 as itself holds no reference: refused, and nothing pinned.
    let err = n.fetch(id, 2, &two.token_for(0).unwrap()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectNotFound, "{err}");
    // Node 1 as itself reads the bytes.
    assert_eq!(n.fetch(id, 1, &one.token_for(0).unwrap()).unwrap(), PAYLOAD);
    // The answering end drops its send pin after the last byte went out,
    // which may be after the reader has them all (under load: seen in full
    // test runs).
    shoal_testing::eventually("the send pin was released", || n.refs(id) == Some(1));

    // And node 1, as itself, restarting does drop its reference.
    n.call(one.credentials(0).unwrap(), |mut peer| async move {
        peer.heartbeat(beat(555)).await.unwrap();
    });
    assert_eq!(n.refs(id), Some(0));
}

#[test]
fn a_node_refuses_to_start_with_a_key_that_is_not_its_own() {
    shoal_testing::init_logs();
    let dir = tempfile::tempdir().unwrap();
    let mut topology = shoal_testing::loopback_topology(
        "peer-identity-key",
        2,
        REGION_SIZE,
        Duration::from_millis(1000),
        dir.path(),
    );
    shoal_testing::with_node_keys(&mut topology, dir.path());
    // Node 0's file names node 1's key.
    let other = topology.nodes[1].identity.clone().unwrap().key_file;
    topology.nodes[0].identity.as_mut().unwrap().key_file = other;
    let socket = topology.nodes[0].socket.clone();
    let mut config = TestDaemon::config(dir.path(), REGION_SIZE);
    config.socket = socket;
    config.cluster = Some(ClusterConfig { topology, node: 0 });
    let err = TestDaemon::try_start(config).err().expect("refused");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.message().contains("not node 0's"), "{err}");
}

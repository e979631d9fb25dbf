//! A real cluster node (node 0 of two) and this test acting as node 1 over
//! the peer RPC: what node 0 does with the references a caller takes.

use std::time::Duration;

use shoal_cluster::auth::Credentials;
use shoal_cluster::home_of;
use shoal_cluster::ids::pack;
use shoal_cluster::proto::{
    AcquireRequest, AllocateRequest, AttachReadsRequest, HeartbeatRequest, ReleaseRequest,
    SealRequest,
};
use shoal_core::ObjectId;
use shoal_testing::{LoneNode, PeerRpc};

const REGION_SIZE: u64 = 8 << 20;
const TOKEN: &str = "peer-calls-token";

/// Node 0 of two; node 1 is this test.
fn node_zero() -> LoneNode {
    // Long leases: nothing may expire during these tests.
    let node = LoneNode::start("peer-calls", 2, REGION_SIZE, false, Duration::from_secs(30));
    assert_eq!(node.topology.token, TOKEN);
    node
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
        ..Default::default()
    }
}

/// Runs `calls` as node 1 against `node`.
fn as_node_1<F: std::future::Future<Output = ()>>(
    node: &LoneNode,
    calls: impl FnOnce(PeerRpc) -> F,
) {
    shoal_testing::with_peer(
        &node.topology.nodes[0].rpc,
        Credentials::new(TOKEN, 1).unwrap(),
        calls,
    )
}

// Node 1 has never sent node 0 a heartbeat when it first takes references
// there (its first heartbeat was lost, say); then it restarts. Node 0 learnt
// its incarnation from the Acquire or the Allocate itself, so the restarted
// node's first heartbeat drops what its previous incarnation took.

#[test]
fn references_acquired_before_any_heartbeat_go_when_the_caller_restarts() {
    // (Without the incarnation in Acquire, node 0 took 222 for a first
    // contact and kept the references until they were released.)
    let node = node_zero();
    let id = homed_at_zero();
    // Creates wait until node 0's directory is ready (node 1 never answers).
    node.client().put(id, b"sealed at node 0", b"").unwrap();
    let n = &node;
    as_node_1(n, |mut peer| async move {
        let request = AcquireRequest {
            ids: pack(&[id]),
            incarnation: 111,
            ..Default::default()
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
    let node = node_zero();
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

// Fencing (issue 15 item 9, docs/cluster.md "Fencing"): node 1 falls silent
// past its lease while its clients still map an object of node 0's and
// write one node 0 allocated for them.

#[test]
fn a_peer_cut_off_past_its_lease_is_fenced_its_memory_quarantined_not_reused() {
    let lease = Duration::from_millis(500);
    let node = LoneNode::start("peer-fence", 2, REGION_SIZE, false, lease);
    assert_eq!(node.topology.token, "peer-fence-token");
    let (read, again, writing) = (homed_at_zero(), homed_at_zero(), homed_at_zero());
    node.client().put(read, &[b'r'; 4096], b"").unwrap();
    node.client().put(again, b"again", b"").unwrap();
    let n = &node;
    let (rpc, token) = (&node.topology.nodes[0].rpc, node.topology.token.clone());
    let as_node_1 = || Credentials::new(&token, 1).unwrap();
    let granted = shoal_testing::with_peer(rpc, as_node_1(), |mut peer| async move {
        peer.heartbeat(heartbeat(111)).await.unwrap();
        let reply = peer
            .acquire(acquire(&[read, again]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.fence_epoch, 0);
        let allocated = peer.allocate(allocate(writing)).await.unwrap().into_inner();
        assert_eq!(
            (allocated.code, allocated.fence_epoch),
            (0, 0),
            "{}",
            allocated.message
        );
        reply
    });
    let at = shoal_cluster::ids::locations(&granted.entries, 2).unwrap();
    let read_at = at[0].unwrap().offset;
    assert_eq!((n.refs(read), n.refs(again)), (Some(1), Some(1)));

    // Silent past its lease: fenced. What it held stays held (quarantine).
    std::thread::sleep(lease * 3);
    assert_eq!(
        (n.refs(read), n.refs(again)),
        (Some(1), Some(1)),
        "not freed"
    );
    // Operators see it (the snapshot behind /metrics is taken every second).
    let quarantined = || node.peer_metric("shoal_peer_quarantined", 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while quarantined() != Some(1.0) {
        assert!(std::time::Instant::now() < deadline, "{:?}", quarantined());
        std::thread::sleep(Duration::from_millis(50));
    }
    node.client().delete(&[read]).unwrap();
    // Best fit would give a new object of that size the block `read` had.
    let new = node.client().create(homed_at_zero(), 4096, 0, 0).unwrap();
    assert_ne!(new.offset, read_at, "the fenced reader's block was reused");

    shoal_testing::with_peer(rpc, as_node_1(), |mut peer| async move {
        // Back: every answer tells it it was fenced.
        peer.heartbeat(heartbeat(111)).await.unwrap();
        let reply = peer.acquire(acquire(&[again])).await.unwrap().into_inner();
        assert_eq!(reply.fence_epoch, 1);
        // Its late seal of the quarantined allocation is refused.
        let sealed = peer
            .seal(SealRequest {
                ids: pack(&[writing]),
                release: true,
            })
            .await
            .unwrap()
            .into_inner();
        assert_ne!(sealed.code, 0, "a fenced allocation was sealed");
        // A release sent before it heard of the fence changes nothing ...
        peer.release(release(again, 0)).await.unwrap();
    });
    assert_eq!(
        n.refs(again),
        Some(2),
        "the quarantined one and the new one"
    );
    shoal_testing::with_peer(rpc, as_node_1(), |mut peer| async move {
        // ... one under the new epoch drops the new reference.
        peer.release(release(again, 1)).await.unwrap();
        // It confirms: the quarantine is freed.
        peer.heartbeat(HeartbeatRequest {
            fence_confirmed: 1,
            ..heartbeat(111)
        })
        .await
        .unwrap();
    });
    assert_eq!(n.refs(again), Some(0));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while quarantined() != Some(0.0) {
        assert!(std::time::Instant::now() < deadline, "{:?}", quarantined());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        node.client()
            .list()
            .unwrap()
            .iter()
            .all(|o| o.id != read && o.id != writing),
        "the quarantined objects were freed"
    );
}

// Numbered reference calls (issue 15 item 10, docs/cluster.md "Numbered
// reference calls"): node 1 sends a call again after its answer was lost,
// or undoes an acquire whose answer it never got.

#[test]
fn a_release_sent_again_under_its_number_drops_one_reference() {
    // (Unnumbered, the second copy dropped the reference node 1's other
    // client still reads through: refs 0, the object evictable under it.)
    let node = node_zero();
    let id = homed_at_zero();
    node.client()
        .put(id, b"read by two clients of node 1", b"")
        .unwrap();
    let n = &node;
    as_node_1(n, |mut peer| async move {
        peer.heartbeat(heartbeat(111)).await.unwrap();
        for seq in [1, 2] {
            let reply = peer
                .acquire(numbered_acquire(&[id], seq, seq - 1))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(reply.entries[0], 1, "found and referenced");
        }
        assert_eq!(n.refs(id), Some(2));
        let once = ReleaseRequest {
            seq: 3,
            settled: 2,
            ..release(id, 0)
        };
        peer.release(once.clone()).await.unwrap();
        // Its answer was lost: node 1 sends it again.
        peer.release(once).await.unwrap();
        assert_eq!(n.refs(id), Some(1), "applied once");
        // A later number is a new release.
        peer.release(ReleaseRequest {
            seq: 4,
            settled: 3,
            ..release(id, 0)
        })
        .await
        .unwrap();
        assert_eq!(n.refs(id), Some(0));
    });
}

#[test]
fn an_acquire_whose_answer_was_lost_is_undone_once() {
    // (Before, an acquire that timed out at node 1 but was applied here
    // kept its reference until node 1 restarted: the object pinned.)
    let node = node_zero();
    let (kept, lost) = (homed_at_zero(), homed_at_zero());
    node.client().put(kept, b"kept", b"").unwrap();
    node.client().put(lost, b"lost", b"").unwrap();
    let n = &node;
    as_node_1(n, |mut peer| async move {
        peer.heartbeat(heartbeat(111)).await.unwrap();
        // Call 1 is answered; call 2's answer is lost (node 1 timed out).
        peer.acquire(numbered_acquire(&[kept], 1, 0)).await.unwrap();
        peer.acquire(numbered_acquire(&[kept, lost], 2, 1))
            .await
            .unwrap();
        assert_eq!((n.refs(kept), n.refs(lost)), (Some(2), Some(1)));
        let undo = ReleaseRequest {
            settled: 1,
            undo: vec![2],
            ..Default::default()
        };
        peer.release(undo.clone()).await.unwrap();
        assert_eq!(
            (n.refs(kept), n.refs(lost)),
            (Some(1), Some(0)),
            "exactly what call 2 took"
        );
        // The undo sent again (its answer lost too) drops nothing more.
        peer.release(undo).await.unwrap();
        assert_eq!(n.refs(kept), Some(1));
    });
}

#[test]
fn an_acquire_overtaken_by_its_undo_takes_nothing() {
    let node = node_zero();
    let id = homed_at_zero();
    node.client().put(id, b"late", b"").unwrap();
    let n = &node;
    as_node_1(n, |mut peer| async move {
        peer.heartbeat(heartbeat(111)).await.unwrap();
        peer.release(ReleaseRequest {
            undo: vec![5],
            ..Default::default()
        })
        .await
        .unwrap();
        let reply = peer
            .acquire(numbered_acquire(&[id], 5, 4))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.entries[0], 0, "not referenced");
        assert_eq!(n.refs(id), Some(0));
        // A settled number is never applied again either.
        let reply = peer
            .acquire(numbered_acquire(&[id], 3, 5))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.entries[0], 0);
        assert_eq!(n.refs(id), Some(0));
    });
}

#[test]
fn a_release_meant_for_a_previous_incarnation_is_ignored() {
    let node = node_zero();
    let id = homed_at_zero();
    node.client().put(id, b"restarted owner", b"").unwrap();
    let n = &node;
    as_node_1(n, |mut peer| async move {
        let reply = peer.acquire(acquire(&[id])).await.unwrap().into_inner();
        assert_eq!(n.refs(id), Some(1));
        peer.release(ReleaseRequest {
            callee_incarnation: reply.incarnation + 1,
            ..release(id, 0)
        })
        .await
        .unwrap();
        assert_eq!(n.refs(id), Some(1), "not this incarnation's");
        peer.release(ReleaseRequest {
            callee_incarnation: reply.incarnation,
            ..release(id, 0)
        })
        .await
        .unwrap();
        assert_eq!(n.refs(id), Some(0));
    });
}

fn acquire(ids: &[ObjectId]) -> AcquireRequest {
    AcquireRequest {
        ids: pack(ids),
        incarnation: 111,
        ..Default::default()
    }
}

/// Acquire number `seq` (node 1's calls up to `settled` settled).
fn numbered_acquire(ids: &[ObjectId], seq: u64, settled: u64) -> AcquireRequest {
    AcquireRequest {
        seq,
        settled,
        ..acquire(ids)
    }
}

fn allocate(id: ObjectId) -> AllocateRequest {
    AllocateRequest {
        ids: pack(&[id]),
        data_sizes: vec![4096],
        meta_sizes: vec![0],
        timeout_ms: 0,
        incarnation: 111,
    }
}

fn release(id: ObjectId, fence_epoch: u64) -> ReleaseRequest {
    ReleaseRequest {
        ids: pack(&[id]),
        fence_epoch,
        ..Default::default()
    }
}

fn attach(incarnation: u64, pid: u32, fd: i32, key: u64) -> AttachReadsRequest {
    AttachReadsRequest {
        incarnation,
        pid,
        fd,
        key,
    }
}

// Gets of node 0's objects by node 1's clients without a round trip
// (docs/fast-path.md "Gets of other nodes' objects"): node 0 attaches a
// table only if it is a memfd sealed against shrinking and as long as its
// index needs, from an incarnation it knows; a table it attached keeps what
// it counts, as a local client's would, until node 1 revokes it (an
// unknown incarnation attaches nothing).
#[test]
fn a_peer_table_is_attached_only_if_sealed_and_its_counts_keep_objects() {
    use shoal_core::fast_path::readers::{FastReads, PeerTable};
    use std::os::fd::AsRawFd;
    let node = node_zero();
    let id = homed_at_zero();
    node.client().put(id, &[b'k'; 4096], b"").unwrap();
    let mut owner = node.client();
    let me = std::process::id(); // the daemon is a thread of this test
    as_node_1(&node, |mut peer| async move {
        peer.heartbeat(heartbeat(111)).await.unwrap();
        let index = peer
            .attach_reads(attach(111, me, -1, 0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(index.pid, me);
        assert!(index.slots.is_power_of_two());
        // Bad tables: refused with a typed status, nothing attached.
        let unsealed =
            nix::sys::memfd::memfd_create("unsealed", nix::sys::memfd::MFdFlags::empty()).unwrap();
        nix::unistd::ftruncate(&unsealed, 1 << 24).unwrap();
        let file = tempfile::tempfile().unwrap();
        let short = PeerTable::create(index.slots / 2).unwrap();
        for (what, request) in [
            (
                "an unsealed memfd",
                attach(111, me, unsealed.as_raw_fd(), 1),
            ),
            ("a plain file", attach(111, me, file.as_raw_fd(), 2)),
            (
                "a table too short",
                attach(111, me, short.fd().as_raw_fd(), 3),
            ),
            ("no such descriptor", attach(111, me, 1 << 20, 4)),
            ("no such process", attach(111, u32::MAX - 1, 3, 5)),
        ] {
            let err = peer.attach_reads(request).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{what}: {err}");
        }
        let table = PeerTable::create(index.slots).unwrap();
        let err = peer
            .attach_reads(attach(0, me, table.fd().as_raw_fd(), 6))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
        // A table node 0 attached: a count there keeps the object through
        // its delete; revoked, it counts nothing.
        peer.attach_reads(attach(111, me, table.fd().as_raw_fd(), 7))
            .await
            .unwrap();
        let index_file = std::fs::File::open(format!("/proc/{me}/fd/{}", index.index_fd)).unwrap();
        let fast = FastReads::attach(std::os::fd::AsFd::as_fd(&index_file), table.fd()).unwrap();
        let found = fast.acquire(&id).expect("published at node 0");
        let used = owner.stats().unwrap().used;
        owner.delete(&[id]).unwrap()[0].as_ref().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            owner.stats().unwrap().used,
            used,
            "kept for the peer's reader"
        );
        fast.release(found.position);
        table.revoke();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while owner.stats().unwrap().used == used {
            assert!(std::time::Instant::now() < deadline, "freed once let go");
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

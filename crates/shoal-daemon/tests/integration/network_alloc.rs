//! Remote allocation on nodes reached over the network (issue 38 item 4):
//! a client writes a staging buffer in its own node's memory and the seal
//! pushes the bytes over the bulk data channel into the object its node
//! allocated on the other (docs/cluster.md, "Remote allocation over the
//! network").
//!
//! First as the receiving node sees it (node 0 of two; this test plays node
//! 1 over the peer RPC and the data channel), then end to end through three
//! daemons whose memory none can map.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::time::Duration;

use shoal_client::Client;
use shoal_cluster::bulk::{push_range, Kind, Request};
use shoal_cluster::home_of;
use shoal_cluster::ids::pack;
use shoal_cluster::proto::{AllocateRequest, HeartbeatRequest, Ids, SealRequest};
use shoal_cluster::Access;
use shoal_core::error::{ErrorKind, Result};
use shoal_core::protocol::CreateSpec;
use shoal_core::ObjectId;
use shoal_testing::{eventually, LoneNode, TestCluster};

const MIB: u64 = 1 << 20;
const REGION_SIZE: u64 = 16 * MIB;

/// Node 0 of two; node 1 is this test. Long leases: nothing expires here.
fn node_zero(name: &str) -> LoneNode {
    LoneNode::start(name, 2, REGION_SIZE, false, Duration::from_secs(30))
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

/// `len` bytes of a pattern no two offsets share within 251.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ seed)
        .collect::<Vec<u8>>()
}

/// Peer RPC calls as node 1 of `node`.
fn as_node_1<T, F: std::future::Future<Output = T>>(
    node: &LoneNode,
    calls: impl FnOnce(shoal_testing::PeerRpc) -> F,
) -> T {
    let credentials = shoal_cluster::auth::Credentials::new(&node.topology.token, 1).unwrap();
    shoal_testing::with_peer(&node.topology.nodes[0].rpc, credentials, calls)
}

/// Node 1 heartbeats (incarnation 111) and allocates `ids` of `size` bytes on node 0.
fn allocate(node: &LoneNode, ids: &[ObjectId], size: u64) {
    let request = AllocateRequest {
        ids: pack(ids),
        data_sizes: vec![size; ids.len()],
        meta_sizes: vec![0; ids.len()],
        timeout_ms: 0,
        incarnation: 111,
    };
    as_node_1(node, |mut peer| async move {
        peer.heartbeat(HeartbeatRequest {
            node: 1,
            incarnation: 111,
            ..Default::default()
        })
        .await
        .unwrap();
        let reply = peer.allocate(request).await.unwrap().into_inner();
        assert_eq!(reply.code, 0, "{}", reply.message);
    });
}

fn push_request(from: u32, token: &str, id: ObjectId, offset: u64, len: u64) -> Request {
    Request {
        kind: Kind::Push,
        from,
        token: token.as_bytes().to_vec(),
        id,
        offset,
        len,
    }
}

/// Pushes `data` to node 0 as `request` says, from a file standing for
/// the pushing node's region.
fn push(node: &LoneNode, request: &Request, data: &[u8]) -> Result<()> {
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(data).unwrap();
    assert!(request.len as usize <= data.len());
    // SAFETY: `data` is a copy of the file, alive for the call; the range
    // (offset 0, request.len ≤ data.len()) lies inside both.
    unsafe {
        push_range(
            0,
            &node.topology.nodes[0].data,
            request,
            file.as_fd(),
            data.as_ptr(),
            0,
            Duration::from_secs(5),
            None,
        )
    }
}

#[test]
fn pushes_land_only_in_objects_their_sender_allocated() {
    let node = node_zero("net-push");
    let token = node.topology.token.clone();
    let mut local = node.client();
    // Creates wait until node 0's directory is ready (node 1 never answers).
    let sealed = homed_at_zero();
    local.put(sealed, b"node 0's own", b"").unwrap();
    let writing = homed_at_zero();
    local.create(writing, 4096, 0, 0).unwrap();
    let id = homed_at_zero();
    allocate(&node, &[id], 4096);
    let bytes = pattern(4096, 7);

    let refused = [
        (
            push_request(1, "forged", id, 0, 8),
            ErrorKind::InvalidArgument,
            "token",
        ),
        (
            push_request(0, &token, id, 0, 8),
            ErrorKind::InvalidArgument,
            "not a peer",
        ),
        (
            push_request(1, &token, writing, 0, 8),
            ErrorKind::NotOwner,
            "not writing",
        ),
        (
            push_request(1, &token, sealed, 0, 8),
            ErrorKind::ObjectAlreadySealed,
            "not writing",
        ),
        (
            push_request(1, &token, ObjectId::random(), 0, 8),
            ErrorKind::ObjectNotFound,
            "not writing",
        ),
        (
            push_request(1, &token, id, 4090, 8),
            ErrorKind::InvalidArgument,
            "outside",
        ),
        (
            push_request(1, &token, id, u64::MAX - 2, 8),
            ErrorKind::InvalidArgument,
            "outside",
        ),
    ];
    for (request, kind, why) in refused {
        let err = push(&node, &request, &bytes).unwrap_err();
        assert_eq!(err.kind(), kind, "{request:?}: {err}");
        assert!(err.message().contains(why), "{request:?}: {err}");
    }
    // Nothing was written or held: node 0's own object is intact, nothing referenced twice.
    assert_eq!(node.refs(id), Some(1), "the creator's reference only");

    // Two ranges, in either order, then the seal.
    push(
        &node,
        &push_request(1, &token, id, 2048, 2048),
        &bytes[2048..],
    )
    .unwrap();
    push(&node, &push_request(1, &token, id, 0, 2048), &bytes).unwrap();
    // (The answer comes before the receiving node lets go of its hold.)
    eventually("holds released after the transfers", || {
        node.refs(id) == Some(1)
    });
    as_node_1(&node, |mut peer| async move {
        let outcome = peer
            .seal(SealRequest {
                ids: pack(&[id]),
                release: true,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(outcome.code, 0, "{}", outcome.message);
    });
    let found = local.get(&[id], 1000).unwrap()[0].expect("sealed");
    let ptr = local.located_ptr(found).unwrap();
    // SAFETY: referenced by the get; bounds-checked on receipt.
    let got = unsafe { std::slice::from_raw_parts(ptr, 4096) };
    assert_eq!(got, &bytes[..]);
    local.release(&[id]).unwrap();

    // Sealed now: no more pushes into it.
    let err = push(&node, &push_request(1, &token, id, 0, 8), &bytes).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectAlreadySealed, "{err}");
}

#[test]
fn an_abort_during_a_push_frees_the_memory_only_after_it() {
    let node = node_zero("net-push-abort");
    let mut local = node.client();
    local.put(homed_at_zero(), b"ready", b"").unwrap();
    let before = local.stats().unwrap().used;
    let id = homed_at_zero();
    allocate(&node, &[id], MIB);
    let allocated = local.stats().unwrap().used;
    assert!(allocated >= before + MIB);

    // Half of the bytes, by hand, then the sender aborts its object.
    let request = push_request(1, &node.topology.token, id, 0, MIB);
    let mut socket = TcpStream::connect(&node.topology.nodes[0].data).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    socket.write_all(&request.encode()).unwrap();
    let mut go = [9u8; 1];
    socket.read_exact(&mut go).unwrap();
    assert_eq!(go, [0], "the push was accepted");
    let bytes = pattern(MIB as usize, 3);
    socket.write_all(&bytes[..(MIB / 2) as usize]).unwrap();
    as_node_1(&node, |mut peer| async move {
        let outcome = peer
            .abort(Ids { ids: pack(&[id]) })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(outcome.code, 0, "{}", outcome.message);
    });
    // Gone from view at once; its memory stays while the transfer writes it.
    assert!(!local.list().unwrap().iter().any(|o| o.id == id));
    assert_eq!(local.stats().unwrap().used, allocated);
    let err = local.create(id, 10, 0, 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectExists, "{err}");

    socket.write_all(&bytes[(MIB / 2) as usize..]).unwrap();
    let mut answer = [9u8; 1];
    socket.read_exact(&mut answer).unwrap();
    assert_eq!(answer, [0], "every byte went into the held memory");
    drop(socket);
    eventually(
        "the aborted object's memory freed after the transfer",
        || local.stats().unwrap().used == before,
    );

    // A transfer cut short by a restart of its sender ends the same way.
    let id = homed_at_zero();
    allocate(&node, &[id], MIB);
    let mut socket = TcpStream::connect(&node.topology.nodes[0].data).unwrap();
    socket
        .write_all(&push_request(1, &node.topology.token, id, 0, MIB).encode())
        .unwrap();
    socket.read_exact(&mut go).unwrap();
    socket.write_all(&bytes[..4096]).unwrap();
    as_node_1(&node, |mut peer| async move {
        let restarted = HeartbeatRequest {
            node: 1,
            incarnation: 222,
            ..Default::default()
        };
        peer.heartbeat(restarted).await.unwrap();
    });
    assert!(!local.list().unwrap().iter().any(|o| o.id == id));
    assert!(local.stats().unwrap().used >= before + MIB);
    drop(socket);
    eventually("memory freed once the cut transfer ends", || {
        local.stats().unwrap().used == before
    });
}

/// Three nodes, none of which maps another's memory.
fn network_cluster(name: &str) -> TestCluster {
    TestCluster::start_with(
        name,
        3,
        64 * MIB,
        Duration::ZERO,
        |topology| {
            for node in &mut topology.nodes {
                node.access = Access::Network;
            }
        },
        |_, _, _| {},
    )
}

fn read(client: &mut Client, id: ObjectId) -> Vec<u8> {
    let found = client.get(&[id], 5_000).unwrap()[0].expect("found");
    let ptr = client.located_ptr(found).unwrap();
    let len = found.location.size() as usize;
    // SAFETY: referenced by the get until the release below; bounds-checked on receipt.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec();
    client.release(&[id]).unwrap();
    bytes
}

#[test]
fn a_client_writes_an_object_for_a_network_node_in_its_own_memory() {
    let cluster = network_cluster("net-alloc");
    let mut writer = cluster.client(0);
    let mut owner = cluster.client(1);
    let mut reader = cluster.client(2);
    let size = 24 * MIB + 5; // pushed in parallel ranges
    let id = ObjectId::random();
    let spec = CreateSpec {
        id,
        data_size: size,
        meta_size: 3,
    };
    let located = writer.create_on(1, std::slice::from_ref(&spec), 0).unwrap()[0];
    assert_eq!(
        located.node, 0,
        "a staging buffer in the writer's own region"
    );
    let bytes = pattern((size + 3) as usize, 11);
    let dst = writer.located_ptr_mut(located).unwrap();
    // SAFETY: the object (data and metadata) was just allocated for us.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
    let owner_used = owner.stats().unwrap().used;
    assert!(owner_used > size, "allocated on node 1 at create");
    writer.seal(&[id], true).unwrap();
    assert!(owner.contains(id).unwrap() && !writer.contains(id).unwrap());
    assert_eq!(
        writer.stats().unwrap().objects,
        0,
        "the staging buffer went"
    );
    assert_eq!(owner.stats().unwrap().used, owner_used);
    assert_eq!(read(&mut owner, id), bytes);
    assert_eq!(read(&mut reader, id), bytes);

    // An abort frees both: the object there, the buffer here.
    let spec = CreateSpec {
        id: ObjectId::random(),
        ..spec
    };
    writer.create_on(2, std::slice::from_ref(&spec), 0).unwrap();
    let stats = |c: &mut Client| c.stats().unwrap().objects;
    assert_eq!((stats(&mut writer), stats(&mut reader)), (1, 2));
    writer.abort(spec.id).unwrap();
    assert_eq!((stats(&mut writer), stats(&mut reader)), (0, 1));

    // A node that is not in the cluster.
    let err = writer.create_on(7, &[spec], 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

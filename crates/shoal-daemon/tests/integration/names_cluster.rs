//! The cluster's namespace (issue 12: "a whole cluster's namespace from any
//! node"): three real daemons on loopback, each binding the names of the
//! objects its clients put. From any node a client resolves, lists, reads,
//! renames (a name, or a directory whose files live on several nodes) and
//! unlinks every node's names; a file rewritten through another node
//! replaces the old binding (newest wins at once, the old object is then
//! deleted where it lives); bad requests change nothing.

use std::time::Duration;

use shoal_client::Client;
use shoal_core::error::{ErrorKind, Result};
use shoal_core::ObjectId;
use shoal_testing::{eventually, TestCluster};

const MIB: u64 = 1 << 20;
const REGION_SIZE: u64 = 32 * MIB;
const NODES: u32 = 3;

fn start() -> TestCluster {
    TestCluster::start(
        "names-cluster",
        NODES,
        REGION_SIZE,
        Duration::ZERO,
        |_, _, _| {},
    )
}

/// The bytes bound to `name`, read by `client` (in place, from whichever
/// node holds them), released.
fn read_named(client: &mut Client, name: &str) -> Result<Vec<u8>> {
    let (entry, found) = client.get_named(name, 5_000)?;
    let ptr = client.located_ptr(found)?;
    // SAFETY: referenced by the get until the release below; the range was
    // bounds-checked on receipt.
    let bytes =
        unsafe { std::slice::from_raw_parts(ptr, found.location.data_size as usize) }.to_vec();
    client.release(&[entry.id])?;
    Ok(bytes)
}

fn names(client: &mut Client, prefix: &str) -> Vec<String> {
    let entries = client.list_names(prefix).unwrap();
    entries.into_iter().map(|e| e.name).collect()
}

fn put(client: &mut Client, name: &str, bytes: &[u8]) -> ObjectId {
    client.put_named(name, bytes, b"", None, 0).unwrap()
}

#[test]
fn every_node_sees_reads_renames_and_unlinks_every_nodes_names() {
    let cluster = start();
    let mut c: Vec<Client> = (0..NODES as usize).map(|n| cluster.client(n)).collect();

    // Files of one directory put through three nodes.
    let a = put(&mut c[0], "runs/7/a.bin", b"alpha from node 0");
    put(&mut c[1], "runs/7/b.bin", b"beta from node 1");
    put(&mut c[2], "runs/8/c.bin", b"gamma from node 2");
    for (n, client) in c.iter_mut().enumerate() {
        assert_eq!(
            names(client, "runs"),
            ["runs/7/a.bin", "runs/7/b.bin", "runs/8/c.bin"],
            "node {n} lists every node's names, sorted"
        );
        assert_eq!(
            read_named(client, "runs/7/a.bin").unwrap(),
            b"alpha from node 0"
        );
        assert_eq!(
            read_named(client, "runs/8/c.bin").unwrap(),
            b"gamma from node 2"
        );
        assert_eq!(client.resolve("runs/7/a.bin").unwrap().id, a);
    }

    // Rewritten through node 2: every node resolves the new object at once,
    // and node 0 (where the old one lives) deletes the old one.
    let a2 = put(&mut c[2], "runs/7/a.bin", b"alpha v2 from node 2");
    for client in c.iter_mut() {
        assert_eq!(client.resolve("runs/7/a.bin").unwrap().id, a2);
        assert_eq!(
            read_named(client, "runs/7/a.bin").unwrap(),
            b"alpha v2 from node 2"
        );
    }
    eventually("the superseded object is deleted at node 0", || {
        !c[0].contains(a).unwrap()
    });
    assert_eq!(names(&mut c[1], "runs/7"), ["runs/7/a.bin", "runs/7/b.bin"]);

    // A name bound at node 1, renamed through node 0.
    c[0].rename("runs/7/b.bin", "runs/7/b2.bin").unwrap();
    for client in c.iter_mut() {
        assert_eq!(
            read_named(client, "runs/7/b2.bin").unwrap(),
            b"beta from node 1"
        );
        let err = client.resolve("runs/7/b.bin").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
    }

    // A directory whose files live on nodes 1 and 2, renamed through node 0.
    c[0].rename("runs/7", "done/7").unwrap();
    for (n, client) in c.iter_mut().enumerate() {
        assert_eq!(
            names(client, ""),
            ["done/7/a.bin", "done/7/b2.bin", "runs/8/c.bin"],
            "node {n}"
        );
    }
    assert_eq!(
        read_named(&mut c[0], "done/7/a.bin").unwrap(),
        b"alpha v2 from node 2"
    );

    // Refused cluster-wide: a directory onto a non-empty one elsewhere, a
    // directory onto a name, unknown names; nothing changes.
    let err = c[2].rename("runs", "done").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectExists, "{err}");
    let err = c[1].rename("done/7", "runs/8/c.bin").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    for bad in ["nowhere", "done/7/zzz"] {
        assert_eq!(
            c[1].unlink(bad).unwrap_err().kind(),
            ErrorKind::ObjectNotFound
        );
        assert_eq!(
            c[1].rename(bad, "x").unwrap_err().kind(),
            ErrorKind::ObjectNotFound
        );
    }
    assert_eq!(
        c[1].resolve("../etc").unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        names(&mut c[0], ""),
        ["done/7/a.bin", "done/7/b2.bin", "runs/8/c.bin"]
    );

    // Unlinked through node 1: gone everywhere, the object too.
    let c_id = c[0].resolve("runs/8/c.bin").unwrap().id;
    c[1].unlink("runs/8/c.bin").unwrap();
    for client in c.iter_mut() {
        assert!(names(client, "runs").is_empty());
    }
    eventually("the unlinked object is deleted at node 2", || {
        !c[2].contains(c_id).unwrap()
    });
}

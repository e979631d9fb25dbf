//! Gets of other nodes' objects without a round trip (issue 14 item 6,
//! docs/fast-path.md "Gets of other nodes' objects"): real daemons on
//! loopback, a client of node 1 reading node 0's objects through node 0's
//! index, counted in a table node 0 reads before it frees memory.

use std::time::Duration;

use shoal_client::Client;
use shoal_core::ObjectId;
use shoal_testing::{eventually, TestCluster};

const MIB: u64 = 1 << 20;
const REGION_SIZE: u64 = 32 * MIB;

fn start(name: &str) -> TestCluster {
    shoal_testing::init_logs();
    TestCluster::start(name, 2, REGION_SIZE, Duration::ZERO, |_, _, _| {})
}

fn ids(n: usize) -> Vec<ObjectId> {
    (0..n).map(|_| ObjectId::random()).collect()
}

/// Puts `ids` on `client`'s node, and returns once its daemon published
/// them in its index: a fast-path seal returns before the daemon applied
/// it, and any request waits for that (a get from another node finds them
/// either way, but by a round trip until then).
fn put_all(client: &mut Client, ids: &[ObjectId], byte: u8) {
    let data = vec![byte; 1000];
    let objects: Vec<(ObjectId, &[u8], &[u8])> =
        ids.iter().map(|id| (*id, &data[..], &b""[..])).collect();
    client.put_batch(&objects, None, 0).unwrap();
    client.stats().unwrap();
}

/// Gets every id through `client`, checks each is node 0's and holds
/// `byte`, and returns the requests the get sent.
fn get_all(client: &mut Client, ids: &[ObjectId], byte: u8) -> u64 {
    let before = client.requests();
    let found = client.get(ids, 5_000).unwrap();
    let sent = client.requests() - before;
    for located in found {
        let located = located.expect("found");
        assert_eq!(located.node, 0, "read in place on its owner");
        let ptr = client.located_ptr(located).unwrap();
        // SAFETY: referenced by the get; bounds checked on receipt.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, 1000) };
        assert!(bytes.iter().all(|&b| b == byte), "the owner's bytes");
    }
    sent
}

#[test]
fn gets_of_another_nodes_objects_take_no_round_trip() {
    let cluster = start("peer-reads-rt");
    let (mut owner, mut reader) = (cluster.client(0), cluster.client(1));
    // The first get asks for the views (one request), then reads in place.
    let first = ids(10);
    put_all(&mut owner, &first, 1);
    assert!(get_all(&mut reader, &first, 1) <= 2);
    reader.release(&first).unwrap();
    for round in 0..20u8 {
        let fresh = ids(100);
        put_all(&mut owner, &fresh, round);
        let before = reader.requests();
        assert_eq!(get_all(&mut reader, &fresh, round), 0, "round {round}");
        reader.release(&fresh).unwrap();
        assert_eq!(
            get_all(&mut reader, &fresh, round),
            0,
            "again, round {round}"
        );
        reader.release(&fresh).unwrap();
        assert_eq!(reader.requests(), before, "releases are counts, no message");
    }
}

#[test]
fn an_object_a_remote_reader_holds_outlives_its_delete_until_released() {
    let cluster = start("peer-reads-keep");
    let (mut owner, mut reader) = (cluster.client(0), cluster.client(1));
    let held = ids(20);
    put_all(&mut owner, &held, 7);
    get_all(&mut reader, &held, 7);
    let pointers: Vec<*const u8> = reader
        .get(&held, 0)
        .unwrap()
        .into_iter()
        .map(|l| reader.located_ptr(l.unwrap()).unwrap())
        .collect();
    let used = owner.stats().unwrap().used;
    for result in owner.delete(&held).unwrap() {
        result.unwrap();
    }
    // Deleted, but node 1's client still reads them: the memory stays,
    // and what is put now goes elsewhere.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        owner.stats().unwrap().used,
        used,
        "kept for the remote reader"
    );
    let fresh = ids(20);
    put_all(&mut owner, &fresh, 9);
    for ptr in &pointers {
        // SAFETY: still referenced (twice) by this client.
        let bytes = unsafe { std::slice::from_raw_parts(*ptr, 1000) };
        assert!(bytes.iter().all(|&b| b == 7), "intact while held");
    }
    reader.release(&held).unwrap();
    reader.release(&held).unwrap();
    eventually("the deleted objects' memory is freed", || {
        owner.stats().unwrap().used <= used - 20 * 1000 + 20 * 1024
    });
    assert_eq!(get_all(&mut reader, &fresh, 9), 0);
}

#[test]
fn a_remote_reader_that_leaves_holds_nothing_at_the_owner() {
    let cluster = start("peer-reads-leave");
    let mut owner = cluster.client(0);
    let held = ids(50);
    put_all(&mut owner, &held, 3);
    {
        let mut reader = cluster.client(1);
        get_all(&mut reader, &held, 3);
        // Gone without releasing (as a killed process would).
    }
    for result in owner.delete(&held).unwrap() {
        result.unwrap();
    }
    eventually("a departed reader's references are dropped", || {
        owner.stats().unwrap().used == 0
    });
}

//! The elastic capacity controller on a cluster node (issue 11, item 5):
//! node 0 owns objects and shrinks (its node's memory is a file-backed fake
//! /proc/meminfo, so the test decides when), while node 1's client holds
//! some of them and has read others (node 1 keeps idle loans on those).
//! The shrink takes the idle loans back, never evicts an object in use
//! (node 1 still reads its bytes through its mapping), and every object of
//! the shrunk owner stays gettable from node 1 with its exact bytes
//! (restored from the owner's burst buffer).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shoal_client::{Client, Durability};
use shoal_core::protocol::CapacityReport;
use shoal_core::ObjectId;
use shoal_daemon::elastic::{ElasticConfig, SourceChoice};
use shoal_daemon::tiers::TierConfig;
use shoal_testing::TestCluster;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const REGION_SIZE: u64 = 64 * MIB;
/// The owner never shrinks below this (U_min): room to restore an object
/// a peer asks for while the node is under pressure.
const FLOOR: u64 = 8 * MIB;
const OBJECT: usize = MIB as usize - 64;

/// Two nodes; node 0 is elastic with a burst buffer, node 1 static. The
/// meminfo node 0's controller reads is the returned file.
fn start() -> (TestCluster, PathBuf) {
    shoal_testing::init_logs();
    // Long linger: node 1's loans stay idle (not given back on their own)
    // until the owner's shrink asks for them.
    let cluster = TestCluster::start(
        "elastic-cluster",
        2,
        REGION_SIZE,
        Duration::from_secs(120),
        |node, config, dir| {
            if node != 0 {
                return;
            }
            let meminfo = dir.join("meminfo");
            write_meminfo(&meminfo, GIB, 300 * MIB);
            let mut tiers = TierConfig::new();
            tiers.burst = Some((dir.join("burst0"), 16 * REGION_SIZE));
            config.tiers = Some(tiers);
            let mut elastic = ElasticConfig::default();
            elastic.controller.interval = Duration::from_millis(20);
            elastic.controller.max_fraction = 1.0;
            elastic.controller.min_capacity = FLOOR;
            elastic.source = SourceChoice::Files {
                meminfo,
                pressure: None,
            };
            config.elastic = Some(elastic);
        },
    );
    let meminfo = cluster.dir.path().join("meminfo");
    (cluster, meminfo)
}

/// A /proc/meminfo of `total` bytes with `used` in use, written aside and
/// renamed: the daemon never reads half a file.
fn write_meminfo(path: &Path, total: u64, used: u64) {
    let text = format!(
        "MemTotal:       {} kB\nMemFree:        0 kB\nMemAvailable:   {} kB\n",
        total / 1024,
        total.saturating_sub(used) / 1024
    );
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Bytes that differ per object and per offset.
fn pattern(id: &ObjectId) -> Vec<u8> {
    let seed = id.as_bytes()[0] as usize * 31 + id.as_bytes()[1] as usize;
    (0..OBJECT).map(|i| ((i * 7 + seed) % 251) as u8).collect()
}

/// A get (by node 1's client: the owner restores it if it is on its tier,
/// node 1 reads it through its mapping of the owner's region), copied out,
/// released.
fn read(client: &mut Client, id: ObjectId) -> Vec<u8> {
    let found = client.get(&[id], 10_000).unwrap()[0].unwrap_or_else(|| panic!("{id} gone"));
    let bytes = held_bytes(client, found);
    client.release(&[id]).unwrap();
    bytes
}

fn held_bytes(client: &mut Client, found: shoal_core::protocol::Located) -> Vec<u8> {
    let ptr = client.located_ptr(found).unwrap();
    // SAFETY: the caller holds a reference to the object (a get not yet
    // released); the range was bounds-checked on receipt.
    unsafe { std::slice::from_raw_parts(ptr, found.location.data_size as usize) }.to_vec()
}

/// The owner's references on `id` (its clients' and its peers').
fn refs(owner: &mut Client, id: ObjectId) -> u32 {
    owner
        .list()
        .unwrap()
        .iter()
        .find(|o| o.id == id)
        .map_or(0, |o| o.refs)
}

fn wait_for(
    client: &mut Client,
    within: Duration,
    what: &str,
    done: impl Fn(&CapacityReport) -> bool,
) -> (CapacityReport, Duration) {
    let started = Instant::now();
    loop {
        let report = client.capacity(None).unwrap();
        if done(&report) {
            return (report, started.elapsed());
        }
        assert!(
            started.elapsed() < within,
            "{what} not reached within {within:?}: {report:#?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_shrinking_owner_takes_idle_loans_back_keeps_objects_in_use_and_peers_still_get_everything() {
    let (cluster, meminfo) = start();
    // Node 1's client gets through its daemon, so its reads leave idle loans
    // (a fast-path client reads node 0's index and holds no loan).
    let mut owner = cluster.client(0);
    let mut peer = shoal_client::Client::connect_socket_only(&cluster.sockets[1]).unwrap();
    let (calm, _) = wait_for(&mut owner, Duration::from_secs(5), "steps", |r| {
        r.steps >= 3
    });
    assert!(calm.enabled && calm.target == REGION_SIZE, "{calm:?}");

    // 40 objects on the owner: even ones only in memory (a shrink spills
    // them), odd ones already durable on its burst buffer.
    let ids: Vec<ObjectId> = (0..40).map(|_| ObjectId::random()).collect();
    for (i, id) in ids.iter().enumerate() {
        let bytes = pattern(id);
        if i % 2 == 0 {
            owner.put(*id, &bytes, b"m").unwrap();
        } else {
            let at = owner.create(*id, bytes.len() as u64, 1, 0).unwrap();
            owner.write(at, &bytes, b"d").unwrap();
            owner
                .seal_durable(&[*id], true, Some(Durability::Local))
                .unwrap();
        }
    }
    // Node 1 holds two objects through the shrink, and has read ten more:
    // its daemon keeps idle loans (owner references) on those.
    let in_use = [ids[0], ids[1]];
    let held: Vec<_> = peer
        .get(&in_use, 5_000)
        .unwrap()
        .into_iter()
        .map(|f| f.expect("held object found"))
        .collect();
    let loaned = &ids[2..12];
    for id in loaned {
        assert_eq!(read(&mut peer, *id), pattern(id), "{id} before the shrink");
    }
    for id in loaned.iter().chain(&in_use) {
        assert!(refs(&mut owner, *id) >= 1, "node 1 holds a loan on {id}");
    }

    // The node's memory jumps to 99 %: the owner shrinks to its floor.
    write_meminfo(&meminfo, GIB, GIB * 99 / 100);
    let (shrunk, reaction) = wait_for(
        &mut owner,
        Duration::from_secs(10),
        "the owner down to its floor",
        |r| r.target == FLOOR && r.used <= FLOOR && r.resident <= FLOOR + 4 * MIB,
    );
    eprintln!("shrunk in {reaction:?}: {shrunk:#?}");
    assert!(!shrunk.over_target, "2 MiB in use fit the floor");
    let listed = owner.list().unwrap();
    assert_eq!(listed.len(), ids.len(), "nothing lost");
    for id in loaned {
        assert_eq!(refs(&mut owner, *id), 0, "the idle loan on {id} taken back");
    }
    for id in &in_use {
        let row = listed.iter().find(|o| o.id == *id).unwrap();
        assert!(row.resident && row.refs >= 1, "{id} in use stays: {row:?}");
    }
    // What node 1 holds is still there, byte for byte (no page of it was
    // given back to the kernel).
    for (id, found) in in_use.iter().zip(&held) {
        assert_eq!(held_bytes(&mut peer, *found), pattern(id), "{id} held");
    }

    // Shrunk, the owner still serves every object to node 1: each is
    // restored from its burst buffer into the floor's room.
    let restores = owner.tiers().unwrap().restores;
    for id in &ids[2..] {
        assert_eq!(read(&mut peer, *id), pattern(id), "{id} while shrunk");
    }
    assert!(
        owner.tiers().unwrap().restores >= restores + 20,
        "objects came back from the owner's burst buffer"
    );
    let during = owner.capacity(None).unwrap();
    assert!(during.target == FLOOR && during.used <= FLOOR, "{during:?}");

    // The burst ends: the owner grows back and everything still reads.
    write_meminfo(&meminfo, GIB, 300 * MIB);
    wait_for(
        &mut owner,
        Duration::from_secs(5),
        "the owner grown back",
        |r| r.target == REGION_SIZE && r.capacity == REGION_SIZE,
    );
    peer.release(&in_use).unwrap();
    for id in &ids {
        assert_eq!(read(&mut peer, *id), pattern(id), "{id} after the burst");
        assert_eq!(read(&mut owner, *id), pattern(id), "{id} on the owner");
    }
}

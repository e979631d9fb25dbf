//! The tiers below memory, end to end through a real daemon and real
//! clients: eviction goes down a tier and gets restore, durability levels
//! hold across restarts, deletes are final, corrupt copies are refused,
//! full tiers are typed errors that lose nothing, and a tier of another
//! node is refused at start.

use std::path::Path;
use std::time::{Duration, Instant};

use shoal_client::{Client, Durability, WAIT_FOREVER};
use shoal_core::error::{ErrorKind, Result};
use shoal_core::ObjectId;
use shoal_daemon::tiers::{Backing, TierConfig};
use shoal_daemon::DaemonConfig;
use shoal_testing::TestDaemon;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

fn config(dir: &Path, capacity: u64, tiers: TierConfig) -> DaemonConfig {
    let mut config = TestDaemon::config(dir, capacity);
    config.tiers = Some(tiers);
    config
}

fn tiers(dir: &Path, burst: Option<u64>, backing: bool) -> TierConfig {
    let mut t = TierConfig::new();
    t.burst = burst.map(|cap| (dir.join("burst"), cap));
    if backing {
        t.backing = Some(Backing::Dir {
            path: dir.join("backing"),
            capacity: u64::MAX,
        });
    }
    t
}

/// Bytes that differ per object and per offset.
fn pattern(id: &ObjectId, len: usize) -> Vec<u8> {
    let seed = id.as_bytes()[0] as usize * 31 + id.as_bytes()[1] as usize;
    (0..len).map(|i| ((i * 7 + seed) % 251) as u8).collect()
}

fn read(client: &mut Client, id: ObjectId) -> Result<Vec<u8>> {
    let found = client.get(&[id], 0)?[0].ok_or_else(|| shoal_core::ShoalError::not_found(&id))?;
    // SAFETY: referenced until the release below.
    let bytes = unsafe { client.data(found.location) }.to_vec();
    client.release(&[id])?;
    Ok(bytes)
}

/// Files holding images on a directory tier: one per large object under
/// `objects/`, plus the segments small ones are packed into.
fn tier_files(root: &Path) -> usize {
    let count = |dir: std::path::PathBuf| std::fs::read_dir(dir).map_or(0, |d| d.count());
    let fans = std::fs::read_dir(root.join("objects"))
        .map_or(0, |fans| fans.map(|fan| count(fan.unwrap().path())).sum());
    fans + count(root.join("segments"))
}

#[test]
fn eviction_goes_down_a_tier_and_a_get_brings_it_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start_with(config(
        dir.path(),
        MIB,
        tiers(dir.path(), Some(64 * MIB), true),
    ));
    let mut client = daemon.client();
    // 3 MiB of objects through 1 MiB of memory.
    let ids: Vec<ObjectId> = (0..48).map(|_| ObjectId::random()).collect();
    for id in &ids {
        client
            .put(*id, &pattern(id, 64 * KIB as usize), b"m")
            .unwrap();
    }
    let stats = client.stats().unwrap();
    assert!(stats.evictions > 0, "memory is a third of the data");
    for id in &ids {
        assert!(client.contains(*id).unwrap(), "{id} left memory but exists");
    }
    let listed = client.list().unwrap();
    assert_eq!(listed.len(), ids.len());
    assert!(listed.iter().any(|o| !o.resident && o.tiers != 0));
    // Every object reads back exactly, the evicted ones restored.
    for id in ids.iter().rev() {
        assert_eq!(
            read(&mut client, *id).unwrap(),
            pattern(id, 64 * KIB as usize)
        );
    }
    let report = client.tiers().unwrap();
    assert!(
        report.restores > 0 && report.restored_bytes > 0,
        "{report:?}"
    );
    assert!(report.spilled_bytes + report.drained_bytes > 0);
    // Creating an id that only a tier holds is refused: at create through
    // the socket, at the seal in lent space (the client cannot see tiers).
    let evicted = client
        .list()
        .unwrap()
        .into_iter()
        .find(|o| !o.resident)
        .expect("some object is on a tier only");
    let mut socket_only = daemon.socket_client();
    let err = socket_only.create(evicted.id, 10, 0, 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectExists);
    let refused = match client.create(evicted.id, 10, 0, 0) {
        Err(err) => err,
        Ok(_) => client.seal(&[evicted.id], true).unwrap_err(),
    };
    assert_eq!(refused.kind(), ErrorKind::ObjectExists);
    assert_eq!(
        read(&mut socket_only, evicted.id).unwrap(),
        pattern(&evicted.id, 64 * KIB as usize)
    );
}

/// Two passes over about twice as many objects as memory holds, each object
/// cooled once read: the second pass finds in memory what the first left
/// there, so each pass restores only what memory cannot hold. Without the
/// cool, LRU evicts every object just before the scan comes back to it: 64
/// restores for the two passes.
#[test]
fn a_scan_that_cools_what_it_read_restores_only_what_memory_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = over_a_burst_buffer(dir.path(), MIB);
    let mut client = daemon.client();
    let len = 64 * KIB as usize;
    let ids: Vec<ObjectId> = (0..32).map(|_| ObjectId::random()).collect();
    for id in &ids {
        client.put(*id, &pattern(id, len), b"m").unwrap();
    }
    let on_tier = client.list().unwrap().into_iter().find(|o| !o.resident);
    let on_tier = on_tier.expect("memory holds half of the objects").id;
    // Cooling is for objects in memory: typed refusals, nothing changed.
    for absent in [ObjectId::random(), on_tier] {
        let refused = client.cool(&[absent]).unwrap();
        assert_eq!(
            refused[0].as_ref().unwrap_err().kind(),
            ErrorKind::ObjectNotFound
        );
    }
    let before = client.tiers().unwrap().restores;
    for pass in 0..2 {
        for id in &ids {
            assert_eq!(
                read(&mut client, *id).unwrap(),
                pattern(id, len),
                "pass {pass}"
            );
            client.cool(&[*id]).unwrap()[0].as_ref().unwrap();
        }
    }
    let restores = client.tiers().unwrap().restores - before;
    // Memory holds 15 of the 32: each pass restores the other 17, and one
    // more where the pass's first restore took the oldest object of the
    // previous pass before any was cooled (36 here; a little room for a
    // drain still holding a victim).
    assert!(restores <= 40, "{restores} restores in two passes");
}

#[test]
fn a_local_seal_survives_a_restart_and_a_memory_one_does_only_once_drained() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || config(dir.path(), 4 * MIB, tiers(dir.path(), Some(64 * MIB), true));
    let daemon = TestDaemon::start_with(cfg());
    let mut client = daemon.client();
    let durable = ObjectId::random();
    let location = client.create(durable, 100 * KIB, 3, 0).unwrap();
    client
        .write(location, &pattern(&durable, 100 * KIB as usize), b"abc")
        .unwrap();
    client
        .seal_durable(&[durable], true, Some(Durability::Local))
        .unwrap();
    let drained = ObjectId::random();
    client.put(drained, &pattern(&drained, 5000), b"").unwrap();
    let waited = client
        .wait_durable(&[drained], Durability::Backing, 10_000)
        .unwrap();
    assert!(waited[0].is_ok(), "{waited:?}");
    // Unknown ids are not waited for.
    let unknown = client
        .wait_durable(&[ObjectId::random()], Durability::Local, 1000)
        .unwrap();
    assert_eq!(
        unknown[0].as_ref().unwrap_err().kind(),
        ErrorKind::ObjectNotFound
    );
    drop(client);
    daemon.stop();

    let daemon = TestDaemon::start_with(cfg());
    let mut client = daemon.client();
    let mut expected = pattern(&durable, 100 * KIB as usize);
    expected.extend_from_slice(b"abc");
    let found = client.get(&[durable], 0).unwrap()[0].unwrap();
    assert_eq!(found.location.meta_size, 3);
    // SAFETY: referenced until released below.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            client.data_ptr(found.location),
            found.location.size() as usize,
        )
    }
    .to_vec();
    client.release(&[durable]).unwrap();
    assert_eq!(bytes, expected);
    assert_eq!(read(&mut client, drained).unwrap(), pattern(&drained, 5000));
}

#[test]
fn a_durability_the_node_cannot_give_is_refused_before_sealing() {
    let dir = tempfile::tempdir().unwrap();
    let daemon =
        TestDaemon::start_with(config(dir.path(), MIB, tiers(dir.path(), Some(MIB), false)));
    let mut client = daemon.client();
    let id = ObjectId::random();
    client.create(id, 10, 0, 0).unwrap();
    let err = client
        .seal_durable(&[id], true, Some(Durability::Backing))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    // Still unsealed: sealing at a level it has works.
    client
        .seal_durable(&[id], true, Some(Durability::Local))
        .unwrap();
    let err = client
        .wait_durable(&[id], Durability::Backing, 100)
        .unwrap();
    assert_eq!(
        err[0].as_ref().unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn deletes_are_final_on_every_tier_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || config(dir.path(), 4 * MIB, tiers(dir.path(), Some(64 * MIB), true));
    let daemon = TestDaemon::start_with(cfg());
    let mut client = daemon.client();
    let ids: Vec<ObjectId> = (0..6).map(|_| ObjectId::random()).collect();
    for id in &ids {
        client.put(*id, &pattern(id, 20_000), b"").unwrap();
    }
    let waited = client
        .wait_durable(&ids, Durability::Backing, 10_000)
        .unwrap();
    assert!(waited.iter().all(Result::is_ok), "{waited:?}");
    // Half leave memory (on tiers only), then everything is deleted.
    let out = client.stage_out(&ids[..3]).unwrap();
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    assert!(
        client
            .list()
            .unwrap()
            .iter()
            .filter(|o| !o.resident)
            .count()
            == 3
    );
    let deleted = client.delete(&ids).unwrap();
    assert!(deleted.iter().all(Result::is_ok), "{deleted:?}");
    for id in &ids {
        assert!(!client.contains(*id).unwrap());
    }
    drop(client);
    daemon.stop();
    let daemon = TestDaemon::start_with(cfg());
    let mut client = daemon.client();
    for id in &ids {
        assert!(!client.contains(*id).unwrap(), "{id} came back");
    }
    assert_eq!(
        tier_files(&dir.path().join("burst")),
        0,
        "burst space reclaimed"
    );
    assert_eq!(
        tier_files(&dir.path().join("backing")),
        0,
        "backing space reclaimed"
    );
    // The ids are free again.
    client.put(ids[0], b"new", b"").unwrap();
    assert_eq!(read(&mut client, ids[0]).unwrap(), b"new");
}

#[test]
fn a_corrupt_copy_is_never_served_and_the_next_copy_is() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start_with(config(
        dir.path(),
        4 * MIB,
        tiers(dir.path(), Some(64 * MIB), true),
    ));
    let mut client = daemon.client();
    let both = ObjectId::random();
    client.put(both, &pattern(&both, 50_000), b"").unwrap();
    assert!(client
        .wait_durable(&[both], Durability::Backing, 10_000)
        .unwrap()[0]
        .is_ok());
    assert!(client.stage_out(&[both]).unwrap()[0].is_ok());
    // Flips a bit 100 bytes before the end of the image of `id` (50,000
    // bytes of payload after a 64-byte header), in its segment.
    let flip = |root: &Path, id: &ObjectId| {
        for seg in std::fs::read_dir(root.join("segments")).unwrap() {
            let path = seg.unwrap().path();
            let mut bytes = std::fs::read(&path).unwrap();
            // The header holds the id at bytes 12..32 (before the index does).
            if let Some(at) = bytes.windows(20).position(|w| w == id.as_bytes()) {
                let end = at - 12 + 64 + 50_000;
                bytes[end - 100] ^= 0x40;
                std::fs::write(&path, bytes).unwrap();
                return;
            }
        }
        panic!("no image of {id} under {}", root.display());
    };
    // The burst copy is damaged: the backing copy is served.
    flip(&dir.path().join("burst"), &both);
    assert_eq!(read(&mut client, both).unwrap(), pattern(&both, 50_000));
    // Both copies damaged: a typed error, never the bytes.
    let only = ObjectId::random();
    client.put(only, &pattern(&only, 50_000), b"").unwrap();
    assert!(client
        .wait_durable(&[only], Durability::Backing, 10_000)
        .unwrap()[0]
        .is_ok());
    assert!(client.stage_out(&[only]).unwrap()[0].is_ok());
    flip(&dir.path().join("burst"), &only);
    flip(&dir.path().join("backing"), &only);
    let err = client.get(&[only], 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectCorrupt);
    assert!(!client.contains(only).unwrap(), "a lost object is gone");
    // Nothing else was disturbed.
    assert_eq!(read(&mut client, both).unwrap(), pattern(&both, 50_000));
}

#[test]
fn with_every_tier_full_puts_fail_typed_and_nothing_acknowledged_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    // 1 MiB of memory over a 1 MiB burst buffer, no backing store.
    let daemon =
        TestDaemon::start_with(config(dir.path(), MIB, tiers(dir.path(), Some(MIB), false)));
    let mut client = daemon.client();
    let mut stored = Vec::new();
    let mut refused = None;
    for _ in 0..64 {
        let id = ObjectId::random();
        match client.create(id, 64 * KIB, 0, 0) {
            Ok(location) => {
                client
                    .write(location, &pattern(&id, 64 * KIB as usize), b"")
                    .unwrap();
                client.seal(&[id], true).unwrap();
                stored.push(id);
            }
            Err(err) => {
                refused = Some(err);
                break;
            }
        }
    }
    let err = refused.expect("2 MiB of space in all cannot take 4 MiB");
    assert_eq!(err.kind(), ErrorKind::StoreFull, "{err}");
    assert!(
        stored.len() > 16,
        "memory and burst buffer both used: {}",
        stored.len()
    );
    let report = client.tiers().unwrap();
    assert!(
        report.failures > 0,
        "the full tier was reported: {report:?}"
    );
    // Nothing acknowledged is lost: what is in memory reads back, and once it
    // is deleted (room in memory again) so does what went to the burst buffer.
    for id in &stored {
        assert!(client.contains(*id).unwrap(), "{id} lost");
    }
    let resident: Vec<ObjectId> = client
        .list()
        .unwrap()
        .into_iter()
        .filter(|o| o.resident)
        .map(|o| o.id)
        .collect();
    for id in &resident {
        assert_eq!(
            read(&mut client, *id).unwrap(),
            pattern(id, 64 * KIB as usize)
        );
    }
    assert!(client.delete(&resident).unwrap().iter().all(Result::is_ok));
    for id in stored.iter().filter(|id| !resident.contains(id)) {
        assert_eq!(
            read(&mut client, *id).unwrap(),
            pattern(id, 64 * KIB as usize)
        );
    }
}

#[test]
fn concurrent_gets_of_an_evicted_object_share_one_restore() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start_with(config(
        dir.path(),
        8 * MIB,
        tiers(dir.path(), Some(64 * MIB), false),
    ));
    let mut client = daemon.client();
    let id = ObjectId::random();
    client
        .put(id, &pattern(&id, 4 * MIB as usize), b"")
        .unwrap();
    assert!(client.stage_out(&[id]).unwrap()[0].is_ok());
    assert!(!client.list().unwrap()[0].resident);
    let socket = daemon.socket().to_path_buf();
    let readers: Vec<_> = (0..6)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket).unwrap();
                let found = c.get(&[id], WAIT_FOREVER).unwrap()[0].unwrap();
                // SAFETY: referenced until released.
                let sum: u64 = unsafe { c.data(found.location) }
                    .iter()
                    .map(|b| u64::from(*b))
                    .sum();
                c.release(&[id]).unwrap();
                sum
            })
        })
        .collect();
    let sums: Vec<u64> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let expected: u64 = pattern(&id, 4 * MIB as usize)
        .iter()
        .map(|b| u64::from(*b))
        .sum();
    assert!(sums.iter().all(|s| *s == expected));
    assert_eq!(client.tiers().unwrap().restores, 1);
}

/// Puts `len` bytes under a new id and writes them down to the burst
/// buffer, leaving memory: the id is held on the tier only.
fn put_on_tier_only(client: &mut Client, len: usize) -> ObjectId {
    let id = ObjectId::random();
    client.put(id, &pattern(&id, len), b"").unwrap();
    assert!(client.stage_out(&[id]).unwrap()[0].is_ok());
    id
}

/// Puts `len` bytes under a new id with a copy below (so nothing waits on
/// its drain) and keeps a reference to it.
fn put_referenced(client: &mut Client, len: usize) -> ObjectId {
    let id = ObjectId::random();
    client.put(id, &pattern(&id, len), b"").unwrap();
    let durable = client
        .wait_durable(&[id], Durability::Local, 10_000)
        .unwrap();
    assert!(durable[0].is_ok(), "{durable:?}");
    assert!(client.get(&[id], 0).unwrap()[0].is_some());
    id
}

/// A daemon of `capacity` bytes of memory above a 64 MiB burst buffer.
fn over_a_burst_buffer(dir: &Path, capacity: u64) -> TestDaemon {
    TestDaemon::start_with(config(dir, capacity, tiers(dir, Some(64 * MIB), false)))
}

#[test]
fn a_get_that_does_not_wait_fails_typed_at_once_when_memory_is_all_referenced() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = over_a_burst_buffer(dir.path(), 8 * MIB);
    let mut client = daemon.client();
    let below = put_on_tier_only(&mut client, 3 * MIB as usize);
    let held = put_referenced(&mut client, 4 * MIB as usize);
    let filler = put_referenced(&mut client, 3 * MIB as usize + 512 * KIB as usize);
    // No room, nothing evictable: the get's own wait bounds the restore's
    // wait for room (it waited the daemon's 30 s whatever the get asked).
    let started = Instant::now();
    let err = client.get(&[below], 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreFull, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let started = Instant::now();
    let err = client.get(&[below], 500).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreFull, "{err}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    // Nothing was lost: once there is room the object reads back exactly.
    assert!(client.contains(below).unwrap());
    client.release(&[filler]).unwrap();
    assert_eq!(
        read(&mut client, below).unwrap(),
        pattern(&below, 3 * MIB as usize)
    );
    client.release(&[held]).unwrap();
    assert_eq!(client.stats().unwrap().referenced, 0);
}

#[test]
fn a_create_into_memory_all_referenced_does_not_wait_for_drains() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = over_a_burst_buffer(dir.path(), 32 * MIB);
    let mut client = daemon.client();
    // Memory full of objects the client holds, their write-behind in flight:
    // the drains' pins end without making room, so a create that does not
    // wait fails at once (it waited 30 s for the drains).
    let held: Vec<ObjectId> = (0..31)
        .map(|_| {
            let id = ObjectId::random();
            client.put(id, &pattern(&id, MIB as usize), b"").unwrap();
            assert!(client.get(&[id], 0).unwrap()[0].is_some());
            id
        })
        .collect();
    let started = Instant::now();
    let err = client
        .create(ObjectId::random(), 2 * MIB, 0, 0)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreFull, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    client.release(&held).unwrap();
    let id = ObjectId::random();
    client
        .put(id, &pattern(&id, 2 * MIB as usize), b"")
        .unwrap();
}

#[test]
fn a_restored_object_stays_in_memory_until_its_get_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = over_a_burst_buffer(dir.path(), 8 * MIB);
    let mut client = daemon.client();
    // Memory holds a referenced object and room for one of two others, so
    // each restore evicts the other's object: a restore's allocation must
    // not evict an object another restore just sealed for its get.
    let len = 3 * MIB as usize;
    let objects = [
        put_on_tier_only(&mut client, len),
        put_on_tier_only(&mut client, len),
    ];
    let held = put_referenced(&mut client, 4 * MIB as usize);
    let socket = daemon.socket().to_path_buf();
    let readers: Vec<_> = objects
        .iter()
        .map(|&id| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket).unwrap();
                let expected = pattern(&id, len);
                let (mut reads, mut full) = (0, 0);
                while reads < 40 {
                    // A get that does not wait: the object exists, so the
                    // answer is the object, or StoreFull while the other
                    // reader holds the room — never "not found".
                    match c.get(&[id], 0) {
                        Ok(found) => {
                            let found = found[0].unwrap_or_else(|| {
                                panic!("{id} answered not found after {reads} reads")
                            });
                            // SAFETY: referenced until the release below.
                            let bytes = unsafe { c.data(found.location) };
                            assert!(bytes == expected.as_slice(), "{id} read back wrong");
                            c.release(&[id]).unwrap();
                            reads += 1;
                        }
                        Err(err) if err.kind() == ErrorKind::StoreFull => {
                            full += 1;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err(err) => panic!("{id}: {err}"),
                    }
                }
                full
            })
        })
        .collect();
    for reader in readers {
        reader.join().unwrap();
    }
    // Every restore's hold went: nothing but `held` is referenced, and both
    // objects can leave memory again.
    client.release(&[held]).unwrap();
    assert_eq!(client.stats().unwrap().referenced, 0);
    for outcome in client.stage_out(&objects).unwrap() {
        outcome.unwrap();
    }
}

#[test]
fn a_tier_of_another_node_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    shoal_tiers::DirTier::open(
        &dir.path().join("burst"),
        &shoal_tiers::TierIdentity::new("elsewhere", 3),
        MIB,
    )
    .unwrap();
    let err = TestDaemon::try_start(config(dir.path(), MIB, tiers(dir.path(), Some(MIB), false)))
        .err()
        .expect("refused");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("elsewhere"), "{err}");
}

#[test]
fn the_tiers_are_in_the_metrics() {
    use shoal_daemon::metrics::exposition;
    use std::io::{Read, Write};

    let dir = tempfile::tempdir().unwrap();
    let port = shoal_testing::free_ports(1)[0];
    let http = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut cfg = config(dir.path(), 4 * MIB, tiers(dir.path(), Some(64 * MIB), true));
    cfg.metrics = Some(http);
    let daemon = TestDaemon::start_with(cfg);
    let mut client = daemon.client();
    let ids: Vec<ObjectId> = (0..4).map(|_| ObjectId::random()).collect();
    for id in &ids {
        client.put(*id, &pattern(id, 100_000), b"").unwrap();
    }
    assert!(client
        .wait_durable(&ids, Durability::Backing, 10_000)
        .unwrap()
        .iter()
        .all(Result::is_ok));
    assert!(client
        .stage_out(&ids[..2])
        .unwrap()
        .iter()
        .all(Result::is_ok));
    read(&mut client, ids[0]).unwrap();
    let scrape = || {
        let mut stream = std::net::TcpStream::connect(http).unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        exposition::parse(answer.split_once("\r\n\r\n").unwrap().1)
    };
    let value = |samples: &[exposition::Sample], name: &str, tier: Option<&str>| {
        samples
            .iter()
            .find(|s| s.name == name && tier.is_none_or(|t| s.label("tier") == Some(t)))
            .map(|s| s.value)
    };
    // Published once a second.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let samples = scrape();
        if value(&samples, "shoal_restores_total", None) == Some(1.0) {
            assert_eq!(
                value(&samples, "shoal_tier_objects", Some("backing")),
                Some(4.0)
            );
            assert_eq!(value(&samples, "shoal_durable_objects", None), Some(4.0));
            assert!(value(&samples, "shoal_drained_bytes_total", None).unwrap() >= 400_000.0);
            assert_eq!(
                value(&samples, "shoal_restored_bytes_total", None),
                Some(100_000.0)
            );
            assert!(value(&samples, "shoal_tier_used_bytes", Some("burst")).unwrap() > 0.0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tier metrics never showed the restore"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls `done` on the tiers' report for up to `within`; the last report.
fn report_until(
    client: &mut Client,
    within: Duration,
    done: impl Fn(&shoal_core::protocol::TierReport) -> bool,
) -> shoal_core::protocol::TierReport {
    let deadline = Instant::now() + within;
    loop {
        let report = client.tiers().unwrap();
        if done(&report) || Instant::now() >= deadline {
            return report;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A daemon of 16 MiB over a 64 MiB burst buffer (and a backing directory
/// with `backing`), its write-behind set by `write_behind`; its directory.
fn write_behind_daemon(
    backing: bool,
    write_behind: impl FnOnce(&mut TierConfig),
) -> (tempfile::TempDir, TestDaemon) {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tiers(dir.path(), Some(64 * MIB), backing);
    write_behind(&mut t);
    let daemon = TestDaemon::start_with(config(dir.path(), 16 * MIB, t));
    (dir, daemon)
}

/// `count` objects of `len` bytes (`pattern`), put in order; their ids.
fn put_patterns(client: &mut Client, count: usize, len: usize) -> Vec<ObjectId> {
    let ids: Vec<ObjectId> = (0..count).map(|_| ObjectId::random()).collect();
    for id in &ids {
        client.put(*id, &pattern(id, len), b"").unwrap();
    }
    ids
}

#[test]
fn write_behind_waits_its_delay_and_never_writes_what_was_deleted_within_it() {
    let (_dir, daemon) =
        write_behind_daemon(false, |t| t.drain_after = Duration::from_millis(1500));
    let mut client = daemon.client();
    let len = 256 * KIB as usize;
    let sealed = Instant::now();
    let ids = put_patterns(&mut client, 8, len);
    // Half of them live shorter than the delay: never written.
    for result in client.delete(&ids[..4]).unwrap() {
        result.unwrap();
    }
    let report = report_until(&mut client, Duration::from_secs(10), |r| {
        r.drained_bytes >= 4 * len as u64
    });
    let waited = sealed.elapsed();
    assert!(
        waited >= Duration::from_millis(1400),
        "written after {waited:?}"
    );
    assert_eq!(report.drained_bytes, 4 * len as u64, "{report:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(client.tiers().unwrap().drained_bytes, 4 * len as u64);
    for id in &ids[4..] {
        assert!(client.wait_durable(&[*id], Durability::Local, 0).unwrap()[0].is_ok());
    }
    // Evicted after the delay: restored exactly from the burst buffer.
    let listed = client.list().unwrap();
    assert!(listed.iter().all(|o| o.tiers != 0), "{listed:?}");
    for id in &ids[4..] {
        assert_eq!(read(&mut client, *id).unwrap(), pattern(id, len));
    }
}

#[test]
fn dirty_objects_beyond_their_share_are_written_at_once_oldest_first() {
    let (_dir, daemon) = write_behind_daemon(false, |t| {
        // Nothing would be written for a minute by age alone.
        t.drain_after = Duration::from_secs(60);
        t.dirty_percent = 25;
    });
    let mut client = daemon.client();
    let len = 256 * KIB as usize;
    // 6 MiB sealed against a 4 MiB share: the oldest 2 MiB go down.
    let ids = put_patterns(&mut client, 24, len);
    let share = 16 * MIB / 100 * 25;
    let over = 24 * len as u64 - share;
    let report = report_until(&mut client, Duration::from_secs(10), |r| {
        r.drained_bytes >= over
    });
    assert!(report.drained_bytes >= over, "{report:?}");
    std::thread::sleep(Duration::from_millis(500));
    let drained = client.tiers().unwrap().drained_bytes;
    assert!(
        drained < over + 2 * len as u64,
        "{drained} bytes written, {over} past the share"
    );
    let below: std::collections::HashSet<ObjectId> = client
        .list()
        .unwrap()
        .into_iter()
        .filter(|o| o.tiers != 0)
        .map(|o| o.id)
        .collect();
    let written = (drained / len as u64) as usize;
    assert_eq!(
        ids.iter()
            .take(written)
            .filter(|id| below.contains(id))
            .count(),
        written,
        "the oldest are written first"
    );
    // A store filling past memory still evicts every dirty object down.
    let more = put_patterns(&mut client, 48, len);
    for id in ids.iter().chain(&more) {
        assert_eq!(read(&mut client, *id).unwrap(), pattern(id, len));
    }
}

#[test]
fn write_behind_delays_only_what_memory_alone_holds() {
    use shoal_tiers::{TierLevel, TierSet};

    let (_dir, daemon) = write_behind_daemon(true, |t| t.drain_after = Duration::from_millis(1500));
    let mut client = daemon.client();
    let ids = put_patterns(&mut client, 4, 100_000);
    let all_on = |client: &mut Client, level: TierLevel| {
        let bit = TierSet::of(level).bits();
        let listed = client.list().unwrap();
        ids.iter()
            .all(|id| listed.iter().any(|o| o.id == *id && o.tiers & bit != 0))
    };
    shoal_testing::eventually("written to the burst buffer", || {
        all_on(&mut client, TierLevel::Burst)
    });
    // A copy below already: the backing store's copy follows without a
    // second delay.
    shoal_testing::eventually_within(
        Duration::from_millis(1000),
        "the backing copy, without a second delay",
        || all_on(&mut client, TierLevel::Backing),
    );
}

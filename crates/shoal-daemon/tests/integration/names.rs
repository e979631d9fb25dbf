//! Names (the POSIX view's half in the daemon), end to end through a real
//! daemon and clients: put/get by name, listing by directory, rename,
//! unlink, rebinding (a new object replaces the old one atomically, readers
//! of the old keep it), typed refusals of bad names, and names that
//! survive a restart through the tiers' manifest.

use std::path::Path;
use std::time::Duration;

use shoal_client::{Client, Durability};
use shoal_core::error::{ErrorKind, Result};
use shoal_daemon::tiers::{Backing, TierConfig};
use shoal_testing::TestDaemon;

const MIB: u64 = 1024 * 1024;

/// A daemon with a burst buffer and a backing directory under `dir`, which
/// outlives it (names come back from the tiers' manifest at a restart).
fn start(dir: &Path) -> TestDaemon {
    let mut config = TestDaemon::config(dir, 64 * MIB);
    let mut tiers = TierConfig::new();
    tiers.burst = Some((dir.join("burst"), 256 * MIB));
    tiers.backing = Some(Backing::Dir {
        path: dir.join("backing"),
        capacity: u64::MAX,
    });
    config.tiers = Some(tiers);
    TestDaemon::start_with(config)
}

fn read_named(client: &mut Client, name: &str) -> Result<Vec<u8>> {
    let (entry, located) = client.get_named(name, 0)?;
    // SAFETY: referenced until the release below.
    let bytes = unsafe { client.data(located.location) }.to_vec();
    client.release(&[entry.id])?;
    Ok(bytes)
}

fn names(client: &mut Client, prefix: &str) -> Vec<String> {
    let entries = client.list_names(prefix).unwrap();
    entries.into_iter().map(|e| e.name).collect()
}

#[test]
fn names_put_get_list_rename_and_unlink() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path());
    let mut c = daemon.client();
    c.put_named("runs/1/a.bin", b"alpha", b"", None, 0).unwrap();
    c.put_named("runs/1/b.bin", b"beta!", b"m", None, 0)
        .unwrap();
    c.put_named("runs/2/c.bin", b"gamma", b"", None, 0).unwrap();
    c.put_named("top", b"t", b"", None, 0).unwrap();
    assert_eq!(read_named(&mut c, "runs/1/a.bin").unwrap(), b"alpha");
    assert_eq!(names(&mut c, "runs/1"), ["runs/1/a.bin", "runs/1/b.bin"]);
    assert_eq!(names(&mut c, "").len(), 4);
    let entry = c.resolve("runs/1/b.bin").unwrap();
    assert_eq!((entry.data_size, entry.meta_size), (5, 1));
    assert!(entry.mtime_ms > 1_700_000_000_000);

    // A directory moves whole; a name moves onto another, replacing it.
    c.rename("runs/1", "old/1").unwrap();
    assert_eq!(names(&mut c, "old"), ["old/1/a.bin", "old/1/b.bin"]);
    assert!(names(&mut c, "runs/1").is_empty());
    let replaced = c.resolve("top").unwrap().id;
    c.rename("old/1/a.bin", "top").unwrap();
    assert_eq!(read_named(&mut c, "top").unwrap(), b"alpha");
    assert!(
        !c.contains(replaced).unwrap(),
        "the replaced object is deleted"
    );

    // Unlink deletes the object; a deleted object loses its name.
    let id = c.resolve("top").unwrap().id;
    c.unlink("top").unwrap();
    assert!(!c.contains(id).unwrap());
    let kind = |r: Result<Vec<u8>>| r.unwrap_err().kind();
    assert_eq!(kind(read_named(&mut c, "top")), ErrorKind::ObjectNotFound);
    let id = c.resolve("runs/2/c.bin").unwrap().id;
    assert!(c.delete(&[id]).unwrap()[0].is_ok());
    assert!(names(&mut c, "runs").is_empty());
    assert_eq!(
        c.unlink("runs/2/c.bin").unwrap_err().kind(),
        ErrorKind::ObjectNotFound
    );
}

#[test]
fn a_rewrite_switches_the_name_at_its_seal_and_old_readers_keep_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path());
    let mut reader = daemon.client();
    let mut writer = daemon.client();
    writer.put_named("f", b"version 1", b"", None, 0).unwrap();
    let (old, held) = reader.get_named("f", 0).unwrap();

    // Named while being written: invisible under the name until sealed.
    let id = shoal_core::ObjectId::random();
    let location = writer.create(id, 9, 0, 0).unwrap();
    writer.write(location, b"version 2", b"").unwrap();
    writer.name(id, "f").unwrap();
    assert_eq!(read_named(&mut writer, "f").unwrap(), b"version 1");
    writer.seal(&[id], true).unwrap();
    assert_eq!(read_named(&mut writer, "f").unwrap(), b"version 2");

    // The reader of version 1 still reads it; nobody else finds it.
    // SAFETY: referenced until the release below.
    assert_eq!(unsafe { reader.data(held.location) }, b"version 1");
    assert!(!writer.contains(old.id).unwrap());
    reader.release(&[old.id]).unwrap();

    // An aborted rewrite leaves the name alone.
    let id = shoal_core::ObjectId::random();
    writer.create(id, 3, 0, 0).unwrap();
    writer.name(id, "f").unwrap();
    writer.abort(id).unwrap();
    assert_eq!(read_named(&mut writer, "f").unwrap(), b"version 2");
}

#[test]
fn bad_names_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path());
    let mut c = daemon.client();
    let long = "x".repeat(256);
    for (name, kind) in [
        ("", ErrorKind::InvalidArgument),
        ("a/../b", ErrorKind::InvalidArgument),
        ("/abs", ErrorKind::InvalidArgument),
        ("a\0b", ErrorKind::InvalidArgument),
        (long.as_str(), ErrorKind::NameTooLong),
    ] {
        let err = c.put_named(name, b"x", b"", None, 0).unwrap_err();
        assert_eq!(err.kind(), kind, "{name:?}");
        // The daemon refuses them too (a client that skips the check).
        let id = shoal_core::ObjectId::random();
        c.put(id, b"x", b"").unwrap();
        let sent = c.rename("elsewhere", name).unwrap_err();
        assert_eq!(sent.kind(), kind, "{name:?}");
    }
    assert!(names(&mut c, "").is_empty());
}

#[test]
fn durable_names_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let daemon = start(dir.path());
        let mut c = daemon.client();
        c.put_named("keep/a", b"durable", b"", Some(Durability::Local), 0)
            .unwrap();
        c.put_named("keep/b", b"first", b"", Some(Durability::Local), 0)
            .unwrap();
        c.put_named("keep/b", b"second", b"", Some(Durability::Local), 0)
            .unwrap();
        // Renamed after it was written down: the record follows.
        c.put_named("tmp/.c.XXXX", b"third", b"", Some(Durability::Local), 0)
            .unwrap();
        c.rename("tmp/.c.XXXX", "keep/c").unwrap();
    }
    let daemon = start(dir.path());
    let mut c = daemon.client();
    assert_eq!(names(&mut c, "keep"), ["keep/a", "keep/b", "keep/c"]);
    assert!(names(&mut c, "tmp").is_empty());
    assert_eq!(read_named(&mut c, "keep/c").unwrap(), b"third");
    assert_eq!(read_named(&mut c, "keep/a").unwrap(), b"durable");
    assert_eq!(read_named(&mut c, "keep/b").unwrap(), b"second");
}

#[test]
fn renames_racing_the_drain_reach_the_records() {
    // Objects sealed at `memory` are written down by the drain in the
    // background (after puts pause for 50 ms); each is renamed a varying
    // while after its put, so some renames land while its job runs (a
    // job made with the old name). After a restart every record must
    // carry the new name.
    const N: usize = 24;
    let dir = tempfile::tempdir().unwrap();
    let payload = vec![5u8; 8 * MIB as usize];
    {
        let daemon = start(dir.path());
        let mut c = daemon.client();
        let mut ids = Vec::new();
        for i in 0..N {
            let id = c
                .put_named(
                    &format!("tmp/{i}"),
                    &payload,
                    b"",
                    Some(Durability::Memory),
                    5_000,
                )
                .unwrap();
            std::thread::sleep(Duration::from_millis(40 + (i as u64 * 7) % 60));
            c.rename(&format!("tmp/{i}"), &format!("done/{i}")).unwrap();
            ids.push(id);
        }
        for outcome in c.wait_durable(&ids, Durability::Backing, 60_000).unwrap() {
            outcome.unwrap();
        }
        // Let any record fix-up commit before the daemon stops.
        std::thread::sleep(Duration::from_millis(200));
    }
    let daemon = start(dir.path());
    let mut c = daemon.client();
    assert!(
        names(&mut c, "tmp").is_empty(),
        "{:?}",
        names(&mut c, "tmp")
    );
    assert_eq!(names(&mut c, "done").len(), N);
    assert!(read_named(&mut c, "done/7").unwrap() == payload);
}

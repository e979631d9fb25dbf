//! kill -9 under load: a daemon whose tiers are busy (writes at every
//! durability, restores, deletes) is killed at random moments, restarted
//! on the same tiers, and checked: no object acknowledged at `local` or
//! `backing` is lost or torn, no acknowledged delete comes back, and once
//! everything is deleted the tiers hold no file. 20 kills here;
//! `SHOAL_TIER_KILLS` sets more (the benchmark run uses 100+).
//!
//! And deletes racing the write-behind drain: objects put at durability
//! `memory` and deleted at once, the daemon stopped (kill -9 or SIGTERM)
//! right after; none may come back. `SHOAL_TIER_DELETE_ROUNDS` sets the
//! rounds (20 here, about 3,500 deletes).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use shoal_client::{Client, Durability};
use shoal_core::ObjectId;
use shoal_testing::ServeProcess;

fn start(dir: &Path) -> ServeProcess {
    start_with(dir, "2MiB", "8MiB")
}

/// A daemon on `dir`'s tiers with `memory` and a burst buffer of `burst`.
fn start_with(dir: &Path, memory: &str, burst: &str) -> ServeProcess {
    let socket = dir.join("shoal.sock");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("daemon.log"))
        .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_shoal"));
    command
        .args(["serve", "--no-prefault", "-m", memory, "-s"])
        .arg(&socket)
        .arg("--burst")
        .arg(dir.join("burst"))
        .arg("--burst-capacity")
        .arg(burst)
        .arg("--backing")
        .arg(dir.join("backing"))
        .stdout(Stdio::null())
        .stderr(log);
    ServeProcess::spawn(command, &socket)
}

fn pattern(id: &ObjectId, len: usize) -> Vec<u8> {
    let seed = u64::from_le_bytes(id.as_bytes()[..8].try_into().unwrap());
    (0..len)
        .map(|i| (seed.wrapping_mul(i as u64 + 1) >> 13) as u8)
        .collect()
}

/// A small deterministic generator (no dependency for a test's dice).
struct Dice(u64);

impl Dice {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[derive(Default)]
struct Ledger {
    /// Acknowledged at local or backing: must survive. id → size.
    durable: HashMap<ObjectId, usize>,
    /// Acknowledged deletes: must never come back.
    deleted: Vec<ObjectId>,
}

/// Writes, reads and deletes until the daemon dies under it.
fn workload(socket: &Path, ledger: &mut Ledger, dice: &mut Dice) {
    let Ok(mut client) = Client::connect(socket) else {
        return;
    };
    loop {
        let id = ObjectId::random();
        let size = 1 + dice.next(160 * 1024) as usize;
        let level = match dice.next(3) {
            0 => Durability::Memory,
            1 => Durability::Local,
            _ => Durability::Backing,
        };
        let Ok(location) = client.create(id, size as u64, 0, 5_000) else {
            return;
        };
        if client.write(location, &pattern(&id, size), b"").is_err() {
            return;
        }
        match client.seal_durable(&[id], true, Some(level)) {
            Ok(()) if level > Durability::Memory => {
                ledger.durable.insert(id, size);
            }
            Ok(()) => {}
            Err(_) => return,
        }
        // Now and then: read an old object (a restore), delete one.
        if dice.next(4) == 0 && !ledger.durable.is_empty() {
            let pick = *ledger
                .durable
                .keys()
                .nth(dice.next(ledger.durable.len() as u64) as usize)
                .unwrap();
            match client.get(&[pick], 0) {
                Ok(found) => {
                    if let Some(l) = found[0] {
                        // SAFETY: referenced until released below.
                        let ok = unsafe { client.data(l.location) }
                            == pattern(&pick, ledger.durable[&pick]);
                        assert!(ok, "{pick} read back torn while the daemon ran");
                        let _ = client.release(&[pick]);
                    }
                }
                Err(_) => return,
            }
            if dice.next(2) == 0 {
                match client.delete(&[pick]) {
                    Ok(results) if results[0].is_ok() => {
                        ledger.durable.remove(&pick);
                        ledger.deleted.push(pick);
                    }
                    Ok(_) => {}
                    // Killed while deleting: it may or may not be gone.
                    Err(_) => {
                        ledger.durable.remove(&pick);
                        return;
                    }
                }
            }
        }
    }
}

fn verify(socket: &Path, ledger: &Ledger) {
    let mut client = Client::connect(socket).unwrap();
    for id in &ledger.deleted {
        assert!(!client.contains(*id).unwrap(), "deleted {id} came back");
    }
    for (id, size) in &ledger.durable {
        let found = client.get(&[*id], 0).unwrap()[0]
            .unwrap_or_else(|| panic!("{id} ({size} B) acknowledged durable, lost"));
        // SAFETY: referenced until released below.
        let bytes = unsafe { client.data(found.location) }.to_vec();
        assert_eq!(bytes.len(), *size);
        assert!(bytes == pattern(id, *size), "{id} torn after restart");
        client.release(&[*id]).unwrap();
    }
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
fn kill_9_under_load_loses_nothing_acknowledged_and_leaks_nothing() {
    let kills: usize = std::env::var("SHOAL_TIER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = Ledger::default();
    let mut dice = Dice(0x5EED_1234_ABCD_9876);
    for round in 0..kills {
        let node = start(dir.path());
        verify(node.socket(), &ledger);
        // Kill at a random moment while the workload runs.
        let pid = node.pid();
        let delay = Duration::from_millis(30 + dice.next(250));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            // SAFETY: signalling our own child, still unreaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        });
        workload(node.socket(), &mut ledger, &mut dice);
        killer.join().unwrap();
        drop(node); // killed already: reaped here
        eprintln!(
            "round {round}: {} durable, {} deleted so far",
            ledger.durable.len(),
            ledger.deleted.len()
        );
    }
    // After the last kill: everything acknowledged is there; then delete it
    // all and no file may remain on either tier.
    let node = start(dir.path());
    verify(node.socket(), &ledger);
    assert!(
        ledger.durable.len() >= kills,
        "the workload acknowledged too little to mean much"
    );
    let mut client = Client::connect(node.socket()).unwrap();
    let all: Vec<ObjectId> = client.list().unwrap().into_iter().map(|o| o.id).collect();
    for chunk in all.chunks(64) {
        for result in client.delete(chunk).unwrap() {
            result.unwrap();
        }
    }
    drop(client);
    drop(node);
    let node = start(dir.path());
    let mut client = Client::connect(node.socket()).unwrap();
    assert!(
        client.list().unwrap().is_empty(),
        "deleted objects came back"
    );
    assert_eq!(
        tier_files(&dir.path().join("burst")),
        0,
        "burst buffer space leaked"
    );
    assert_eq!(
        tier_files(&dir.path().join("backing")),
        0,
        "backing space leaked"
    );
    let report = client.tiers().unwrap();
    assert!(
        report.tiers.iter().all(|t| t.objects == 0 && t.used == 0),
        "{report:?}"
    );
    drop(client);
    drop(node);
}

/// Puts `n` objects at durability `memory` (so the drain has a backlog),
/// deletes them all, each acknowledged; returns the ids.
fn put_then_delete(socket: &Path, n: usize, dice: &mut Dice) -> Vec<ObjectId> {
    let mut client = Client::connect(socket).unwrap();
    let ids: Vec<ObjectId> = (0..n).map(|_| ObjectId::random()).collect();
    for id in &ids {
        // Packed images (up to 1 MiB) and file images, as in the field.
        let most = if dice.next(4) == 0 {
            3 << 20
        } else {
            200 << 10
        };
        let size = 1 + dice.next(most) as usize;
        client.put(*id, &pattern(id, size), b"").unwrap();
    }
    for chunk in ids.chunks(1 + dice.next(8) as usize) {
        for result in client.delete(chunk).unwrap() {
            result.unwrap();
        }
    }
    ids
}

#[test]
fn deletes_racing_the_drain_stay_deleted_across_kill_9_and_sigterm() {
    let rounds: usize = std::env::var("SHOAL_TIER_DELETE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::tempdir().unwrap();
    let mut dice = Dice(0xDE1E_7E5A_F00D_2468);
    let mut deleted: Vec<ObjectId> = Vec::new();
    let start = |dir: &Path| start_with(dir, "256MiB", "1GiB");
    for round in 0..rounds {
        let node = start(dir.path());
        {
            // What earlier rounds deleted stays deleted.
            let mut client = Client::connect(node.socket()).unwrap();
            let listed = client.list().unwrap();
            assert!(
                listed.is_empty(),
                "round {round}: {} came back",
                listed.len()
            );
            for id in &deleted {
                assert!(!client.contains(*id).unwrap(), "deleted {id} came back");
            }
        }
        let n = 100 + dice.next(151) as usize;
        deleted.extend(put_then_delete(node.socket(), n, &mut dice));
        // Stopped 0-100 ms after the last delete was acknowledged, while
        // the drain still works through its backlog.
        std::thread::sleep(Duration::from_millis(dice.next(101)));
        let signal = if round % 2 == 0 {
            libc::SIGKILL
        } else {
            libc::SIGTERM
        };
        node.signal(signal);
        eprintln!("round {round}: {} deleted so far", deleted.len());
    }
    let node = start(dir.path());
    let mut client = Client::connect(node.socket()).unwrap();
    assert!(
        client.list().unwrap().is_empty(),
        "deleted objects came back"
    );
    for id in &deleted {
        assert!(!client.contains(*id).unwrap(), "deleted {id} came back");
    }
    drop(client);
    drop(node);
    for tier in ["burst", "backing"] {
        assert_eq!(
            tier_files(&dir.path().join(tier)),
            0,
            "{tier}: space of deleted objects leaked"
        );
    }
}

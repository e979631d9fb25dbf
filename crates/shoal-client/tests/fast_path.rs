//! The fast path against a real daemon (docs/fast-path.md): gets of sealed
//! objects through the shared index take no round trip and no daemon
//! reference, yet keep their bytes from being evicted or freed by a delete;
//! and a reader killed at any point (SIGKILL, thousands of times in the
//! bench, bounded here) leaves nothing held and nothing corrupted.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shoal_client::shared::SharedClient;
use shoal_client::Client;
use shoal_core::error::Result;
use shoal_core::ObjectId;
use shoal_daemon::{DaemonConfig, Shutdown};

struct Daemon {
    socket: PathBuf,
    shutdown: Shutdown,
    thread: Option<JoinHandle<Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(capacity: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("shoal.sock");
        let mut config = DaemonConfig::new(&socket, capacity);
        config.prefault = false;
        let shutdown = Shutdown::new();
        let thread = {
            let shutdown = shutdown.clone();
            std::thread::spawn(move || shoal_daemon::serve_blocking(config, shutdown))
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "daemon did not start");
            std::thread::sleep(Duration::from_millis(2));
        }
        Self {
            socket,
            shutdown,
            thread: Some(thread),
            _dir: dir,
        }
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap().unwrap();
        }
    }
}

/// The bytes object `n` holds: its number, repeated.
fn pattern(n: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (n * 31 + i) as u8).collect()
}

fn put_objects(client: &mut Client, ids: &[ObjectId], len: usize) {
    for (n, id) in ids.iter().enumerate() {
        client.put(*id, &pattern(n, len), b"m").unwrap();
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_get_of_a_sealed_object_takes_no_daemon_reference_and_maps_the_same_bytes() {
    let daemon = Daemon::start(8 << 20);
    let mut writer = daemon.client();
    let id = ObjectId::random();
    put_objects(&mut writer, &[id], 1000);
    let mut reader = daemon.client();
    assert!(
        reader.fast_reads().is_some(),
        "the daemon offers the fast path"
    );
    let found = reader.get(&[id], 0).unwrap()[0].unwrap();
    // Zero copy: the bytes are read where the store keeps them.
    let address = reader.located_ptr(found).unwrap();
    assert_eq!(
        address as usize,
        reader.mapping().base() as usize + found.location.offset as usize
    );
    // SAFETY: referenced and mapped.
    let bytes = unsafe { std::slice::from_raw_parts(address, 1000) };
    assert_eq!(bytes, &pattern(0, 1000)[..]);
    // The reference is counted (the daemon's listing sees it)...
    assert_eq!(writer.stats().unwrap().referenced, 1);
    reader.release(&[id]).unwrap();
    assert_eq!(writer.stats().unwrap().referenced, 0);
    // ...but no request was made: a get succeeds while the connection is
    // held by another call.
    let shared = SharedClient::new(daemon.client());
    let (location, held) = shared
        .with(|_connection| Ok(shared.fast_reference(id)))
        .unwrap()
        .expect("served from the index");
    assert_eq!(location, found.location);
    drop(held);
    // An unknown id still takes the socket, and is not found.
    assert!(reader.get(&[ObjectId::random()], 0).unwrap()[0].is_none());
}

#[test]
fn a_held_object_survives_eviction_and_delete_until_its_reader_lets_go() {
    let daemon = Daemon::start(8 << 20);
    let mut writer = daemon.client();
    let ids: Vec<ObjectId> = (0..4).map(|_| ObjectId::random()).collect();
    put_objects(&mut writer, &ids, 4096);
    let reader = SharedClient::new(daemon.client());
    let (location, held) = reader.fast_reference(ids[0]).expect("published");
    // Evict everything: the held object stays, where it was.
    writer.evict(u64::MAX).unwrap();
    assert!(writer.contains(ids[0]).unwrap());
    assert!(!writer.contains(ids[1]).unwrap());
    let (again, second) = reader.fast_reference(ids[0]).expect("still published");
    assert_eq!(again, location);
    drop(second);
    // Delete: gone from view at once, its bytes kept for the reader.
    writer.delete(&[ids[0]]).unwrap()[0].as_ref().unwrap();
    assert!(!writer.contains(ids[0]).unwrap());
    assert!(reader.fast_reference(ids[0]).is_none());
    assert!(writer.stats().unwrap().used >= 4096);
    drop(held);
    wait_for("the deleted object's memory", || {
        writer.stats().unwrap().used == 0
    });
}

/// The child's loop: gets, holds and releases objects through the fast
/// path, and creates, seals, aborts and deletes its own, until killed.
fn reader_loop(socket: &Path, ids: &[ObjectId]) -> ! {
    let mut client = Client::connect(socket).unwrap();
    let mut held: Vec<ObjectId> = Vec::new();
    let mut n = std::process::id() as usize;
    loop {
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pick = (n >> 33) % 64;
        let id = ids[(n >> 40) % ids.len()];
        match pick {
            0..=39 => {
                if let Some(found) = client.get(&[id], 0).unwrap()[0] {
                    let first = unsafe { *client.located_ptr(found).unwrap() };
                    std::hint::black_box(first);
                    held.push(id);
                }
            }
            40..=59 => {
                if let Some(id) = held.pop() {
                    client.release(&[id]).unwrap();
                }
            }
            60 | 61 => {
                let own = ObjectId::random();
                let location = client.create(own, 512, 0, 0).unwrap();
                if pick == 60 {
                    client.seal(&[own], true).unwrap();
                    let _ = client.delete(&[own]);
                } else {
                    let _ = location;
                    client.abort(own).unwrap();
                }
            }
            _ => {
                // Mid-create: killed here, the daemon aborts it.
                let _ = client.create(ObjectId::random(), 512, 0, 0);
            }
        }
    }
}

/// Run by the crash test as a child process (a no-op otherwise).
#[test]
fn fast_path_child() {
    let (Ok(socket), Ok(ids)) = (
        std::env::var("SHOAL_FAST_CHILD_SOCKET"),
        std::env::var("SHOAL_FAST_CHILD_IDS"),
    ) else {
        return;
    };
    let ids: Vec<ObjectId> = ids.split(',').filter_map(ObjectId::from_hex).collect();
    reader_loop(Path::new(&socket), &ids);
}

fn spawn_child(socket: &Path, ids: &[ObjectId]) -> Child {
    let hex: Vec<String> = ids.iter().map(ObjectId::to_hex).collect();
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fast_path_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SHOAL_FAST_CHILD_SOCKET", socket)
        .env("SHOAL_FAST_CHILD_IDS", hex.join(","))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Readers SIGKILLed at random points: after each kill every object is
/// intact, and once the daemon has noticed, no reference stands (all of the
/// store can be evicted) and no byte is leaked (usage returns to zero).
/// `SHOAL_CRASH_KILLS` sets the number of kills (bench: thousands).
#[test]
fn readers_killed_at_random_points_leave_nothing_held_or_corrupted() {
    let kills: usize = std::env::var("SHOAL_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let daemon = Daemon::start(8 << 20);
    let mut writer = daemon.client();
    let ids: Vec<ObjectId> = (0..32).map(|_| ObjectId::random()).collect();
    let mut seed = 0x9e37_79b9_u64;
    for round in 0..kills {
        put_objects(&mut writer, &ids, 1000);
        // Two readers at once, so one dies while the other holds the same
        // objects.
        let mut children = [
            spawn_child(&daemon.socket, &ids),
            spawn_child(&daemon.socket, &ids),
        ];
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        std::thread::sleep(Duration::from_millis(20 + (seed >> 58)));
        for child in &mut children {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        // Every object is whole (nothing was freed under a reader, nothing
        // written over).
        for (n, id) in ids.iter().enumerate() {
            let found = writer.get(&[*id], 0).unwrap()[0]
                .unwrap_or_else(|| panic!("round {round}: object {n} lost"));
            let bytes =
                unsafe { std::slice::from_raw_parts(writer.located_ptr(found).unwrap(), 1000) };
            assert_eq!(bytes, &pattern(n, 1000)[..], "round {round}: object {n}");
            writer.release(&[*id]).unwrap();
        }
        // Once the daemon saw both go: everything can leave memory.
        wait_for("the killed readers' references to go", || {
            writer.evict(u64::MAX).unwrap();
            let stats = writer.stats().unwrap();
            stats.used == 0 && stats.clients == 1
        });
    }
}

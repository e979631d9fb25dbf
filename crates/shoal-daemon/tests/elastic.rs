//! The elastic capacity controller in a real daemon with a burst-buffer
//! tier: a memory burst shrinks the store within the reaction time, its
//! objects go down the tier (none lost, those in use kept), the freed
//! pages go back to the kernel, creates are refused with the reason while
//! objects in use exceed the target, and the store grows back after.
//!
//! The first test reads a file-backed fake /proc/meminfo, so the node's
//! memory is exactly what the test says; the second makes a real burst in
//! a helper process against the host's /proc/meminfo.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shoal_client::{Client, Durability};
use shoal_core::error::{ErrorKind, Result};
use shoal_core::protocol::CapacityReport;
use shoal_core::ObjectId;
use shoal_daemon::elastic::{ElasticConfig, SourceChoice};
use shoal_daemon::tiers::TierConfig;
use shoal_daemon::{DaemonConfig, Shutdown};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

struct Daemon {
    socket: PathBuf,
    shutdown: Shutdown,
    thread: Option<JoinHandle<Result<()>>>,
}

impl Daemon {
    fn start(config: DaemonConfig) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
        let socket = config.socket.clone();
        let shutdown = Shutdown::new();
        let thread = {
            let shutdown = shutdown.clone();
            std::thread::spawn(move || shoal_daemon::serve_blocking(config, shutdown))
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&socket).is_err() {
            if thread.is_finished() {
                thread.join().unwrap().unwrap();
                panic!("daemon returned without error before serving");
            }
            assert!(Instant::now() < deadline, "daemon did not start");
            std::thread::sleep(Duration::from_millis(2));
        }
        Self {
            socket,
            shutdown,
            thread: Some(thread),
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
            let _ = thread.join();
        }
    }
}

fn elastic_daemon(dir: &Path, capacity: u64, elastic: ElasticConfig) -> Daemon {
    let mut config = DaemonConfig::new(dir.join("shoal.sock"), capacity);
    let mut tiers = TierConfig::new();
    tiers.burst = Some((dir.join("burst"), 16 * capacity));
    config.tiers = Some(tiers);
    config.elastic = Some(elastic);
    Daemon::start(config)
}

/// Bytes that differ per object and per offset.
fn pattern(id: &ObjectId, len: usize) -> Vec<u8> {
    let seed = id.as_bytes()[0] as usize * 31 + id.as_bytes()[1] as usize;
    (0..len).map(|i| ((i * 7 + seed) % 251) as u8).collect()
}

fn read(client: &mut Client, id: ObjectId) -> Vec<u8> {
    let found = client.get(&[id], 10_000).unwrap()[0].unwrap_or_else(|| panic!("{id} gone"));
    // SAFETY: referenced until the release below.
    let bytes = unsafe { client.data(found.location) }.to_vec();
    client.release(&[id]).unwrap();
    bytes
}

/// Polls the controller until `done` holds; returns the report and when.
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

/// A /proc/meminfo of `total` bytes with `used` in use.
fn write_meminfo(path: &Path, total: u64, used: u64) {
    let text = format!(
        "MemTotal:       {} kB\nMemFree:        0 kB\nMemAvailable:   {} kB\n",
        total / 1024,
        total.saturating_sub(used) / 1024
    );
    // Written aside and renamed: the daemon never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn a_burst_shrinks_the_store_down_a_tier_frees_its_pages_and_it_grows_back() {
    let dir = tempfile::tempdir().unwrap();
    let meminfo = dir.path().join("meminfo");
    let total = GIB;
    write_meminfo(&meminfo, total, 300 * MIB);
    let capacity = 64 * MIB;
    let mut elastic = ElasticConfig::default();
    elastic.controller.interval = Duration::from_millis(20);
    elastic.controller.max_fraction = 1.0;
    elastic.source = SourceChoice::Files {
        meminfo: meminfo.clone(),
        pressure: None,
    };
    let daemon = elastic_daemon(dir.path(), capacity, elastic);
    let mut client = daemon.client();
    let (calm, _) = wait_for(&mut client, Duration::from_secs(5), "steps", |r| {
        r.steps >= 3
    });
    assert!(calm.enabled && calm.target == capacity && calm.capacity == capacity);
    assert!((calm.utilisation - 300.0 / 1024.0).abs() < 1e-3, "{calm:?}");

    // 48 MiB of objects: half only in memory (dirty: a shrink spills them),
    // half already on the burst buffer (clean: a shrink drops them at once).
    let ids: Vec<ObjectId> = (0..48).map(|_| ObjectId::random()).collect();
    for (i, id) in ids.iter().enumerate() {
        let bytes = pattern(id, MIB as usize - 64);
        if i % 2 == 0 {
            client.put(*id, &bytes, b"m").unwrap();
        } else {
            let at = client.create(*id, bytes.len() as u64, 1, 0).unwrap();
            client.write(at, &bytes, b"c").unwrap();
            client
                .seal_durable(&[*id], true, Some(Durability::Local))
                .unwrap();
        }
    }
    // Two objects stay in use through the burst.
    let held = [ids[0], ids[1]];
    let found = client.get(&held, 0).unwrap();
    assert!(found.iter().all(Option::is_some));
    let full = client.capacity(None).unwrap();
    assert_eq!(full.used, 48 * MIB);
    assert!(full.resident >= 48 * MIB, "{full:?}");

    // The burst: the node at 99 % whatever the store does.
    write_meminfo(&meminfo, total, total * 99 / 100);
    let (shrunk, reaction) = wait_for(
        &mut client,
        Duration::from_secs(10),
        "the store down to its objects in use",
        |r| r.target == 0 && r.used <= 2 * MIB && r.resident <= r.used + 4 * MIB,
    );
    eprintln!("shrunk in {reaction:?}: {shrunk:#?}");
    // λ·v·(r − r_0)/r_0 ≈ 21 MiB a step: 64 MiB in 4 steps (80 ms), plus
    // the spills of 23 dirty MiB to the burst buffer.
    assert!(reaction < Duration::from_secs(3), "took {reaction:?}");
    assert!(shrunk.last_step <= 0);
    assert!(shrunk.over_target, "2 MiB in use exceed a target of 0");
    assert_eq!(shrunk.pinned, 2 * MIB);
    assert!(shrunk.released_bytes >= 40 * MIB, "{shrunk:?}");
    let listed = client.list().unwrap();
    assert_eq!(listed.len(), ids.len(), "nothing lost");
    assert_eq!(listed.iter().filter(|o| o.resident).count(), 2);
    // Full because of the controller, and the error says so.
    let err = client.create(ObjectId::random(), MIB, 0, 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreFull);
    assert!(err.message().contains("capacity controller"), "{err}");
    let trace = client.capacity(Some(Duration::ZERO)).unwrap().trace;
    assert!(trace.windows(2).all(|w| w[0].time < w[1].time));
    assert!(trace.iter().any(|p| p.capacity == capacity) && trace.last().unwrap().target == 0);

    // The burst ends: back to U_max, creates work again.
    write_meminfo(&meminfo, total, 300 * MIB);
    let (grown, regrowth) = wait_for(
        &mut client,
        Duration::from_secs(5),
        "the store grown back",
        |r| r.target == capacity && r.capacity == capacity && !r.over_target,
    );
    eprintln!("grew back in {regrowth:?}: {grown:#?}");
    client.release(&held).unwrap();
    let extra = ObjectId::random();
    client.put(extra, &pattern(&extra, 1000), b"").unwrap();
    // Every object reads back exactly (restored from the burst buffer).
    for id in &ids {
        assert_eq!(
            read(&mut client, *id),
            pattern(id, MIB as usize - 64),
            "{id}"
        );
    }
    assert!(client.tiers().unwrap().restores >= 46);
}

#[test]
fn without_elastic_the_capacity_is_static_and_the_report_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DaemonConfig::new(dir.path().join("shoal.sock"), 8 * MIB);
    config.prefault = false;
    let daemon = Daemon::start(config);
    let mut client = daemon.client();
    std::thread::sleep(Duration::from_millis(150));
    let report = client.capacity(Some(Duration::ZERO)).unwrap();
    assert!(!report.enabled && report.steps == 0 && report.trace.is_empty());
    assert_eq!((report.capacity, report.target), (8 * MIB, 8 * MIB));
}

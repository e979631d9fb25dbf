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
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_client::{Client, Durability};
use shoal_core::error::ErrorKind;
use shoal_core::protocol::CapacityReport;
use shoal_core::ObjectId;
use shoal_daemon::elastic::{ElasticConfig, SourceChoice};
use shoal_daemon::tiers::TierConfig;
use shoal_daemon::DaemonConfig;
use shoal_testing::TestDaemon;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn elastic_daemon(dir: &Path, capacity: u64, elastic: ElasticConfig) -> TestDaemon {
    elastic_daemon_with(dir, capacity, elastic, true)
}

fn elastic_daemon_with(
    dir: &Path,
    capacity: u64,
    elastic: ElasticConfig,
    prefault: bool,
) -> TestDaemon {
    let mut config = DaemonConfig::new(dir.join("shoal.sock"), capacity);
    let mut tiers = TierConfig::new();
    tiers.burst = Some((dir.join("burst"), 16 * capacity));
    config.tiers = Some(tiers);
    config.elastic = Some(elastic);
    config.prefault = prefault;
    TestDaemon::start_with(config)
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

/// A controller stepping every 20 ms on the node `meminfo` describes, with
/// U_max the whole store.
fn fast_controller(meminfo: &Path) -> ElasticConfig {
    let mut elastic = ElasticConfig::default();
    elastic.controller.interval = Duration::from_millis(20);
    elastic.controller.max_fraction = 1.0;
    elastic.source = SourceChoice::Files {
        meminfo: meminfo.to_path_buf(),
        pressure: None,
    };
    elastic
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
    let elastic = fast_controller(&meminfo);
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
    // The region's memory comes back ahead of use: allocated up to the
    // target while nothing is restored into it yet.
    let (refilled, _) = wait_for(
        &mut client,
        Duration::from_secs(5),
        "the region populated up to the target",
        |r| r.resident + 8 * MIB >= r.target,
    );
    assert!(refilled.used <= 2 * MIB, "not by restores: {refilled:?}");
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
fn without_prefault_an_elastic_region_fills_only_as_it_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let meminfo = dir.path().join("meminfo");
    write_meminfo(&meminfo, GIB, 300 * MIB);
    let capacity = 64 * MIB;
    let elastic = fast_controller(&meminfo);
    let daemon = elastic_daemon_with(dir.path(), capacity, elastic, false);
    let mut client = daemon.client();
    wait_for(&mut client, Duration::from_secs(5), "steps", |r| {
        r.steps >= 10
    });
    let id = ObjectId::random();
    client
        .put(id, &pattern(&id, 4 * MIB as usize), b"")
        .unwrap();
    let (report, _) = wait_for(&mut client, Duration::from_secs(5), "steps", |r| {
        r.steps >= 20
    });
    assert_eq!(report.target, capacity);
    assert!(
        report.resident <= 6 * MIB,
        "nothing populated ahead of use: {report:?}"
    );
}

#[test]
fn with_prefetch_a_regrown_store_brings_back_the_victims_read_last_within_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let meminfo = dir.path().join("meminfo");
    let total = GIB;
    write_meminfo(&meminfo, total, 300 * MIB);
    let capacity = 64 * MIB;
    let mut elastic = fast_controller(&meminfo);
    // Room for 16 of the 24 objects below (each 1 MiB − 63 bytes).
    elastic.prefetch = 16 * MIB;
    let daemon = elastic_daemon(dir.path(), capacity, elastic);
    let mut client = daemon.client();
    wait_for(&mut client, Duration::from_secs(5), "steps", |r| {
        r.steps >= 3
    });
    // Durable at the seal: the shrink drops them in policy order at once
    // (dirty victims are held while they spill, which reorders them).
    let ids: Vec<ObjectId> = (0..24).map(|_| ObjectId::random()).collect();
    for id in &ids {
        let bytes = pattern(id, MIB as usize - 64);
        let at = client.create(*id, bytes.len() as u64, 1, 0).unwrap();
        client.write(at, &bytes, b"d").unwrap();
        client
            .seal_durable(&[*id], true, Some(Durability::Local))
            .unwrap();
    }
    // Read once each, in order (no interval between reads yet, so the
    // prefetch brings the ones read last first): ids[23] was read last.
    for id in &ids {
        assert_eq!(read(&mut client, *id), pattern(id, MIB as usize - 64));
    }

    write_meminfo(&meminfo, total, total * 99 / 100);
    wait_for(
        &mut client,
        Duration::from_secs(10),
        "the store emptied",
        |r| r.target == 0 && r.used == 0,
    );
    let restores = client.tiers().unwrap().restores;
    assert!(client.list().unwrap().iter().all(|o| !o.resident));

    // Growth: the 16 read last come back with no get asking for them.
    write_meminfo(&meminfo, total, 300 * MIB);
    wait_for(
        &mut client,
        Duration::from_secs(5),
        "the store grown back",
        |r| r.capacity == capacity,
    );
    let started = Instant::now();
    let resident = loop {
        let resident: Vec<ObjectId> = client
            .list()
            .unwrap()
            .iter()
            .filter(|o| o.resident)
            .map(|o| o.id)
            .collect();
        if resident.len() >= 16 || started.elapsed() > Duration::from_secs(5) {
            break resident;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // Nothing more arrives later: the budget bounds it.
    std::thread::sleep(Duration::from_millis(200));
    let mut expected: Vec<ObjectId> = ids[8..].to_vec();
    let mut resident_now: Vec<ObjectId> = client
        .list()
        .unwrap()
        .iter()
        .filter(|o| o.resident)
        .map(|o| o.id)
        .collect();
    expected.sort();
    resident_now.sort();
    assert_eq!(resident.len(), 16, "prefetched within 5 s");
    assert_eq!(resident_now, expected, "the 16 victims read last, no more");
    assert_eq!(client.tiers().unwrap().restores, restores + 16);
    for id in &ids {
        assert_eq!(read(&mut client, *id), pattern(id, MIB as usize - 64));
    }
}

#[test]
fn without_elastic_the_capacity_is_static_and_the_report_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DaemonConfig::new(dir.path().join("shoal.sock"), 8 * MIB);
    config.prefault = false;
    let daemon = TestDaemon::start_with(config);
    let mut client = daemon.client();
    std::thread::sleep(Duration::from_millis(150));
    let report = client.capacity(Some(Duration::ZERO)).unwrap();
    assert!(!report.enabled && report.steps == 0 && report.trace.is_empty());
    assert_eq!((report.capacity, report.target), (8 * MIB, 8 * MIB));
}

/// The helper process of `a_real_burst_…`: reads commands on stdin,
/// `grow MIB` (allocate and touch that much more), `free` (give it all
/// back); answers each with a line once done. Does nothing unless started
/// by that test (it is ignored, so only `--ignored` runs it).
#[test]
#[ignore = "the helper process of a_real_burst_…, started by it"]
fn burst_helper() {
    if std::env::var_os("SHOAL_BURST_HELPER").is_none() {
        return;
    }
    let mut held: Vec<Vec<u8>> = Vec::new();
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        match line.split_once(' ') {
            // A non-zero fill writes every page: resident at once.
            Some(("grow", mib)) => held.push(vec![1u8; mib.parse::<usize>().unwrap() << 20]),
            None if line == "free" => held = Vec::new(),
            _ => panic!("unknown command {line:?}"),
        }
        let resident: usize = held.iter().map(Vec::len).sum();
        writeln!(stdout.lock(), "held {resident}").unwrap();
    }
}

struct Burst {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Burst {
    fn start() -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "elastic::burst_helper",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SHOAL_BURST_HELPER", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// Sends a command and waits until the helper did it.
    fn command(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the helper died (OOM-killed?) at {command:?}"
            );
            // libtest may print "test burst_helper ... " before it on the same line.
            if line.contains("held ") {
                return;
            }
        }
    }

    fn finish(mut self) {
        drop(self.stdin);
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "the helper failed: {status} (OOM-killed?)"
        );
    }
}

/// MemTotal and the memory available: MemAvailable plus the pages free
/// on the kernel's per-CPU lists, which it leaves out (as the controller
/// counts them: shoal-core capacity/percpu.rs).
fn host_memory() -> Option<(u64, u64)> {
    use shoal_capacity::{read_meminfo, read_percpu_free_bytes, HOST_ZONEINFO};
    let info = read_meminfo(Path::new("/proc/meminfo")).ok()?;
    let percpu = read_percpu_free_bytes(Path::new(HOST_ZONEINFO));
    Some((info.total, (info.available + percpu).min(info.total)))
}

#[test]
fn a_real_burst_beside_a_filled_store_shrinks_it_and_it_grows_back() {
    const STORE: u64 = 2 * GIB;
    const FILL: u64 = 1536 * MIB;
    const OBJECT: u64 = 64 * MIB;
    const STEP: u64 = 512 * MIB;
    const HEADROOM: u64 = 512 * MIB;
    // Other processes of the machine move memory too: what the store
    // cannot be blamed for.
    const NOISE: u64 = 384 * MIB;
    let Some((total, available)) = host_memory() else {
        eprintln!("skipped: no /proc/meminfo here");
        return;
    };
    if available < 8 * GIB {
        eprintln!(
            "skipped: the burst needs 8 GiB available, this machine has {} MiB",
            available / MIB
        );
        return;
    }
    // r_0 puts the threshold HEADROOM above the node with the store full:
    // the first 512 MiB step fits, the next three push the store out.
    let used_before = total - available;
    let threshold = (used_before + FILL + HEADROOM) as f64 / total as f64;
    let dir = tempfile::tempdir().unwrap();
    let mut elastic = ElasticConfig::default();
    elastic.controller.threshold = threshold;
    elastic.controller.max_fraction = 1.0;
    elastic.source = SourceChoice::Host;
    let daemon = elastic_daemon_with(dir.path(), STORE, elastic, false);
    let mut client = daemon.client();

    // Clean objects (durable on the burst buffer): a shrink drops them at once.
    let ids: Vec<ObjectId> = (0..FILL / OBJECT).map(|_| ObjectId::random()).collect();
    for id in &ids {
        let at = client.create(*id, OBJECT, 0, 0).unwrap();
        client
            .write(at, &pattern(id, OBJECT as usize), b"")
            .unwrap();
        client
            .seal_durable(&[*id], true, Some(Durability::Local))
            .unwrap();
    }
    let filled = client.capacity(None).unwrap();
    assert_eq!((filled.target, filled.used), (STORE, FILL), "{filled:#?}");

    // MemAvailable, sampled every 5 ms through the burst.
    let stop = Arc::new(AtomicBool::new(false));
    let lowest = Arc::new(AtomicU64::new(u64::MAX));
    let sampler = {
        let (stop, lowest) = (stop.clone(), lowest.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some((_, available)) = host_memory() {
                    lowest.fetch_min(available, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let floor = total as f64 * (1.0 - threshold);
    let mut burst = Burst::start();
    let mut reactions = Vec::new();
    for step in 1..=4u64 {
        burst.command(&format!("grow {}", STEP / MIB));
        // Above the threshold by (step − 1) steps: the store gives that back.
        let expected = STORE.min(FILL + HEADROOM).saturating_sub((step - 1) * STEP);
        let (report, reaction) = wait_for(
            &mut client,
            Duration::from_secs(5),
            &format!("the store shrunk for burst step {step}"),
            |r| r.target <= expected + NOISE && r.resident <= r.target.max(r.used) + 4 * MIB,
        );
        eprintln!(
            "step {step}: target {} MiB, resident {} MiB, r = {:.4} after {reaction:?}",
            report.target / MIB,
            report.resident / MIB,
            report.utilisation
        );
        reactions.push(reaction);
        std::thread::sleep(Duration::from_millis(300));
    }
    // Hold: the node stays near the threshold, the store small.
    std::thread::sleep(Duration::from_secs(1));
    let held = client.capacity(None).unwrap();
    assert!(held.target <= HEADROOM + NOISE, "{held:#?}");
    burst.command("free");
    let (grown, regrowth) = wait_for(
        &mut client,
        Duration::from_secs(10),
        "the store grown back",
        |r| r.target == STORE,
    );
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    burst.finish();
    let lowest = lowest.load(Ordering::Relaxed);
    eprintln!(
        "reactions {reactions:?}, regrowth {regrowth:?}; lowest MemAvailable {} MiB, threshold {} MiB; {grown:#?}",
        lowest / MIB,
        floor as u64 / MIB
    );
    assert!(
        lowest as f64 >= floor - (STEP + NOISE) as f64,
        "MemAvailable fell to {} MiB, more than a step below the threshold's {} MiB",
        lowest / MIB,
        floor as u64 / MIB
    );
    for id in &ids {
        assert_eq!(read(&mut client, *id), pattern(id, OBJECT as usize), "{id}");
    }
}

//! How fast the elastic capacity controller gives memory back, on this
//! host's real /proc/meminfo (bench/elastic/README.md):
//!
//!     cargo run --release -p shoal-daemon --example elastic_reaction -- [REPS]
//!
//! A daemon (in this process, T = 100 ms, the paper's r_0 moved so the
//! threshold sits 256 MiB above the node with the store full) holds 1.5 GiB
//! of objects durable on a burst buffer. Each repetition allocates and
//! touches 1 GiB at once (a compute job's burst: 768 MiB over the
//! threshold), and measures the reaction: the time until the node is back
//! at the threshold (MemTotal − MemAvailable ≤ r_0·M + 32 MiB), i.e. until
//! the store has shrunk and its pages are back with the kernel. Then the
//! burst is freed, the store grows back, and a pass over every object
//! brings them into memory again (the data job's next iteration). Prints
//! p50 / p99 / max reaction, the controller's CPU per step and per second,
//! and the whole capacity trace as CSV on stderr-free stdout after a
//! `# trace` line.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use shoal_capacity::{read_meminfo, read_percpu_free_bytes, HOST_ZONEINFO};
use shoal_client::{Client, Durability};
use shoal_core::ObjectId;
use shoal_daemon::elastic::{ElasticConfig, SourceChoice};
use shoal_daemon::tiers::TierConfig;
use shoal_daemon::{DaemonConfig, Shutdown};

const MIB: u64 = 1 << 20;
const STORE: u64 = 2048 * MIB;
const FILL: u64 = 1536 * MIB;
const OBJECT: u64 = 64 * MIB;
const HEADROOM: u64 = 256 * MIB;
const BURST: u64 = 1024 * MIB;

/// The node's memory in use as the controller sees it: MemTotal −
/// MemAvailable − the pages free on the per-CPU lists.
fn node_used() -> (u64, u64) {
    let info = read_meminfo(Path::new("/proc/meminfo")).expect("read /proc/meminfo");
    let percpu = read_percpu_free_bytes(Path::new(HOST_ZONEINFO));
    (
        (info.total - info.available).saturating_sub(percpu),
        info.total,
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .map_or(20, |n| n.parse().expect("REPS is a number"));
    let dir = tempfile::tempdir_in(".").expect("a scratch directory here");
    let (used_before, total) = node_used();
    let threshold = (used_before + FILL + HEADROOM) as f64 / total as f64;
    let mut config = DaemonConfig::new(dir.path().join("shoal.sock"), STORE);
    config.prefault = false;
    let mut tiers = TierConfig::new();
    tiers.burst = Some((dir.path().join("burst"), 4 * STORE));
    config.tiers = Some(tiers);
    let mut elastic = ElasticConfig::default();
    elastic.controller.threshold = threshold;
    elastic.controller.max_fraction = 1.0;
    elastic.source = SourceChoice::Host;
    config.elastic = Some(elastic);
    let socket = config.socket.clone();
    let shutdown = Shutdown::new();
    let daemon = {
        let shutdown = shutdown.clone();
        std::thread::spawn(move || shoal_daemon::serve_blocking(config, shutdown))
    };
    while UnixStream::connect(&socket).is_err() {
        assert!(!daemon.is_finished(), "the daemon did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut client = Client::connect(&socket).expect("connect");
    let ids: Vec<ObjectId> = (0..FILL / OBJECT).map(|_| ObjectId::random()).collect();
    let bytes = vec![7u8; OBJECT as usize];
    for id in &ids {
        let at = client.create(*id, OBJECT, 0, 0).expect("create");
        client.write(at, &bytes, b"").expect("write");
        client
            .seal_durable(&[*id], true, Some(Durability::Local))
            .expect("seal");
    }
    let limit = threshold * total as f64 + 32.0 * MIB as f64;
    let mut reactions = Vec::with_capacity(reps);
    let started = client.capacity(None).expect("capacity");
    let wall = Instant::now();
    for rep in 0..reps {
        let burst_at = Instant::now();
        // One write per page makes it resident; black_box keeps the
        // optimiser from dropping an allocation nobody reads.
        let mut burst = vec![0u8; BURST as usize];
        for page in burst.iter_mut().step_by(4096) {
            *page = 1;
        }
        std::hint::black_box(&mut burst);
        let touched = burst_at.elapsed();
        loop {
            if (node_used().0 as f64) <= limit {
                break;
            }
            assert!(
                burst_at.elapsed() < Duration::from_secs(30),
                "the node stayed above the threshold"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let reaction = burst_at.elapsed();
        let report = client.capacity(None).expect("capacity");
        eprintln!(
            "rep {rep}: touched 1 GiB in {touched:?}, back at the threshold after {reaction:?}; target {} MiB",
            report.target / MIB
        );
        reactions.push(reaction);
        drop(std::hint::black_box(burst));
        while client.capacity(None).expect("capacity").target < STORE {
            std::thread::sleep(Duration::from_millis(10));
        }
        // The data job's next pass: every object back in memory.
        client.stage_in(&ids).expect("stage in");
    }
    let end = client.capacity(Some(Duration::ZERO)).expect("capacity");
    let wall = wall.elapsed().as_secs_f64();
    shutdown.trigger();
    daemon.join().expect("daemon thread").expect("daemon");
    reactions.sort();
    let steps = end.steps - started.steps;
    let cpu = end.cpu_seconds - started.cpu_seconds;
    println!("| reps | p50 | p99 | max | steps | CPU per step | CPU share of one core |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {reps} | {:.0} ms | {:.0} ms | {:.0} ms | {steps} | {:.1} µs | {:.3} % |",
        percentile(&reactions, 0.5).as_secs_f64() * 1e3,
        percentile(&reactions, 0.99).as_secs_f64() * 1e3,
        reactions.last().unwrap().as_secs_f64() * 1e3,
        cpu / steps.max(1) as f64 * 1e6,
        100.0 * cpu / wall,
    );
    println!("# trace");
    println!("time_s,target,capacity,store_used,node_used,node_total,ratio");
    for p in &end.trace {
        println!(
            "{:.3},{},{},{},{},{},{:.5}",
            p.time.as_secs_f64(),
            p.target,
            p.capacity,
            p.store_used,
            p.node_used,
            p.node_total,
            p.utilisation
        );
    }
}

//! `shoal bench`: the Table I object micro-benchmark through the Rust client.
//!
//! put  = create + write + seal of all objects (batched: two round trips),
//! get  = one batched get of all ids from a *second process*, until the last
//!        location is back,
//! read = one sequential pass over all bytes in that second process.
//! The Python harness in bench/ runs the same workloads beside Plasma and the
//! machine's limits; this command needs nothing but shoal.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use shoal_client::Client;
use shoal_core::units::parse_size;
use shoal_core::ObjectId;
use shoal_daemon::{DaemonConfig, Shutdown};

/// The seed paper's Table I: (count, size), 1 kB = 1000 B.
pub const TABLE_ONE: [(usize, usize); 6] = [
    (1000, 1_000),
    (500, 10_000),
    (200, 100_000),
    (100, 1_000_000),
    (50, 10_000_000),
    (10, 100_000_000),
];

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Use a running daemon instead of starting one in this process.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Capacity of the daemon started for the run.
    #[arg(long, value_parser = parse_size, default_value = "2560MiB")]
    capacity: u64,
    /// Repetitions per workload (min and median are reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Only workloads whose object size is at most this (e.g. 1MB for a quick run).
    #[arg(long, value_parser = parse_size)]
    max_size: Option<u64>,
}

#[derive(clap::Args, Debug)]
pub struct ReaderArgs {
    #[arg(long)]
    socket: PathBuf,
    #[arg(long)]
    count: usize,
    #[arg(long)]
    size: usize,
    #[arg(long)]
    tag: u64,
}

fn object_id(tag: u64, rep: usize, index: usize) -> ObjectId {
    let mut id = [0u8; 20];
    id[..8].copy_from_slice(&tag.to_le_bytes());
    id[8..12].copy_from_slice(&(rep as u32).to_le_bytes());
    id[12..16].copy_from_slice(&(index as u32).to_le_bytes());
    ObjectId(id)
}

/// Sums a buffer as u64 words with four independent accumulators, so the
/// loop is bound by memory bandwidth, not by the add chain.
pub fn read_pass(bytes: &[u8]) -> u64 {
    // SAFETY: reinterpreting initialised bytes as u64 words is valid for any bit pattern.
    let (head, words, tail) = unsafe { bytes.align_to::<u64>() };
    let mut acc = [0u64; 4];
    let chunks = words.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        acc[0] = acc[0].wrapping_add(c[0]);
        acc[1] = acc[1].wrapping_add(c[1]);
        acc[2] = acc[2].wrapping_add(c[2]);
        acc[3] = acc[3].wrapping_add(c[3]);
    }
    let mut sum = acc.iter().fold(0u64, |a, &b| a.wrapping_add(b));
    for &w in rest {
        sum = sum.wrapping_add(w);
    }
    for &b in head.iter().chain(tail) {
        sum = sum.wrapping_add(b as u64);
    }
    sum
}

fn minor_faults() -> i64 {
    // SAFETY: getrusage fills the struct we pass.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage.ru_minflt
    }
}

/// The second process: on each "go REP" line, get all objects of that rep in
/// one request, read them once, answer "get_ns read_ns faults checksum".
pub fn reader(args: ReaderArgs) -> Result<()> {
    let mut client = Client::connect(&args.socket)?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line?;
        let Some(rep) = line.strip_prefix("go ") else {
            break;
        };
        let rep: usize = rep.trim().parse()?;
        let ids: Vec<_> = (0..args.count)
            .map(|i| object_id(args.tag, rep, i))
            .collect();
        let started = Instant::now();
        let found = client.get(&ids, 10_000)?;
        let get_ns = started.elapsed().as_nanos();
        let locations: Vec<_> = found
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .context("an object was missing")?;
        let faults = minor_faults();
        let started = Instant::now();
        let mut checksum = 0u64;
        for location in &locations {
            // SAFETY: we hold a reference to every object until the release below.
            checksum = checksum.wrapping_add(read_pass(unsafe { client.data(location.location) }));
        }
        let read_ns = started.elapsed().as_nanos();
        let faults = minor_faults() - faults;
        client.release(&ids)?;
        writeln!(out, "{get_ns} {read_ns} {faults} {checksum}")?;
        out.flush()?;
    }
    Ok(())
}

struct Sample {
    put: Duration,
    get: Duration,
    read: Duration,
    faults: i64,
}

fn stats(mut xs: Vec<f64>) -> (f64, f64) {
    xs.sort_by(f64::total_cmp);
    (xs[0], xs[xs.len() / 2])
}

pub fn run(args: BenchArgs, self_command: Vec<String>) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("shoal-bench-{}", std::process::id()));
    let (socket, daemon) = match &args.socket {
        Some(socket) => (socket.clone(), None),
        None => {
            std::fs::create_dir_all(&dir)?;
            let socket = dir.join("bench.sock");
            let config = DaemonConfig::new(&socket, args.capacity);
            let shutdown = Shutdown::new();
            let handle = {
                let shutdown = shutdown.clone();
                std::thread::spawn(move || shoal_daemon::serve_blocking(config, shutdown))
            };
            (socket, Some((shutdown, handle)))
        }
    };
    let mut client = connect_retrying(&socket)?;
    let tag = u64::from_le_bytes(ObjectId::random().0[..8].try_into().expect("8 bytes"));
    println!(
        "shoal bench: {} reps, get and read from a second process, times per whole batch",
        args.reps
    );
    println!(
        "{:>6} {:>11} | {:>12} {:>12} {:>9} | {:>12} {:>12} | {:>10} {:>7}",
        "count",
        "size",
        "put min",
        "put/obj",
        "put GiB/s",
        "get min",
        "get/obj",
        "read GiB/s",
        "faults"
    );
    let workloads: Vec<(usize, usize)> = TABLE_ONE
        .into_iter()
        .filter(|&(_, size)| args.max_size.is_none_or(|m| size as u64 <= m))
        .collect();
    // Rows are printed above the bar (suspended), so a terminal shows both.
    let progress = crate::progress::bar((workloads.len() * args.reps) as u64, "bench repetitions");
    for (count, size) in workloads {
        let mut reader = Command::new(&self_command[0])
            .args(&self_command[1..])
            .args(["bench-reader", "--socket"])
            .arg(&socket)
            .args([
                "--count",
                &count.to_string(),
                "--size",
                &size.to_string(),
                "--tag",
                &tag.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start the reader process")?;
        let mut to_reader = reader.stdin.take().expect("piped");
        let mut from_reader = BufReader::new(reader.stdout.take().expect("piped"));
        let source: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        let mut samples = Vec::new();
        for rep in 0..args.reps {
            let ids: Vec<_> = (0..count).map(|i| object_id(tag, rep, i)).collect();
            let objects: Vec<_> = ids
                .iter()
                .map(|id| (*id, source.as_slice(), &[][..]))
                .collect();
            let started = Instant::now();
            client.put_batch(&objects, None, 0)?;
            let put = started.elapsed();
            writeln!(to_reader, "go {rep}")?;
            to_reader.flush()?;
            let mut line = String::new();
            from_reader.read_line(&mut line)?;
            let fields: Vec<i64> = line
                .split_whitespace()
                .take(3)
                .map(|f| f.parse().unwrap_or(-1))
                .collect();
            if fields.len() != 3 || fields[0] < 0 {
                bail!("reader failed: {line:?}");
            }
            samples.push(Sample {
                put,
                get: Duration::from_nanos(fields[0] as u64),
                read: Duration::from_nanos(fields[1] as u64),
                faults: fields[2],
            });
            for result in client.delete(&ids)? {
                result?;
            }
            progress.inc(1);
        }
        drop(to_reader);
        let _ = reader.wait();
        let bytes = (count * size) as f64;
        let (put_min, _) = stats(samples.iter().map(|s| s.put.as_secs_f64()).collect());
        let (get_min, _) = stats(samples.iter().map(|s| s.get.as_secs_f64()).collect());
        let (read_min, _) = stats(samples.iter().map(|s| s.read.as_secs_f64()).collect());
        let faults = samples.iter().map(|s| s.faults).min().unwrap_or(0);
        progress.suspend(|| {
            println!(
                "{count:>6} {size:>11} | {:>10.3}ms {:>10.2}µs {:>9.2} | {:>10.3}ms {:>10.3}µs | {:>10.2} {faults:>7}",
                put_min * 1e3,
                put_min * 1e6 / count as f64,
                bytes / put_min / (1u64 << 30) as f64,
                get_min * 1e3,
                get_min * 1e6 / count as f64,
                bytes / read_min / (1u64 << 30) as f64,
            )
        });
    }
    progress.finish_and_clear();
    drop(client);
    if let Some((shutdown, handle)) = daemon {
        shutdown.trigger();
        handle
            .join()
            .map_err(|_| anyhow::anyhow!("daemon thread panicked"))??;
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

fn connect_retrying(socket: &std::path::Path) -> Result<Client> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Client::connect(socket) {
            Ok(client) => return Ok(client),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(err) => {
                return Err(err).with_context(|| format!("connect to {}", socket.display()))
            }
        }
    }
}

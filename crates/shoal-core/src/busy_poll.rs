//! How long a waiting end polls before it sleeps, and whether it polls at all.
//!
//! On virtual machines a sleeping core is woken by an interrupt the host
//! delivers late: a Unix-socket round trip between two cores measured
//! 60–70 µs here against ~5 µs on one core (bench/results/single-object.md,
//! run of 2026-11-24, in git history: 25752ba).
//! So the client, waiting for a reply, and the daemon, waiting for a
//! connection's next request or a write record, poll for a short window
//! before they block, yielding the core between polls (a peer on the same
//! core runs at once). A request that arrives inside the window costs no
//! wake-up on either side; an idle end sleeps after one window.
//!
//! Polling pays only while some core has nothing else to run. When every
//! core is busy (CPU-bound neighbours, a parallel build) a poller's
//! `sched_yield` hands its core to a neighbour for a whole time slice
//! (milliseconds), and the thread it waits for may be queued behind that
//! neighbour too; a thread asleep in the kernel is instead woken with
//! priority (wake-up preemption) the moment its event comes. So every
//! waiter asks [`worth_polling`] first: the number of runnable threads on
//! the machine, read from `/proc/loadavg` at most every
//! [`LOAD_RECHECK`], must leave a core for the poller. And a poll whose
//! yield came back late (another thread had the core: [`pause`] returns
//! `false`) stops polling at once, and the next poll reads the load first.
//!
//! `SHOAL_POLL_US` sets the window in microseconds for the process (read
//! once); `0` turns polling off.

use std::cell::Cell;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The window when `SHOAL_POLL_US` is not set: longer than the client's own
/// work between two calls from Python (~10–20 µs here), short enough that an
/// idle daemon or client stops spending CPU almost at once.
pub const DEFAULT_WINDOW: Duration = Duration::from_micros(50);

/// How long an answer of [`worth_polling`] is kept before `/proc/loadavg`
/// is read again (a read costs ~2 µs; load changes slower than this).
pub const LOAD_RECHECK: Duration = Duration::from_millis(2);

/// A yield that took longer than this gave the core to another thread.
const LATE_YIELD: Duration = Duration::from_micros(30);

/// This process's polling window.
pub fn window() -> Duration {
    static WINDOW: OnceLock<Duration> = OnceLock::new();
    *WINDOW.get_or_init(|| parse(std::env::var("SHOAL_POLL_US").ok().as_deref()))
}

fn parse(value: Option<&str>) -> Duration {
    value
        .and_then(|v| v.trim().parse().ok())
        .map_or(DEFAULT_WINDOW, Duration::from_micros)
}

/// How long a waiter spins on shared memory — no yield, no system call —
/// when the machine has no free core, before it sleeps on a futex
/// (`SHOAL_BUSY_SPIN_US`, default 0: sleep at once).
pub fn busy_spin() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        std::env::var("SHOAL_BUSY_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .map_or(Duration::ZERO, Duration::from_micros)
    })
}

/// The window this thread should poll for now: [`window`] while
/// [`worth_polling`], zero otherwise.
pub fn window_now() -> Duration {
    let window = window();
    if window.is_zero() || !worth_polling() {
        Duration::ZERO
    } else {
        window
    }
}

thread_local! {
    /// This thread's last answer and when it was found.
    static LAST: Cell<Option<(Instant, bool)>> = const { Cell::new(None) };
}

/// Whether polling can pay now: the machine's runnable threads (this one
/// among them) leave a core for it. Read at most every [`LOAD_RECHECK`]
/// per thread; without `/proc/loadavg` it always says yes.
pub fn worth_polling() -> bool {
    let now = Instant::now();
    if let Some((at, answer)) = LAST.get() {
        if now.duration_since(at) < LOAD_RECHECK {
            return answer;
        }
    }
    let answer = runnable().is_none_or(|running| running <= cores());
    LAST.set(Some((now, answer)));
    answer
}

/// Forgets the kept answer, so the next [`worth_polling`] reads the load.
/// A late yield alone is no proof of a busy machine: on a virtual machine
/// the host takes the core now and then (each time, keeping "busy" for
/// [`LOAD_RECHECK`] made every call of the next 2 ms ring the daemon's
/// doorbell: 3,000 rings a second in a quiet loop of `contains`, 4.3 µs a
/// call against 3.5 µs when the load is read again instead).
fn look_again() {
    LAST.set(None);
}

/// Threads runnable on the machine now (running or waiting for a core), as
/// `/proc/loadavg` counts them.
fn runnable() -> Option<u32> {
    static LOADAVG: OnceLock<Option<File>> = OnceLock::new();
    let file = LOADAVG
        .get_or_init(|| File::open("/proc/loadavg").ok())
        .as_ref()?;
    let mut buf = [0u8; 128];
    let n = file.read_at(&mut buf, 0).ok()?;
    parse_runnable(std::str::from_utf8(&buf[..n]).ok()?)
}

/// The fourth field of `/proc/loadavg`: "runnable/threads".
fn parse_runnable(loadavg: &str) -> Option<u32> {
    let field = loadavg.split_ascii_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

/// Online cores.
fn cores() -> u32 {
    static CORES: OnceLock<u32> = OnceLock::new();
    *CORES.get_or_init(|| {
        // SAFETY: sysconf reads a system constant; no memory is touched.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        u32::try_from(n).unwrap_or(1).max(1)
    })
}

/// Gives the core to any other runnable thread between two polls. `false`:
/// another thread had the core for a while — stop polling and sleep in the
/// kernel (and [`worth_polling`] reads the load again before the next poll).
pub fn pause() -> bool {
    let start = Instant::now();
    // SAFETY: sched_yield takes no arguments and cannot fail on Linux.
    unsafe { libc::sched_yield() };
    if start.elapsed() > LATE_YIELD {
        look_again();
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_read_in_microseconds_and_defaults_when_unset_or_bad() {
        assert_eq!(parse(None), DEFAULT_WINDOW);
        assert_eq!(parse(Some("0")), Duration::ZERO);
        assert_eq!(parse(Some(" 120 ")), Duration::from_micros(120));
        assert_eq!(parse(Some("fast")), DEFAULT_WINDOW);
    }

    #[test]
    fn runnable_threads_are_the_fourth_field_of_loadavg() {
        assert_eq!(parse_runnable("0.52 0.61 0.70 3/412 12345\n"), Some(3));
        assert_eq!(parse_runnable("7.92 6.62 6.49 11/1024 1"), Some(11));
        assert_eq!(parse_runnable("0.52 0.61"), None);
        assert_eq!(parse_runnable("a b c x/y z"), None);
        assert!(runnable().is_some(), "this machine has /proc/loadavg");
    }

    #[test]
    fn a_machine_with_every_core_busy_is_not_worth_polling() {
        // One spinning thread per core, plus this one: more runnable
        // threads than cores.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinners: Vec<_> = (0..cores())
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        LAST.set(None);
        let busy = worth_polling();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in spinners {
            s.join().unwrap();
        }
        assert!(!busy, "{} spinners on {} cores", cores(), cores());
        // The answer is kept for LOAD_RECHECK, then read again.
        std::thread::sleep(LOAD_RECHECK * 2);
        assert!(runnable().is_some());
    }
}

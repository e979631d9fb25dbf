//! How long a waiting end of the local socket polls before it sleeps.
//!
//! On virtual machines a sleeping core is woken by an interrupt the host
//! delivers late: a Unix-socket round trip between two cores measured
//! 60–70 µs here against ~5 µs on one core (bench/results/single-object.md,
//! run of 2026-11-24, in git history: 25752ba).
//! So the client, waiting for a reply, and the daemon, waiting for a
//! connection's next request, poll the socket for a short window before
//! they block, yielding the core between polls (a peer on the same core
//! runs at once). A request that arrives inside the window costs no
//! wake-up on either side; an idle end sleeps after one window.
//!
//! `SHOAL_POLL_US` sets the window in microseconds for the process (read
//! once); `0` turns polling off.

use std::sync::OnceLock;
use std::time::Duration;

/// The window when `SHOAL_POLL_US` is not set: longer than the client's own
/// work between two calls from Python (~10–20 µs here), short enough that an
/// idle daemon or client stops spending CPU almost at once.
pub const DEFAULT_WINDOW: Duration = Duration::from_micros(50);

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

/// Gives the core to any other runnable thread between two polls.
pub fn pause() {
    // SAFETY: sched_yield takes no arguments and cannot fail on Linux.
    unsafe { libc::sched_yield() };
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
}

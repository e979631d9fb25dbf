//! Waiting with a deadline: for a condition, for a daemon to serve.

use std::path::Path;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shoal_client::Client;
use shoal_core::error::Result;

/// How long a test waits for its daemons to serve: generous, since a
/// daemon that fails to start ends its thread and fails the test at once,
/// and CI's two cores may be busy with other tests' daemons.
pub const START_WAIT: Duration = Duration::from_secs(30);

/// Waits up to 10 s for `done`; fails the test naming `what` otherwise.
pub fn eventually(what: &str, done: impl FnMut() -> bool) {
    eventually_within(Duration::from_secs(10), what, done);
}

/// Waits up to `limit` for `done`, looking every 5 ms; fails the test
/// naming `what` otherwise.
pub fn eventually_within(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until the daemon of one of `threads` answers on `socket`; fails
/// the test at `deadline`, or at once with the daemon's error if one of
/// `threads` ended (a port taken, a region that would not map).
pub fn wait_started(socket: &Path, threads: &mut Vec<JoinHandle<Result<()>>>, deadline: Instant) {
    while Client::connect(socket).is_err() {
        if let Some(ended) = threads.iter().position(|t| t.is_finished()) {
            let outcome = threads.remove(ended).join();
            panic!("a daemon stopped before serving: {outcome:?}");
        }
        assert!(
            Instant::now() < deadline,
            "daemon at {} did not start",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

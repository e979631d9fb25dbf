//! One daemon on a thread of the test.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shoal_client::Client;
use shoal_core::error::Result;
use shoal_daemon::{DaemonConfig, Shutdown};

use crate::wait::START_WAIT;

/// A daemon serving on a thread of the test, stopped (and its outcome
/// checked) when dropped.
///
/// `start(capacity)` gives the common case: a store of `capacity` bytes,
/// its socket in a directory of its own, nothing prefaulted.
/// `start_with(config)` runs any configuration (tiers, an elastic
/// controller, metrics); `try_start` returns a daemon's refusal to start.
pub struct TestDaemon {
    socket: PathBuf,
    shutdown: Shutdown,
    thread: Option<JoinHandle<Result<()>>>,
    /// The daemon's own directory (`start`, `start_configured`), removed with it.
    _dir: Option<tempfile::TempDir>,
}

impl TestDaemon {
    /// A store of `capacity` bytes, socket `shoal.sock` in a temporary
    /// directory of its own (removed with the daemon), prefault off.
    pub fn start(capacity: u64) -> Self {
        Self::start_configured(capacity, |_, _| {})
    }

    /// [`start`](Self::start), `configure(config, dir)` applied first: the
    /// daemon's own directory is there for tiers or other files.
    pub fn start_configured(
        capacity: u64,
        configure: impl FnOnce(&mut DaemonConfig, &Path),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Self::config(dir.path(), capacity);
        configure(&mut config, dir.path());
        let mut daemon = Self::start_with(config);
        daemon._dir = Some(dir);
        daemon
    }

    /// The configuration [`start`](Self::start) uses, socket `dir/shoal.sock`:
    /// for tests that keep their directory across restarts.
    pub fn config(dir: &Path, capacity: u64) -> DaemonConfig {
        let mut config = DaemonConfig::new(dir.join("shoal.sock"), capacity);
        config.prefault = false;
        config
    }

    /// A daemon of `config`; fails the test if it does not start.
    pub fn start_with(config: DaemonConfig) -> Self {
        Self::try_start(config).unwrap()
    }

    /// A daemon of `config`, or the error it stopped with before serving.
    pub fn try_start(config: DaemonConfig) -> Result<Self> {
        crate::logs::init_logs();
        let socket = config.socket.clone();
        let shutdown = Shutdown::new();
        let thread = {
            let shutdown = shutdown.clone();
            std::thread::spawn(move || shoal_daemon::serve_blocking(config, shutdown))
        };
        let deadline = Instant::now() + START_WAIT;
        while Client::connect(&socket).is_err() {
            if thread.is_finished() {
                thread.join().unwrap()?;
                panic!("the daemon returned without error before serving");
            }
            assert!(
                Instant::now() < deadline,
                "daemon at {} did not start",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(Self {
            socket,
            shutdown,
            thread: Some(thread),
            _dir: None,
        })
    }

    /// The socket clients connect to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A new client of the daemon.
    pub fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    /// A client whose every call is a request (no fast path): its creates
    /// are known to the daemon at once, so a second writer of an id is
    /// refused at create (in lent space, at its seal).
    pub fn socket_client(&self) -> Client {
        Client::connect_socket_only(&self.socket).unwrap()
    }

    /// Stops the daemon now: its memory, and every object only there, is
    /// gone. Fails the test if the daemon ended with an error.
    pub fn stop(mut self) {
        self.shutdown.trigger();
        self.thread.take().unwrap().join().unwrap().unwrap();
        assert!(!self.socket.exists(), "socket removed on shutdown");
    }

    /// Asks the daemon to stop and waits for it; its outcome.
    fn finish(&mut self) -> Option<std::thread::Result<Result<()>>> {
        self.shutdown.trigger();
        self.thread.take().map(|t| t.join())
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        let outcome = self.finish();
        // A test already failing says why; a second panic would abort.
        if !std::thread::panicking() {
            if let Some(outcome) = outcome {
                outcome.unwrap().unwrap();
                assert!(!self.socket.exists(), "socket removed on shutdown");
            }
        }
    }
}

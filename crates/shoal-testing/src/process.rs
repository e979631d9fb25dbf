//! A daemon as a process of its own: what kill -9, signals, resource
//! limits and restarts on the same tiers need (a daemon thread dies with
//! the test).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use shoal_client::Client;

use crate::wait::START_WAIT;

/// A `shoal serve` process (or anything serving a shoal socket), killed
/// when dropped, so a failed check never leaves it running.
pub struct ServeProcess {
    child: Child,
    socket: PathBuf,
    /// The cluster node's region, removed once the process is gone (a
    /// killed daemon leaves it in /dev/shm).
    region: Option<PathBuf>,
}

impl ServeProcess {
    /// Spawns `command` and waits until a client can connect at `socket`;
    /// fails the test if the process exits first (with its status) or does
    /// not serve within [`START_WAIT`].
    pub fn spawn(mut command: Command, socket: &Path) -> Self {
        let child = command.spawn().expect("spawn the daemon");
        let mut process = Self {
            child,
            socket: socket.to_owned(),
            region: None,
        };
        let deadline = Instant::now() + START_WAIT;
        while Client::connect(socket).is_err() {
            if let Some(status) = process.child.try_wait().unwrap() {
                panic!(
                    "the daemon at {} exited before serving: {status}",
                    socket.display()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the daemon at {} did not start",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        process
    }

    /// [`spawn`](Self::spawn) for cluster node `node` (its socket), whose
    /// region file goes when the process does, however it ended.
    pub fn spawn_node(command: Command, node: &shoal_cluster::Node) -> Self {
        let mut process = Self::spawn(command, &node.socket);
        process.region = Some(node.region.clone());
        process
    }

    /// The socket it serves.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A new client of it.
    pub fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    /// Sends `signal` and waits for the process to end; its exit status.
    pub fn signal(mut self, signal: i32) -> ExitStatus {
        // SAFETY: kill(2) on our own child, which has not been waited for.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        self.child.wait().unwrap()
    }

    /// kill -9, and waits for it.
    pub fn kill(self) -> ExitStatus {
        self.signal(libc::SIGKILL)
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(region) = &self.region {
            let _ = std::fs::remove_file(region);
        }
    }
}

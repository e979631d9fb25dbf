//! The drain's own thread and runtime, at a lower CPU priority than the
//! store's: writing every put down the tiers (checksums, copies into
//! bounce buffers or the page cache, reading the burst buffer back) is
//! CPU work that must not slow the puts themselves. The kernel's scheduler
//! gives it what the foreground leaves; restores and spills (which clients
//! wait for) stay on the store's runtime at normal priority.

use std::future::Future;
use std::time::Duration;

use shoal_core::error::{Result, ShoalError};
use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a stopping daemon waits for tier I/O that is still running.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A runtime on its own thread whose threads (its blocking pool's too) run
/// `nice` steps below the daemon's priority (0: at it).
pub(super) struct Background {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    pub(super) fn start(nice: i32) -> Result<Self> {
        // Relative to the caller's (the daemon's) priority, set as one
        // absolute value on every thread: threads the runtime starts from
        // its own (already lowered) threads must not be lowered twice.
        let nice = (own_priority() + nice.max(0)).min(19);
        let runtime = Builder::new_current_thread()
            .enable_all()
            .thread_name("shoal-drain-io")
            .on_thread_start(move || set_priority(nice))
            .build()
            .map_err(|e| ShoalError::io("start the drain runtime", e))?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("shoal-drain".into())
            .spawn(move || {
                set_priority(nice);
                runtime.block_on(async {
                    let _ = stopped.await;
                });
                runtime.shutdown_timeout(STOP_GRACE);
            })
            .map_err(|e| ShoalError::io("start the drain thread", e))?;
        Ok(Self {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Runs `task` on the drain's runtime.
    pub(super) fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(task)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The calling thread's nice value.
fn own_priority() -> i32 {
    // SAFETY: a plain system call on this thread's own id. It may return -1
    // as a value (a nice of -1); errors cannot happen for our own id.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
}

/// Sets the calling thread's nice value (Linux sets it per thread). Best
/// effort: a failure leaves the thread at the daemon's priority.
fn set_priority(nice: i32) {
    if nice <= own_priority() {
        return;
    }
    // SAFETY: a plain system call on this thread's own id.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if rc != 0 {
        tracing::debug!(nice, err = %std::io::Error::last_os_error(), "drain priority not lowered");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nice value of the calling thread.
    fn own_nice() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // Field 19 (nice), counted after the command name's closing paren.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split_whitespace().nth(16).unwrap().parse().unwrap()
    }

    #[test]
    fn tasks_and_blocking_work_run_at_the_lower_priority() {
        let base = own_nice();
        let background = Background::start(10).unwrap();
        let (task, blocking) = std::sync::mpsc::channel();
        background.spawn(async move {
            let on_worker = own_nice();
            let on_blocking = tokio::task::spawn_blocking(own_nice).await.unwrap();
            task.send((on_worker, on_blocking)).unwrap();
        });
        let (on_worker, on_blocking) = blocking.recv().unwrap();
        assert_eq!(on_worker, (base + 10).min(19));
        assert_eq!(on_blocking, (base + 10).min(19));
        assert_eq!(own_nice(), base, "the caller's thread is untouched");
        drop(background);
    }
}

//! Every background task of a daemon runs under one supervisor, so stopping
//! the daemon stops all of them and waits until they are gone: no loop
//! (heartbeats, accept, rebuild, release timers) outlives `run`.
//!
//! A task is cancelled by dropping its future at its next await point, which
//! is safe for every task here: the store is only touched between awaits,
//! and whatever a cancelled task held dies with the daemon's state.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::rc::Rc;

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

#[derive(Clone, Default)]
pub struct Supervisor {
    tracker: TaskTracker,
    stop: CancellationToken,
    /// Live tasks by name: what a shutdown waits for, in its log line.
    live: Rc<RefCell<BTreeMap<&'static str, usize>>>,
}

/// Decrements its task's count however the task ends (done or cancelled).
struct Live {
    name: &'static str,
    live: Rc<RefCell<BTreeMap<&'static str, usize>>>,
}

impl Drop for Live {
    fn drop(&mut self) {
        let mut live = self.live.borrow_mut();
        if let Some(n) = live.get_mut(self.name) {
            *n -= 1;
            if *n == 0 {
                live.remove(self.name);
            }
        }
    }
}

impl Supervisor {
    pub fn new() -> Self {
        Self::default()
    }

    fn enter(&self, name: &'static str) -> Live {
        *self.live.borrow_mut().entry(name).or_default() += 1;
        Live {
            name,
            live: self.live.clone(),
        }
    }

    /// Runs `task` on the daemon's thread until it ends or the daemon stops.
    /// Refused (not run) once the daemon is stopping.
    pub fn spawn_local(&self, name: &'static str, task: impl Future<Output = ()> + 'static) {
        if self.stop.is_cancelled() {
            tracing::debug!(task = name, "not started: the daemon is stopping");
            return;
        }
        let live = self.enter(name);
        let stop = self.stop.clone();
        // A task started while answering a request keeps that request's span.
        let task = task.in_current_span();
        self.tracker.spawn_local(async move {
            let _live = live;
            tokio::select! {
                _ = task => {}
                _ = stop.cancelled() => {}
            }
        });
    }

    /// As [`spawn_local`](Self::spawn_local) for a task that must be `Send`
    /// (the gRPC server); it is told to stop through `stopping()` and is
    /// awaited like the others.
    pub fn spawn(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        if self.stop.is_cancelled() {
            return;
        }
        let live = self.enter(name);
        // Counted on this thread: the count is not Send, the task may be.
        let done = self.tracker.spawn(task.in_current_span());
        self.tracker.spawn_local(async move {
            let _live = live;
            let _ = done.await;
        });
    }

    /// Resolves when the daemon begins to stop.
    pub fn stopping(&self) -> WaitForCancellationFutureOwned {
        self.stop.clone().cancelled_owned()
    }

    pub fn is_stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Live tasks by name.
    pub fn live(&self) -> BTreeMap<&'static str, usize> {
        self.live.borrow().clone()
    }

    /// Stops every task and waits until all have ended.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        self.tracker.close();
        tracing::debug!(tasks = ?self.live(), "stopping background tasks");
        self.tracker.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn shutdown_stops_and_awaits_every_task() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async {
            let supervisor = Supervisor::new();
            let finished = Rc::new(RefCell::new(Vec::new()));
            let done = finished.clone();
            supervisor.spawn_local("short", async move { done.borrow_mut().push("short") });
            supervisor.spawn_local("forever", std::future::pending());
            supervisor.spawn("send", supervisor.stopping());
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert_eq!(*finished.borrow(), vec!["short"]);
            assert_eq!(
                supervisor.live().into_iter().collect::<Vec<_>>(),
                vec![("forever", 1), ("send", 1)]
            );
            supervisor.shutdown().await;
            assert!(supervisor.live().is_empty());
            supervisor.spawn_local("late", async { panic!("must not run") });
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert!(supervisor.live().is_empty());
        });
    }
}

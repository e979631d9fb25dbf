//! `FaultyTier`: a decorator that makes a real tier fail on purpose, as
//! redb's fuzzer backend does (`FuzzerBackend { inner, countdown }`): the
//! Nth operation from now fails, or every operation while "unreachable".
//! It can also hold puts or deletes at a gate, to run a race in a chosen
//! order. Tests and fault drills wrap a `DirTier` or `S3Tier` in it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ObjectId;

use tokio::sync::watch;

use crate::format::{ObjectHeader, ObjectSizes};
use crate::range::{DestRange, SourceRange};
use crate::tier::{Tier, TierUsage};

/// When an injected failure strikes relative to the real operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultTiming {
    /// The operation fails without touching the inner tier.
    Before,
    /// The inner operation runs to completion, then its result is replaced
    /// by the error: an acknowledgement lost on the way back (or a crash right
    /// after the step).
    After,
}

/// Operations [`FaultyTier::hold`] can stop at a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// `put`, and so `put_batch` (the default one, which runs `put`s).
    Puts = 0,
    /// `delete`.
    Deletes = 1,
}

/// A tier that fails on demand.
#[derive(Debug)]
pub struct FaultyTier {
    inner: Arc<dyn Tier>,
    /// Per [`Held`]: whether its operations wait at the gate.
    gates: [watch::Sender<bool>; 2],
    /// Operations waiting at a gate now.
    waiting: Arc<AtomicU64>,
    /// Operations left before the injected one; 0 = none armed.
    countdown: AtomicU64,
    timing_after: AtomicBool,
    unreachable: AtomicBool,
    operations: AtomicU64,
    injected: AtomicU64,
}

impl FaultyTier {
    /// Wraps `inner`, with no fault armed and no gate held: until told
    /// otherwise it behaves as `inner`, counting operations.
    pub fn new(inner: Arc<dyn Tier>) -> Self {
        Self {
            inner,
            gates: [watch::Sender::new(false), watch::Sender::new(false)],
            waiting: Arc::default(),
            countdown: AtomicU64::new(0),
            timing_after: AtomicBool::new(false),
            unreachable: AtomicBool::new(false),
            operations: AtomicU64::new(0),
            injected: AtomicU64::new(0),
        }
    }

    /// The `n`th operation from now (1 = the next) fails once, with `Io`.
    pub fn fail_nth(&self, n: u64, timing: FaultTiming) {
        self.timing_after
            .store(timing == FaultTiming::After, Ordering::SeqCst);
        self.countdown.store(n, Ordering::SeqCst);
    }

    /// While set, every operation fails with `NodeUnavailable` before
    /// reaching the inner tier.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.unreachable.store(unreachable, Ordering::SeqCst);
    }

    /// While `held`, operations of kind `which` wait at a gate before they
    /// reach the inner tier. A held operation runs on a task of its own, as
    /// a real backend's work does (a blocking-pool write, a PUT sent): it
    /// goes on, and lands, even if its caller stops waiting for it.
    pub fn hold(&self, which: Held, held: bool) {
        self.gates[which as usize].send_replace(held);
    }

    /// Operations waiting at a gate now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Runs `real` now, or, while `which` is held, on its own task once the
    /// gate opens.
    async fn gated<T: Send + 'static>(
        &self,
        which: Held,
        real: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let mut gate = self.gates[which as usize].subscribe();
        if !*gate.borrow() {
            return real.await;
        }
        let waiting = self.waiting.clone();
        waiting.fetch_add(1, Ordering::SeqCst);
        let task = tokio::spawn(async move {
            let _ = gate.wait_for(|held| !*held).await;
            waiting.fetch_sub(1, Ordering::SeqCst);
            real.await
        });
        task.await
            .map_err(|e| ShoalError::io("held tier operation", e))?
    }

    /// Operations started so far (`describe` and `usage` do not count).
    pub fn operations(&self) -> u64 {
        self.operations.load(Ordering::SeqCst)
    }

    /// Failures injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// Counts an operation; `Some(timing)` if it is the one to fail.
    fn arm(&self, op: &str) -> Result<Option<FaultTiming>> {
        self.operations.fetch_add(1, Ordering::SeqCst);
        if self.unreachable.load(Ordering::SeqCst) {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(ShoalError::new(
                ErrorKind::NodeUnavailable,
                format!(
                    "{}: unreachable (injected) during {op}",
                    self.inner.describe()
                ),
            ));
        }
        let fire = self
            .countdown
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok_and(|before| before == 1);
        if !fire {
            return Ok(None);
        }
        self.injected.fetch_add(1, Ordering::SeqCst);
        Ok(Some(if self.timing_after.load(Ordering::SeqCst) {
            FaultTiming::After
        } else {
            FaultTiming::Before
        }))
    }

    fn injected_error(&self, op: &str) -> ShoalError {
        ShoalError::new(
            ErrorKind::Io,
            format!("{}: injected I/O error during {op}", self.inner.describe()),
        )
    }

    /// Runs `real` unless the fault strikes before it; replaces its result if
    /// the fault strikes after.
    async fn run<T>(
        &self,
        op: &str,
        real: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        match self.arm(op)? {
            None => real.await,
            Some(FaultTiming::Before) => Err(self.injected_error(op)),
            Some(FaultTiming::After) => {
                let _ = real.await;
                Err(self.injected_error(op))
            }
        }
    }
}

#[async_trait]
impl Tier for FaultyTier {
    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }

    fn usage(&self) -> TierUsage {
        self.inner.usage()
    }

    async fn put(
        &self,
        id: ObjectId,
        sizes: ObjectSizes,
        src: SourceRange,
    ) -> Result<ObjectHeader> {
        let inner = self.inner.clone();
        let put = async move { inner.put(id, sizes, src).await };
        self.run("put", self.gated(Held::Puts, put)).await
    }

    async fn get(&self, id: ObjectId, dst: DestRange) -> (DestRange, Result<ObjectHeader>) {
        match self.arm("get") {
            Err(err) => (dst, Err(err)),
            Ok(None) => self.inner.get(id, dst).await,
            Ok(Some(FaultTiming::Before)) => (dst, Err(self.injected_error("get"))),
            Ok(Some(FaultTiming::After)) => {
                let (dst, _) = self.inner.get(id, dst).await;
                (dst, Err(self.injected_error("get")))
            }
        }
    }

    async fn verify(&self, id: ObjectId) -> Result<ObjectHeader> {
        self.run("verify", self.inner.verify(id)).await
    }

    async fn header(&self, id: ObjectId) -> Result<ObjectHeader> {
        self.run("header", self.inner.header(id)).await
    }

    async fn delete(&self, id: ObjectId) -> Result<bool> {
        let inner = self.inner.clone();
        let delete = async move { inner.delete(id).await };
        self.run("delete", self.gated(Held::Deletes, delete)).await
    }

    async fn list(&self) -> Result<Vec<ObjectId>> {
        self.run("list", self.inner.list()).await
    }

    async fn sweep(&self) -> Result<u64> {
        self.run("sweep", self.inner.sweep()).await
    }

    async fn marker(&self) -> Result<Option<crate::identity::TierIdentity>> {
        self.inner.marker().await
    }

    async fn mark_stopped(&self, stopped: bool) -> Result<()> {
        self.inner.mark_stopped(stopped).await
    }
}

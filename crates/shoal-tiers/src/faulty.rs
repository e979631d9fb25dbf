//! `FaultyTier`: a decorator that makes a real tier fail on purpose, as
//! redb's fuzzer backend does (`FuzzerBackend { inner, countdown }`): the
//! Nth operation from now fails, or every operation while "unreachable".
//! Tests and fault drills wrap a `DirTier` or `S3Tier` in it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ObjectId;

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

/// A tier that fails on demand.
#[derive(Debug)]
pub struct FaultyTier {
    inner: Arc<dyn Tier>,
    /// Operations left before the injected one; 0 = none armed.
    countdown: AtomicU64,
    timing_after: AtomicBool,
    unreachable: AtomicBool,
    operations: AtomicU64,
    injected: AtomicU64,
}

impl FaultyTier {
    pub fn new(inner: Arc<dyn Tier>) -> Self {
        Self {
            inner,
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
        self.run("put", self.inner.put(id, sizes, src)).await
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

    async fn delete(&self, id: ObjectId) -> Result<bool> {
        self.run("delete", self.inner.delete(id)).await
    }

    async fn list(&self) -> Result<Vec<ObjectId>> {
        self.run("list", self.inner.list()).await
    }

    async fn sweep(&self) -> Result<u64> {
        self.run("sweep", self.inner.sweep()).await
    }
}

//! Retry with exponential backoff, for faults that pass (a backing store that
//! is restarting, a network blip). Only `NodeUnavailable`, `Io`, `Timeout`
//! and `Disconnected` are retried: a full tier, a corrupt copy or a bad
//! argument fails the same way every time, and retrying them would loop.

use std::future::Future;
use std::time::Duration;

use shoal_core::error::{ErrorKind, Result};
use tracing::debug;

/// How long to wait between attempts, and how many to make.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The wait after the first failed attempt.
    pub initial: Duration,
    /// The longest wait between two attempts; the growth stops there.
    pub max: Duration,
    /// Each wait is the one before times this (2.0: doubling).
    pub factor: f64,
    /// Attempts in all (the first included); `None` = until it succeeds or
    /// fails for a reason that is not retried.
    pub attempts: Option<u32>,
}

impl Default for Backoff {
    /// 50 ms, doubling up to 5 s, until success.
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(5),
            factor: 2.0,
            attempts: None,
        }
    }
}

impl Backoff {
    /// The wait before attempt `n + 1` (n ≥ 1).
    pub fn delay(&self, n: u32) -> Duration {
        let scaled = self.initial.as_secs_f64() * self.factor.powi(n.saturating_sub(1) as i32);
        Duration::from_secs_f64(scaled.min(self.max.as_secs_f64()))
    }
}

/// Whether an error of this kind may go away by itself.
pub fn is_transient(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::NodeUnavailable | ErrorKind::Io | ErrorKind::Timeout | ErrorKind::Disconnected
    )
}

/// Runs `op` until it succeeds, fails with a non-transient error, or runs out
/// of attempts; returns the last result.
pub async fn with_backoff<T, F, Fut>(backoff: Backoff, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut attempt = 1u32;
    loop {
        match op().await {
            Ok(value) => return Ok(value),
            Err(err)
                if is_transient(err.kind()) && backoff.attempts.is_none_or(|n| attempt < n) =>
            {
                let delay = backoff.delay(attempt);
                debug!("attempt {attempt} failed ({err}); retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                attempt += 1;
            }
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_core::error::ShoalError;
    use std::cell::Cell;

    #[test]
    fn delays_grow_and_cap() {
        let b = Backoff::default();
        assert_eq!(b.delay(1), Duration::from_millis(50));
        assert_eq!(b.delay(2), Duration::from_millis(100));
        assert_eq!(b.delay(40), Duration::from_secs(5));
    }

    /// Waits of 1-4 ms: the test runs in real time (no paused clock, whose
    /// `test-util` feature would make tokio build twice, for tests and not).
    const FAST: Backoff = Backoff {
        initial: Duration::from_millis(1),
        max: Duration::from_millis(4),
        factor: 2.0,
        attempts: None,
    };

    #[tokio::test]
    async fn retries_transient_errors_only() {
        let calls = Cell::new(0);
        let got = with_backoff(FAST, || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                if n < 4 {
                    Err(ShoalError::new(ErrorKind::NodeUnavailable, "down"))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(got.unwrap(), 4);

        calls.set(0);
        let err = with_backoff(FAST, || {
            calls.set(calls.get() + 1);
            async { Err::<(), _>(ShoalError::new(ErrorKind::StoreFull, "full")) }
        })
        .await
        .unwrap_err();
        assert_eq!(
            (err.kind(), calls.get()),
            (ErrorKind::StoreFull, 1),
            "never retried"
        );

        calls.set(0);
        let limited = Backoff {
            attempts: Some(3),
            ..FAST
        };
        let err = with_backoff(limited, || {
            calls.set(calls.get() + 1);
            async { Err::<(), _>(ShoalError::new(ErrorKind::Io, "eio")) }
        })
        .await
        .unwrap_err();
        assert_eq!((err.kind(), calls.get()), (ErrorKind::Io, 3));
    }
}

//! A warning a retry loop would repeat many times a second while one failure
//! lasts (etcd unreachable: a renewal every 100 ms): said the first time,
//! then at most once every [`EVERY`] with how many times it happened since,
//! and its end said once. `tracing` has no rate limit of its own.

use std::time::{Duration, Instant};

/// The least time between two warnings of one failure.
pub const EVERY: Duration = Duration::from_secs(10);

/// One kind of failure of a retry loop, as its warnings should tell it.
#[derive(Debug, Default)]
pub struct Repeated {
    said: Option<Instant>,
    unsaid: u64,
    total: u64,
}

impl Repeated {
    /// It happened again: `Some(times)` when to warn now, `times` being how
    /// many failures the warning stands for (1 the first time).
    pub fn happened(&mut self) -> Option<u64> {
        self.happened_at(Instant::now())
    }

    fn happened_at(&mut self, now: Instant) -> Option<u64> {
        self.unsaid += 1;
        self.total += 1;
        if self.said.is_some_and(|at| now.duration_since(at) < EVERY) {
            return None;
        }
        self.said = Some(now);
        Some(std::mem::take(&mut self.unsaid))
    }

    /// It worked: `Some(failures)` the first time after a run of failures,
    /// for a line saying the failure is over.
    pub fn over(&mut self) -> Option<u64> {
        let total = std::mem::take(&mut self.total);
        *self = Self::default();
        (total > 0).then_some(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_said_then_one_per_period_with_its_count_and_the_end_once() {
        let mut r = Repeated::default();
        let t0 = Instant::now();
        assert_eq!(r.happened_at(t0), Some(1));
        for i in 1..100 {
            assert_eq!(r.happened_at(t0 + Duration::from_millis(100 * i)), None);
        }
        assert_eq!(r.happened_at(t0 + EVERY), Some(100));
        assert_eq!(r.over(), Some(101));
        assert_eq!(r.over(), None);
        assert_eq!(
            r.happened_at(t0 + EVERY),
            Some(1),
            "a new run is said at once"
        );
    }
}

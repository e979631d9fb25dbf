//! How many restores run at once: a budget of bytes in flight, and a cap on
//! large restores (device reads).

use tokio::sync::{Semaphore, SemaphorePermit};

/// Bytes of restores in flight at once (reads issued, memory allocated), in
/// units of [`UNIT`]. Why bound them: a `stage_in` of many objects would
/// otherwise allocate memory for all of them before the first read completes
/// and queue one blocking read per object; 64 MiB keeps a fast device busy
/// (16 MiB restores: 4 at once, each with its own block reader) while later
/// restores wait without holding memory.
const IN_FLIGHT: u64 = 64 << 20;
const UNIT: u64 = 64 << 10;

/// Objects this large are restored from a directory tier with direct I/O:
/// one device read per image, or per 4 MiB block.
const LARGE: u64 = 256 << 10;

/// Large restores in flight at once. Why a count as well as bytes: 64 MiB
/// of 1 MiB restores is 64 concurrent device reads, and this machine's
/// virtual disk reads 1 MiB blocks at 1,190–1,440 MiB/s with 64 readers
/// against 1,840–1,960 with 8 and 1,600–1,660 with one (fio, psync,
/// O_DIRECT). Alternated on fresh daemons, dd's read just before each run:
/// 1 MiB restores at a median 0.82× dd with 64 in flight, 0.95× with 8 and
/// 0.97× with 16, the least spread (0.86–1.13).
const LARGE_SLOTS: usize = 16;

pub(super) struct RestoreBudget {
    /// Units of [`IN_FLIGHT`] free.
    bytes: Semaphore,
    /// Free slots of [`LARGE_SLOTS`].
    large: Semaphore,
}

impl Default for RestoreBudget {
    fn default() -> Self {
        Self {
            bytes: Semaphore::new((IN_FLIGHT / UNIT) as usize),
            large: Semaphore::new(LARGE_SLOTS),
        }
    }
}

/// A restore's share of the budget, held while it runs.
pub struct RestorePermit<'a> {
    _bytes: SemaphorePermit<'a>,
    _large: Option<SemaphorePermit<'a>>,
}

impl RestoreBudget {
    /// Waits until a restore of `bytes` may start. An object larger than the
    /// whole budget takes all of it.
    pub(super) async fn permit(&self, bytes: u64) -> RestorePermit<'_> {
        // The slot first: a large restore waiting for one holds no bytes.
        let large = match bytes >= LARGE {
            true => Some(self.large.acquire().await.expect("never closed")),
            false => None,
        };
        let units = bytes.div_ceil(UNIT).clamp(1, IN_FLIGHT / UNIT);
        let bytes = self
            .bytes
            .acquire_many(units as u32)
            .await
            .expect("never closed");
        RestorePermit {
            _bytes: bytes,
            _large: large,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[test]
    fn large_restores_wait_for_a_slot_and_small_ones_do_not() {
        let budget = RestoreBudget::default();
        let held: Vec<_> = (0..LARGE_SLOTS)
            .map(|_| budget.permit(1 << 20).now_or_never().expect("a free slot"))
            .collect();
        assert!(budget.permit(LARGE).now_or_never().is_none());
        // 16 MiB of bytes in flight: small restores still start.
        assert!(budget.permit(LARGE - 1).now_or_never().is_some());
        drop(held);
        assert!(budget.permit(LARGE).now_or_never().is_some());
    }

    #[test]
    fn bytes_in_flight_are_bounded_and_a_huge_restore_takes_them_all() {
        let budget = RestoreBudget::default();
        let huge = budget
            .permit(10 * IN_FLIGHT)
            .now_or_never()
            .expect("all of it");
        assert!(budget.permit(1).now_or_never().is_none());
        drop(huge);
        let quarters: Vec<_> = (0..4)
            .map(|_| {
                budget
                    .permit(IN_FLIGHT / 4)
                    .now_or_never()
                    .expect("a quarter")
            })
            .collect();
        assert!(budget.permit(UNIT).now_or_never().is_none());
        drop(quarters);
        assert!(budget.permit(0).now_or_never().is_some());
    }
}

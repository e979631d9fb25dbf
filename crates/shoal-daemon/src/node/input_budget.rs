//! A bound on the bytes all local connections buffer for requests not yet
//! complete. A frame may be up to `MAX_FRAME_LEN` (64 MiB); without a total
//! bound, a few connections each sending most of a large frame would grow
//! the daemon by hundreds of MiB. Small frames (the usual case: requests
//! carry ids, never object bytes) need no reservation; a connection about
//! to buffer a frame larger than [`SMALL_FRAME`] reserves its length first,
//! and is refused (and closed) when the total would pass the limit.

use std::cell::Cell;
use std::rc::Rc;

use shoal_core::error::{ErrorKind, Result, ShoalError};

/// Frames up to this many bytes are buffered without a reservation.
pub const SMALL_FRAME: u64 = 1 << 20;
/// Bytes of large frames buffered at once by all connections.
pub(super) const DEFAULT_LIMIT: u64 = 128 << 20;

pub struct InputBudget {
    limit: u64,
    reserved: Cell<u64>,
}

impl Default for InputBudget {
    fn default() -> Self {
        Self::new(DEFAULT_LIMIT)
    }
}

impl InputBudget {
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            reserved: Cell::new(0),
        }
    }

    /// Reserves `bytes` for one frame being buffered; the reservation ends
    /// when the returned guard drops.
    pub fn reserve(self: &Rc<Self>, bytes: u64) -> Result<Reservation> {
        let total = self.reserved.get() + bytes;
        if total > self.limit {
            return Err(ShoalError::new(
                ErrorKind::StoreFull,
                format!(
                    "a request frame of {bytes} bytes does not fit the daemon's input budget \
                     ({} of {} bytes buffered for incomplete requests)",
                    self.reserved.get(),
                    self.limit
                ),
            ));
        }
        self.reserved.set(total);
        Ok(Reservation {
            budget: self.clone(),
            bytes,
        })
    }

    pub fn reserved(&self) -> u64 {
        self.reserved.get()
    }
}

/// Bytes of the budget held for one frame.
pub struct Reservation {
    budget: Rc<InputBudget>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget
            .reserved
            .set(self.budget.reserved.get() - self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stop_at_the_limit_and_end_with_their_guard() {
        let budget = Rc::new(InputBudget::new(100));
        let a = budget.reserve(60).unwrap();
        let err = budget.reserve(50).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::StoreFull);
        assert_eq!(budget.reserved(), 60);
        let b = budget.reserve(40).unwrap();
        drop(a);
        assert_eq!(budget.reserved(), 40);
        drop(b);
        assert_eq!(budget.reserved(), 0);
    }
}

//! The client's side of lent space: objects are carved from the block the
//! daemon lent, in address order (a bump allocator: a create costs a few
//! additions), and the block is given back once it is used up and nothing
//! carved from it is still being written.
//!
//! Bump, not best fit: a lease is small (a few hundred objects), short-lived
//! and given back whole, so the space an aborted object leaves inside it is
//! simply returned with the rest; the daemon's allocator does the long-lived
//! fitting.

use crate::location::Block;

/// One block the daemon lent this client (`Lent`), and how far it is carved. The daemon
/// keeps its own record and checks every `Create` record against it; this is only the
/// client's bookkeeping.
#[derive(Debug)]
pub struct Lease {
    /// The daemon's number for it.
    number: u64,
    block: Block,
    /// Bytes carved so far, from the start.
    used: u64,
    /// Objects carved and neither sealed nor aborted.
    writing: u32,
}

impl Lease {
    /// A lease not carved yet: `number` and `block` as the `Lent` reply gave them.
    pub fn new(number: u64, block: Block) -> Self {
        Self {
            number,
            block,
            used: 0,
            writing: 0,
        }
    }

    /// The daemon's number for it (what giving it back names).
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Whether `offset` lies inside this lease.
    pub fn holds(&self, offset: u64) -> bool {
        offset >= self.block.offset && offset - self.block.offset < self.block.len
    }

    /// Carves `len` bytes (a whole number of lines): their offset, or
    /// `None` when the rest of the lease is shorter.
    pub fn carve(&mut self, len: u64) -> Option<u64> {
        if len > self.block.len - self.used {
            return None;
        }
        let offset = self.block.offset + self.used;
        self.used += len;
        self.writing += 1;
        Some(offset)
    }

    /// An object carved here was sealed or aborted (`undo`: aborted, and if
    /// it was the last carved, its bytes can be carved again).
    pub fn finished(&mut self, offset: u64, len: u64, undo: bool) {
        debug_assert!(self.writing > 0);
        self.writing = self.writing.saturating_sub(1);
        if undo && offset + len == self.block.offset + self.used {
            self.used -= len;
        }
    }

    /// Objects carved and not finished.
    pub fn writing(&self) -> u32 {
        self.writing
    }

    /// Bytes not carved yet.
    pub fn room(&self) -> u64 {
        self.block.len - self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carves_in_order_until_full_and_an_aborted_last_object_is_carved_again() {
        let mut lease = Lease::new(
            1,
            Block {
                offset: 4096,
                len: 1024,
            },
        );
        assert_eq!(lease.carve(512), Some(4096));
        assert_eq!(lease.carve(256), Some(4608));
        assert_eq!(lease.carve(512), None);
        assert_eq!(lease.writing(), 2);
        lease.finished(4096, 512, true); // not the last: stays carved
        assert_eq!(lease.room(), 256);
        lease.finished(4608, 256, true);
        assert_eq!(lease.room(), 512);
        assert_eq!(lease.writing(), 0);
        assert_eq!(lease.carve(512), Some(4608));
        assert!(lease.holds(4096) && lease.holds(5119) && !lease.holds(5120));
    }
}

//! The store's memory as the daemon's elastic controller sees it: the
//! capacity (its knob; shrinking evicts), the region and its line size, the
//! bytes used and pinned, and the free ranges whose memory can be given
//! back to the kernel.

use shoal_core::location::Block;

use super::Store;

impl Store {
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Changes the capacity (the elastic controller's knob). Shrinking evicts
    /// unreferenced objects until usage fits; returns the bytes evicted
    /// (freed now, or held by the gate and freed when their holders finish).
    pub fn set_capacity(&mut self, capacity: u64) -> u64 {
        let capacity = capacity.min(self.allocator.size());
        self.space_changed |= capacity > self.capacity;
        self.capacity = capacity;
        self.ceiling = self.ceiling.max(capacity);
        let excess = self
            .allocator
            .used()
            .saturating_sub(self.evicting_bytes)
            .saturating_sub(self.capacity);
        self.evict(excess)
    }

    pub fn line_size(&self) -> u64 {
        self.allocator.line()
    }

    /// Bytes of region the store allocates from (whole lines).
    pub fn region_size(&self) -> u64 {
        self.allocator.size()
    }

    /// Bytes allocated to objects (whatever the capacity; above it while
    /// objects in use keep a shrunk store from fitting).
    pub fn used(&self) -> u64 {
        self.allocator.used()
    }

    /// Bytes no eviction can free: referenced or unsealed objects (and
    /// victims on their way out are not counted: they leave).
    pub fn pinned(&self) -> u64 {
        self.pinned_bytes()
    }

    /// The region's free blocks, largest first: no object occupies them, so
    /// their memory can be given back to the kernel.
    pub fn free_ranges(&self) -> impl Iterator<Item = Block> + '_ {
        self.allocator.free_ranges()
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{id, store};
    use super::*;
    use shoal_core::error::ErrorKind;

    #[test]
    fn a_shrunk_store_is_full_not_too_small_for_what_fit_before() {
        let mut s = store(4096);
        s.create(1, id(1), 1000, 0).unwrap();
        assert_eq!(s.pinned(), 1024);
        s.set_capacity(512);
        // Above the capacity now, but it fit before: wait for room.
        let err = s.create(1, id(2), 2048, 0).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::StoreFull);
        let err = s.create(1, id(3), 4097, 0).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectTooLarge);
        let free: Vec<Block> = s.free_ranges().collect();
        assert_eq!(
            free,
            vec![Block {
                offset: 1024,
                len: 3072
            }]
        );
        s.set_capacity(4096);
        s.create(1, id(2), 2048, 0).unwrap();
        s.check_invariants();
    }
}

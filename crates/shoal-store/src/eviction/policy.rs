//! What every eviction policy is: it orders the store's candidates. The
//! trait lives apart from the policies and their registry (`mod.rs`), so a
//! policy depends on it, never on the module that lists the policies.

use crate::object_table::{Access, Slot};

/// A candidate's reads as the store knows them when it becomes one: its
/// history on the store's access clock (one tick per get, carried across
/// evictions by `ghost_reads`) and the clock at that moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reads {
    pub access: Access,
    pub now: u64,
}

pub trait EvictionPolicy: Send {
    /// `slot` became evictable.
    fn insert(&mut self, slot: Slot);
    /// `slot` became evictable with these reads. The store always calls this
    /// one; policies that keep their own bookkeeping (LRU's order, LFU's
    /// counts) take the default, which ignores them.
    fn insert_with_reads(&mut self, slot: Slot, reads: Reads) {
        let _ = reads;
        self.insert(slot);
    }
    /// `slot` is no longer evictable (referenced again, or removed).
    fn remove(&mut self, slot: Slot);
    /// `slot` was read (a get); LRU ignores it, frequency policies count it.
    fn touch(&mut self, slot: Slot);
    /// The best candidate to evict next, if any; it stays a candidate until removed.
    fn victim(&self) -> Option<Slot>;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn name(&self) -> &'static str;
}

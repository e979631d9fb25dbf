//! What every eviction policy is: it orders the store's candidates. The
//! trait lives apart from the policies and their registry (`mod.rs`), so a
//! policy depends on it, never on the module that lists the policies.

use crate::object_table::Slot;

pub trait EvictionPolicy: Send {
    /// `slot` became evictable.
    fn insert(&mut self, slot: Slot);
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

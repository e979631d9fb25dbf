//! Eviction policies: which unreferenced sealed object leaves memory first.
//!
//! The store tells the policy when an object becomes a candidate (sealed and
//! unreferenced), when it stops being one (referenced again, deleted) and when
//! it is accessed; the policy only orders candidates. New policies (LFU, the
//! tiering-aware ones) plug in behind this trait.

mod lru;

pub use lru::Lru;

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

/// Builds a policy by name (`lru`).
pub fn by_name(name: &str) -> Option<Box<dyn EvictionPolicy>> {
    match name.to_ascii_lowercase().as_str() {
        "lru" => Some(Box::new(Lru::default())),
        _ => None,
    }
}

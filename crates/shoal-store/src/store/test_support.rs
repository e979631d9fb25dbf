//! Helpers the store's tests share (compiled for tests only): a small LRU
//! store, ids, and a gate that holds every victim, as a tier copying bytes
//! out does.

use shoal_core::ids::ObjectId;

use crate::eviction::Lru;

use super::{EvictionGate, Store, Verdict, Victim};

pub(super) fn store(size: u64) -> Store {
    Store::new(size, size, 64, Box::new(Lru::default()))
}

pub(super) fn id(n: u8) -> ObjectId {
    ObjectId([n; 20])
}

/// Holds every victim, recording them (a tier copying bytes out).
pub(super) struct HoldAll(pub(super) std::rc::Rc<std::cell::RefCell<Vec<Victim>>>);

impl EvictionGate for HoldAll {
    fn decide(&mut self, victim: &Victim) -> Verdict {
        self.0.borrow_mut().push(*victim);
        Verdict::Hold
    }
}

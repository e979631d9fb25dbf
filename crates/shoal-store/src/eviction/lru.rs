//! Least recently used: candidates in the order they were last released.
//!
//! An intrusive doubly linked list over slot numbers (8 bytes per slot) rather
//! than a linked list of boxes: O(1) everything, no allocation per object.

use super::policy::EvictionPolicy;
use crate::object_table::Slot;

const NIL: Slot = Slot::MAX;
const ABSENT: Slot = Slot::MAX - 1;

#[derive(Clone, Copy)]
struct Link {
    prev: Slot,
    next: Slot,
}

const OUT: Link = Link {
    prev: ABSENT,
    next: ABSENT,
};

pub struct Lru {
    links: Vec<Link>,
    head: Slot, // least recently used
    tail: Slot, // most recently used
    len: usize,
}

impl Default for Lru {
    fn default() -> Self {
        Self {
            links: Vec::new(),
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl Lru {
    /// The most recently inserted slot: the store's cold candidates leave
    /// in this order (a looping scan finds its earlier part still in memory).
    pub fn newest(&self) -> Option<Slot> {
        (self.tail != NIL).then_some(self.tail)
    }

    fn contains(&self, slot: Slot) -> bool {
        self.links
            .get(slot as usize)
            .is_some_and(|l| l.prev != ABSENT)
    }
}

impl EvictionPolicy for Lru {
    fn insert(&mut self, slot: Slot) {
        let i = slot as usize;
        if i >= self.links.len() {
            self.links.resize(i + 1, OUT);
        }
        if self.contains(slot) {
            self.remove(slot);
        }
        self.links[i] = Link {
            prev: self.tail,
            next: NIL,
        };
        if self.tail == NIL {
            self.head = slot;
        } else {
            self.links[self.tail as usize].next = slot;
        }
        self.tail = slot;
        self.len += 1;
    }

    fn remove(&mut self, slot: Slot) {
        if !self.contains(slot) {
            return;
        }
        let Link { prev, next } = self.links[slot as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.links[next as usize].prev = prev;
        }
        self.links[slot as usize] = OUT;
        self.len -= 1;
    }

    fn touch(&mut self, _slot: Slot) {}

    fn victim(&self) -> Option<Slot> {
        (self.head != NIL).then_some(self.head)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn name(&self) -> &'static str {
        "lru"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_in_release_order() {
        let mut lru = Lru::default();
        for s in [5, 1, 9, 3] {
            lru.insert(s);
        }
        lru.insert(1); // released again: most recent now
        lru.remove(9);
        let mut order = Vec::new();
        while let Some(v) = lru.victim() {
            order.push(v);
            lru.remove(v);
        }
        assert_eq!(order, vec![5, 3, 1]);
        assert!(lru.is_empty());
        lru.remove(42); // unknown: no effect
        assert_eq!(lru.len(), 0);
    }
}

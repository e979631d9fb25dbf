//! The invariants tying the object table, the allocator, the eviction
//! policy and clients' references together ([`Store::check_invariants`]),
//! and the property test that any sequence of operations keeps them.

use shoal_core::location::Block;

use crate::eviction::EvictionPolicy;
use crate::object_table::{ObjectState, Residency};

use super::Store;

impl Store {
    /// Checks the invariants tying table, allocator and policy together.
    /// Cheap enough for tests after every operation; O(n).
    pub fn check_invariants(&self) {
        let mut used = 0;
        let mut evictable = 0;
        let mut cold = 0;
        let mut evictable_bytes = 0;
        let mut evicting_bytes = 0;
        let mut blocks: Vec<Block> = Vec::new();
        for (_, e) in self.table.iter() {
            let block = self.block_of(e);
            assert_eq!(
                block.offset % self.allocator.line(),
                0,
                "object {} misaligned",
                e.id
            );
            used += block.len;
            blocks.push(block);
            let resident = e.residency == Residency::Resident;
            if e.refs == 0 && e.state == ObjectState::Sealed && !e.delete_pending && resident {
                evictable += 1;
                cold += e.cold as usize;
                evictable_bytes += block.len;
            }
            if e.residency == Residency::Evicting {
                evicting_bytes += block.len;
            }
            assert!(
                !(e.delete_pending && e.refs == 0 && e.residency != Residency::Evicting),
                "object {} pending delete with no refs",
                e.id
            );
        }
        let mut lent = 0;
        for block in self.clients.values().flat_map(|c| c.lent.unsealed()) {
            lent += block.len;
            blocks.push(block);
        }
        assert_eq!(lent, self.lent_bytes, "lent bytes");
        assert_eq!(
            used + lent,
            self.allocator.used(),
            "allocator and table disagree on usage"
        );
        assert_eq!(
            evictable,
            self.policy.len() + self.cold.len(),
            "policy and cold candidates differ from unreferenced sealed objects"
        );
        assert_eq!(cold, self.cold.len(), "cold candidates");
        assert_eq!(evictable_bytes, self.evictable_bytes, "evictable bytes");
        assert_eq!(evicting_bytes, self.evicting_bytes, "evicting bytes");
        blocks.sort_by_key(|b| b.offset);
        for pair in blocks.windows(2) {
            assert!(
                pair[0].offset + pair[0].len <= pair[1].offset,
                "objects overlap"
            );
        }
        let held: u64 = self
            .clients
            .values()
            .flat_map(|c| c.refs.values())
            .map(|&c| c as u64)
            .sum();
        let counted: u64 = self.table.iter().map(|(_, e)| e.refs as u64).sum();
        assert_eq!(
            held, counted,
            "client references differ from object reference counts"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{id, store, HoldAll};
    use super::super::HashMap;
    use foldhash::HashMapExt;
    use proptest::prelude::*;
    use shoal_core::ids::ObjectId;
    use shoal_core::location::ObjectLocation;

    #[derive(Debug, Clone)]
    enum Op {
        Create(u8, u8, u16),
        Seal(u8, u8, bool),
        Abort(u8, u8),
        Get(u8, u8),
        Release(u8, u8),
        Delete(u8),
        Disconnect(u8),
        Evict(u16),
        FinishEviction(u8),
        CancelEviction(u8),
        Readmit(u8),
        Cool(u8),
        /// A transfer (client 3) holds client c's unsealed object, or lets go.
        Hold(u8, u8),
        Unhold(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        let c = 0u8..3;
        let i = 0u8..12;
        prop_oneof![
            (c.clone(), i.clone(), 0u16..1500).prop_map(|(c, i, n)| Op::Create(c, i, n)),
            (c.clone(), i.clone(), any::<bool>()).prop_map(|(c, i, r)| Op::Seal(c, i, r)),
            (c.clone(), i.clone()).prop_map(|(c, i)| Op::Abort(c, i)),
            (c.clone(), i.clone()).prop_map(|(c, i)| Op::Get(c, i)),
            (c.clone(), i.clone()).prop_map(|(c, i)| Op::Release(c, i)),
            i.clone().prop_map(Op::Delete),
            c.clone().prop_map(Op::Disconnect),
            (0u16..3000).prop_map(Op::Evict),
            (0u8..12).prop_map(Op::FinishEviction),
            (0u8..12).prop_map(Op::CancelEviction),
            (0u8..12).prop_map(Op::Readmit),
            (0u8..12).prop_map(Op::Cool),
            (c, i).prop_map(|(c, i)| Op::Hold(c, i)),
            (0u8..12).prop_map(Op::Unhold),
        ]
    }

    proptest! {
        /// Any sequence of operations, valid or not, keeps the store consistent;
        /// a sealed object is never moved or resized while visible.
        #[test]
        fn random_operations_keep_invariants(
            ops in proptest::collection::vec(op(), 1..200),
            hold in any::<bool>(),
        ) {
            let mut s = store(8192);
            if hold {
                // Victims stay until a holder finishes, as with a tier.
                s.set_eviction_gate(Box::new(HoldAll(std::rc::Rc::default())));
            }
            let mut sealed: HashMap<ObjectId, ObjectLocation> = HashMap::new();
            for op in ops {
                match op {
                    Op::Create(c, i, n) => { let _ = s.create(c as u32, id(i), n as u64, 3); }
                    Op::Seal(c, i, r) => {
                        if s.seal(c as u32, &[id(i)], r).is_ok() {
                            let slot = s.table.find(&id(i)).unwrap();
                            let e = s.table.get(slot).unwrap();
                            sealed.insert(id(i), ObjectLocation { offset: e.offset, data_size: e.data_size, meta_size: e.meta_size });
                        }
                    }
                    Op::Abort(c, i) => { let _ = s.abort(c as u32, &id(i)); }
                    Op::Get(c, i) => {
                        if let Some(loc) = s.get(c as u32, &id(i)) {
                            prop_assert_eq!(Some(&loc), sealed.get(&id(i)));
                        }
                    }
                    Op::Release(c, i) => { let _ = s.release(c as u32, &id(i)); }
                    Op::Delete(i) => { let _ = s.delete(&id(i)); }
                    Op::Disconnect(c) => s.disconnect(c as u32),
                    Op::Evict(n) => { s.evict(n as u64); }
                    Op::FinishEviction(i) => {
                        if s.finish_eviction(&id(i)) {
                            sealed.remove(&id(i));
                        }
                    }
                    Op::CancelEviction(i) => {
                        if s.cancel_eviction(&id(i)) && !s.contains(&id(i)) {
                            sealed.remove(&id(i));
                        }
                    }
                    Op::Readmit(i) => { s.readmit(&id(i)); }
                    Op::Cool(i) => {
                        let cooled = s.cool(&id(i));
                        prop_assert_eq!(cooled.is_ok(), s.table.find(&id(i)).and_then(|slot| s.table.get(slot)).is_some_and(|e| e.is_visible()));
                    }
                    Op::Hold(c, i) => { let _ = s.hold_unsealed(3, c as u32, &id(i)); }
                    Op::Unhold(i) => { let _ = s.release(3, &id(i)); }
                }
                s.check_invariants();
            }
        }
    }
}

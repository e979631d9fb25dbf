//! Space the daemon lent to one client, as the daemon records it: per lease
//! (a number the daemon gave it), the parts not sealed yet.
//!
//! This record, never the client's bookkeeping, decides what a seal record
//! may claim (a range inside a part not sealed yet) and what returns to free
//! space when a lease is given back or its client dies (its parts not sealed
//! yet). So a client cannot seal space that is not its own, seal the same
//! bytes twice, or make the daemon free bytes twice, whatever it writes into
//! shared memory. Unsealed parts stay allocated until given back, so they
//! never overlap anything else; a sealed part is an object of its own from
//! then on (and its bytes may be freed and lent again, to a new lease).

use std::collections::{BTreeMap, HashSet};

use shoal_core::error::{Result, ShoalError};
use shoal_core::location::Block;

#[derive(Debug, Default)]
pub struct LentSpace {
    /// Unsealed parts: start → (end, lease).
    parts: BTreeMap<u64, (u64, u64)>,
    /// Leases not given back yet (some may have no unsealed part left).
    leases: HashSet<u64>,
    bytes: u64,
}

impl LentSpace {
    /// Records `block`, lent under number `lease` (new, unique).
    pub fn lend(&mut self, lease: u64, block: Block) {
        debug_assert!(block.len > 0 && !self.leases.contains(&lease));
        self.leases.insert(lease);
        self.parts
            .insert(block.offset, (block.offset + block.len, lease));
        self.bytes += block.len;
    }

    /// Bytes lent and not sealed yet.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Claims `part` for an object being created: it must lie inside one
    /// unclaimed part. Returns the lease it is in; changes nothing on error.
    pub fn claim(&mut self, part: Block) -> Result<u64> {
        let end = part
            .offset
            .checked_add(part.len)
            .filter(|_| part.len > 0)
            .ok_or_else(|| ShoalError::invalid("an empty or overflowing range"))?;
        let (&start, &(stop, lease)) = self
            .parts
            .range(..=part.offset)
            .next_back()
            .filter(|(_, &(stop, _))| end <= stop)
            .ok_or_else(|| {
                ShoalError::invalid(format!(
                    "bytes [{}, +{}) are not inside space lent to this client and not sealed yet",
                    part.offset, part.len
                ))
            })?;
        self.parts.remove(&start);
        if start < part.offset {
            self.parts.insert(start, (part.offset, lease));
        }
        if end < stop {
            self.parts.insert(end, (stop, lease));
        }
        self.bytes -= part.len;
        Ok(lease)
    }

    /// Gives `part`, claimed from `lease` by an object aborted since, back
    /// to that lease (merged with its neighbours, so the client may carve
    /// the same bytes again in any split). `false`: the lease was given back
    /// meanwhile, the caller frees the bytes.
    pub fn unclaim(&mut self, lease: u64, part: Block) -> bool {
        if !self.leases.contains(&lease) {
            return false;
        }
        let (mut start, mut stop) = (part.offset, part.offset + part.len);
        if let Some((&s, &(e, of))) = self.parts.range(..start).next_back() {
            if e == start && of == lease {
                self.parts.remove(&s);
                start = s;
            }
        }
        if let Some(&(e, of)) = self.parts.get(&stop) {
            if of == lease {
                self.parts.remove(&stop);
                stop = e;
            }
        }
        self.parts.insert(start, (stop, lease));
        self.bytes += part.len;
        true
    }

    /// Ends lease `lease`: its unsealed parts, to free.
    pub fn give_back(&mut self, lease: u64) -> Result<Vec<Block>> {
        if !self.leases.remove(&lease) {
            return Err(ShoalError::invalid(format!(
                "no lease {lease} to give back"
            )));
        }
        let mut freed = Vec::new();
        self.parts.retain(|&start, &mut (stop, of)| {
            if of != lease {
                return true;
            }
            freed.push(Block {
                offset: start,
                len: stop - start,
            });
            false
        });
        self.bytes -= freed.iter().map(|b| b.len).sum::<u64>();
        Ok(freed)
    }

    /// Every unsealed part (the client left: all of it goes).
    pub fn unsealed(&self) -> impl Iterator<Item = Block> + '_ {
        self.parts.iter().map(|(&start, &(stop, _))| Block {
            offset: start,
            len: stop - start,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(offset: u64, len: u64) -> Block {
        Block { offset, len }
    }

    #[test]
    fn claims_inside_and_apart_succeed_and_the_rest_is_given_back() {
        let mut lent = LentSpace::default();
        lent.lend(7, b(1024, 1024));
        lent.lend(8, b(4096, 512));
        assert_eq!(lent.claim(b(1024 + 256, 128)).unwrap(), 7);
        lent.claim(b(1024, 64)).unwrap();
        lent.claim(b(2048 - 64, 64)).unwrap();
        lent.claim(b(4096, 512)).unwrap();
        assert_eq!(lent.bytes(), 1024 - 256);
        assert_eq!(
            lent.give_back(7).unwrap(),
            vec![b(1024 + 64, 192), b(1024 + 384, 1024 - 384 - 64)]
        );
        // A lease wholly sealed is still given back (nothing to free).
        assert_eq!(lent.give_back(8).unwrap(), vec![]);
        assert!(lent.give_back(8).is_err(), "given back twice");
        assert!(lent.is_empty() && lent.bytes() == 0);
    }

    #[test]
    fn claims_outside_overlapping_empty_or_overflowing_change_nothing() {
        let mut lent = LentSpace::default();
        lent.lend(1, b(1024, 1024));
        lent.claim(b(1280, 128)).unwrap();
        for bad in [
            b(0, 64),            // before
            b(960, 128),         // straddles the start
            b(1984, 128),        // straddles the end
            b(2048, 64),         // after
            b(1280, 64),         // same start
            b(1216, 128),        // ends inside
            b(1344, 128),        // starts inside
            b(1024, 1024),       // covers it
            b(1100, 0),          // empty
            b(u64::MAX - 8, 64), // overflows
        ] {
            assert!(lent.claim(bad).is_err(), "{bad:?}");
        }
        assert_eq!(lent.bytes(), 1024 - 128);
        assert_eq!(
            lent.unsealed().collect::<Vec<_>>(),
            vec![b(1024, 256), b(1408, 640)]
        );
        assert!(lent.give_back(2).is_err(), "not its lease");
    }

    #[test]
    fn space_sealed_freed_and_lent_again_belongs_to_the_new_lease_only() {
        // Lease 1's first half was sealed (then the object freed, and the
        // bytes lent again as lease 2): giving lease 1 back frees only its
        // own unsealed half, and lease 2's space stays claimable.
        let mut lent = LentSpace::default();
        lent.lend(1, b(0, 1024));
        lent.claim(b(0, 512)).unwrap();
        lent.lend(2, b(0, 512));
        assert_eq!(lent.give_back(1).unwrap(), vec![b(512, 512)]);
        lent.claim(b(0, 64)).unwrap();
        assert_eq!(lent.give_back(2).unwrap(), vec![b(64, 448)]);
    }

    #[test]
    fn an_aborted_claim_returns_whole_and_can_be_claimed_again_in_any_split() {
        let mut lent = LentSpace::default();
        lent.lend(1, b(0, 1024));
        lent.claim(b(0, 64)).unwrap();
        lent.claim(b(64, 64)).unwrap();
        assert!(lent.unclaim(1, b(64, 64)));
        assert!(lent.unclaim(1, b(0, 64)));
        assert_eq!(lent.unsealed().collect::<Vec<_>>(), vec![b(0, 1024)]);
        lent.claim(b(0, 128)).unwrap();
        assert_eq!(lent.bytes(), 1024 - 128);
        lent.give_back(1).unwrap();
        assert!(!lent.unclaim(1, b(0, 128)), "its lease is gone");
    }
}

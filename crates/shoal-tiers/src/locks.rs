//! One slot per object id: an async lock, so operations on one object (a
//! drain, a restore, a delete) run one at a time, in the order their futures
//! first run, while operations on different objects overlap; and the
//! object's delete fence, so a write issued for an incarnation that a delete
//! has ended since is refused under the lock, before any I/O.
//!
//! A slot exists only while someone holds or waits for its lock, or holds a
//! [`WriteClaim`] on it: the fence lives exactly as long as a write it may
//! have to refuse.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use shoal_core::ids::ObjectId;
use tokio::sync::OwnedMutexGuard;

pub(crate) struct Slot {
    lock: Arc<tokio::sync::Mutex<()>>,
    /// Writes of generations below this are refused: a delete of generation
    /// `g` raises it to `g + 1`, a claim of `g` (a newer incarnation) to `g`.
    live_from: AtomicU64,
}

impl Default for Slot {
    fn default() -> Self {
        Self {
            lock: Arc::default(),
            live_from: AtomicU64::new(0),
        }
    }
}

#[derive(Default)]
pub(crate) struct IdLocks {
    map: Mutex<HashMap<ObjectId, Arc<Slot>>>,
}

/// The lock of one id, held: released on drop.
pub(crate) struct IdGuard {
    locks: Arc<IdLocks>,
    id: ObjectId,
    slot: Option<Arc<Slot>>,
    guard: Option<OwnedMutexGuard<()>>,
}

/// The right to write one incarnation (`generation`) of an object, taken
/// when the write is decided (a drain job made, a spill chosen), before it
/// runs: a delete of that generation (or a claim of a newer one) made
/// meanwhile revokes it, and the write is then refused under the id's lock.
/// Clones share the claim; it ends with the last of them.
#[derive(Clone)]
pub struct WriteClaim(Arc<Claim>);

struct Claim {
    locks: Arc<IdLocks>,
    id: ObjectId,
    generation: u64,
    slot: Option<Arc<Slot>>,
}

impl WriteClaim {
    /// The object the claimed write is for.
    pub fn id(&self) -> ObjectId {
        self.0.id
    }

    /// The incarnation the claimed write is for: the generation
    /// `TierEngine::next_generation` issued when the object was sealed in
    /// memory.
    pub fn generation(&self) -> u64 {
        self.0.generation
    }

    pub(crate) fn slot(&self) -> Arc<Slot> {
        self.0.slot.clone().expect("held until drop")
    }
}

impl std::fmt::Debug for WriteClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WriteClaim({} gen {})", self.0.id, self.0.generation)
    }
}

impl IdLocks {
    fn slot(&self, id: ObjectId) -> Arc<Slot> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_default()
            .clone()
    }

    pub(crate) async fn lock(self: &Arc<Self>, id: ObjectId) -> IdGuard {
        let slot = self.slot(id);
        self.lock_slot(id, slot).await
    }

    /// Locks `id` through a slot already taken from the map (a claim's).
    pub(crate) async fn lock_slot(self: &Arc<Self>, id: ObjectId, slot: Arc<Slot>) -> IdGuard {
        let guard = slot.lock.clone().lock_owned().await;
        IdGuard {
            locks: self.clone(),
            id,
            slot: Some(slot),
            guard: Some(guard),
        }
    }

    /// Claims a write of `id`'s incarnation `generation`; earlier
    /// incarnations' claims are revoked (one incarnation of an id lives at a
    /// time). Synchronous: the caller takes it together with its own check
    /// that the object is alive.
    pub(crate) fn claim(self: &Arc<Self>, id: ObjectId, generation: u64) -> WriteClaim {
        let slot = self.slot(id);
        slot.live_from.fetch_max(generation, Ordering::AcqRel);
        WriteClaim(Arc::new(Claim {
            locks: self.clone(),
            id,
            generation,
            slot: Some(slot),
        }))
    }

    /// Drops `id`'s slot if nobody holds, waits for or claims it. Call after
    /// releasing one's own reference.
    fn forget_if_idle(&self, id: &ObjectId) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        // Clones are taken under the map lock, so a count of 1 (the map's own)
        // means nobody holds, waits for or claims this id.
        if map.get(id).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(id);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

impl IdGuard {
    fn slot(&self) -> &Slot {
        self.slot.as_ref().expect("held until drop")
    }

    /// Whether a write of `generation` may still run (checked under the lock).
    pub(crate) fn admits(&self, generation: u64) -> bool {
        generation >= self.slot().live_from.load(Ordering::Acquire)
    }

    /// Ends every incarnation up to `generation`: their claims are revoked.
    pub(crate) fn end_through(&self, generation: u64) {
        self.slot()
            .live_from
            .fetch_max(generation.saturating_add(1), Ordering::AcqRel);
    }
}

impl Drop for IdGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
        drop(self.slot.take());
        self.locks.forget_if_idle(&self.id);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        drop(self.slot.take());
        self.locks.forget_if_idle(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serialises_one_id_and_forgets_idle_ones() {
        let locks = Arc::new(IdLocks::default());
        let (a, b) = (ObjectId::random(), ObjectId::random());
        let first = locks.lock(a).await;
        let _other = locks.lock(b).await; // a different id does not wait
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let _g = locks.lock(a).await;
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(first);
        waiter.await.unwrap();
        assert_eq!(locks.len(), 1); // only b, still held
    }

    #[tokio::test]
    async fn a_claim_keeps_the_fence_until_it_ends() {
        let locks = Arc::new(IdLocks::default());
        let id = ObjectId::random();
        let old = locks.claim(id, 5);
        {
            let guard = locks.lock(id).await;
            assert!(guard.admits(old.generation()));
            guard.end_through(5); // a delete of generation 5
        }
        assert_eq!(locks.len(), 1, "kept by the claim");
        let guard = locks.lock_slot(id, old.slot()).await;
        assert!(!guard.admits(5), "the deleted incarnation is refused");
        assert!(guard.admits(6), "a newer one is not");
        drop(guard);
        let newer = locks.claim(id, 9);
        assert!(
            !locks.lock(id).await.admits(8),
            "a newer claim ends older ones"
        );
        drop((old, newer));
        assert_eq!(locks.len(), 0, "no claim, no lock: no slot");
    }
}

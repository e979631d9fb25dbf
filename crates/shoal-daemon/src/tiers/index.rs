//! What the node knows of its objects below memory, kept on the store
//! thread so eviction decides without I/O: per object its sizes and the
//! tiers holding a durable copy (a mirror of the manifest's records), the
//! durability promised at its seal, and the drain jobs in flight.

use std::collections::hash_map::Entry;

use foldhash::HashMap;
use shoal_core::durability::Durability;
use shoal_core::error::ShoalError;
use shoal_core::ObjectId;
use shoal_tiers::{ObjectRecord, ObjectSizes, TierLevel, TierSet};

#[derive(Debug)]
pub(super) struct Tracked {
    pub sizes: ObjectSizes,
    /// Tiers with a complete, durable copy (empty: dirty, memory only).
    /// Private: changed through [`Index::set_tiers`], which keeps the count
    /// of durable objects.
    tiers: TierSet,
    /// The durability its seal asked for (the highest asked).
    pub durability: Durability,
    /// Tells this object apart from an earlier one of the same id (deleted
    /// and created again): issued by the engine, claimed by its writes and
    /// ended by its delete (docs/tiers.md, "Deletes are final"), and in
    /// drain events.
    pub generation: u64,
    /// Why its last write down failed, until one succeeds (wait_durable
    /// reports it instead of waiting forever).
    pub failure: Option<ShoalError>,
    /// Tick of its last use, for burst-buffer pressure (oldest leaves first).
    pub used: u64,
    /// A drain job for that tier is queued or running.
    pub in_flight: [bool; 2],
    /// The burst buffer was full for it: drain straight to the backing store.
    pub skip_burst: bool,
    /// The removed node whose backing store (adopted by this node) holds
    /// it; `None`: this node's own tiers.
    pub origin: Option<u32>,
    /// A write down was claimed for this incarnation (`Tiers::claim`), so
    /// a tier may hold an image of it. Never set and with no copy, nothing
    /// of it was ever written anywhere: its delete has nothing to commit.
    pub claimed: bool,
}

/// Which of a tier's two queues a drain job is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Lane {
    /// Write-behind nobody waits for: runs below the daemon's priority.
    Background = 0,
    /// A seal, `wait_durable` or `stage_out` waits for it: at the daemon's
    /// priority.
    Urgent = 1,
}

impl Lane {
    pub(super) const ALL: [Lane; 2] = [Lane::Background, Lane::Urgent];
}

/// A drain job the node submitted.
#[derive(Debug, Clone, Copy)]
pub(super) struct Job {
    pub id: ObjectId,
    pub lane: Lane,
    pub generation: u64,
    pub target: TierLevel,
    /// The job reads memory pinned by a reference of the tiers principal,
    /// released when its outcome arrives.
    pub pinned: bool,
    /// The bytes it pins.
    pub bytes: u64,
    /// Its object had no copy below when it was submitted: counted in
    /// [`Index::dirty_waiting`]'s bytes on their way down until its outcome.
    pub cleaning: bool,
}

/// Counts kept with every change of the objects, so the metrics (read every
/// second) and write-behind need no walk over a million objects.
#[derive(Default)]
struct Tallies {
    /// Objects with a copy on some tier.
    durable: u64,
    /// Objects of adopted stores (`Tracked::origin`).
    adopted: u64,
    /// Payload bytes of dirty objects (no copy below: memory only).
    dirty: u64,
}

impl Tallies {
    /// Counts `t` in.
    fn add(&mut self, t: &Tracked) {
        let (durable, adopted, dirty) = Self::of(t);
        self.durable += durable;
        self.adopted += adopted;
        self.dirty += dirty;
    }

    /// Counts `t` out (as it was when counted in).
    fn remove(&mut self, t: &Tracked) {
        let (durable, adopted, dirty) = Self::of(t);
        self.durable -= durable;
        self.adopted -= adopted;
        self.dirty -= dirty;
    }

    /// What one object adds: durable, adopted, dirty bytes.
    fn of(t: &Tracked) -> (u64, u64, u64) {
        let dirty = if t.tiers.is_empty() {
            t.sizes.payload_len()
        } else {
            0
        };
        (
            u64::from(!t.tiers.is_empty()),
            u64::from(t.origin.is_some()),
            dirty,
        )
    }
}

impl Tracked {
    /// Tiers with a complete, durable copy (empty: dirty, memory only).
    pub(super) fn tiers(&self) -> TierSet {
        self.tiers
    }
}

#[derive(Default)]
pub(super) struct Index {
    objects: HashMap<ObjectId, Tracked>,
    /// Kept by every insert, removal and change of a `Tracked::tiers`.
    tallies: Tallies,
    /// Payload bytes of dirty objects a drain job is writing down now
    /// (write-behind drains early once the rest pass a share).
    cleaning: u64,
    /// By (lane, target tier, the job's number in that queue).
    jobs: HashMap<(Lane, TierLevel, u64), Job>,
    tick: u64,
}

impl Index {
    pub(super) fn get(&self, id: &ObjectId) -> Option<&Tracked> {
        self.objects.get(id)
    }

    pub(super) fn get_mut(&mut self, id: &ObjectId) -> Option<&mut Tracked> {
        self.objects.get_mut(id)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&ObjectId, &Tracked)> {
        self.objects.iter()
    }

    /// Objects with a copy on some tier.
    pub(super) fn durable(&self) -> u64 {
        self.tallies.durable
    }

    /// Objects of adopted backing stores.
    pub(super) fn adopted(&self) -> u64 {
        self.tallies.adopted
    }

    /// Payload bytes of objects with no copy below yet.
    #[cfg(test)]
    pub(super) fn dirty_bytes(&self) -> u64 {
        self.tallies.dirty
    }

    /// Payload bytes of objects with no copy below and no drain job writing
    /// one: what write-behind has not started on.
    pub(super) fn dirty_waiting(&self) -> u64 {
        self.tallies.dirty.saturating_sub(self.cleaning)
    }

    /// Records the tiers holding `id`'s copies (from a record the engine
    /// returned); the object, or `None` if it is not tracked (deleted
    /// meanwhile).
    pub(super) fn set_tiers(&mut self, id: &ObjectId, tiers: TierSet) -> Option<&mut Tracked> {
        let t = self.objects.get_mut(id)?;
        self.tallies.remove(t);
        t.tiers = tiers;
        self.tallies.add(t);
        Some(t)
    }

    /// Marks a use of `id` (a seal, a restore) for the burst buffer's order.
    pub(super) fn touch(&mut self, id: &ObjectId) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(t) = self.objects.get_mut(id) {
            t.used = tick;
        }
    }

    /// A newly sealed object, dirty (no copy below yet), of a `generation`
    /// the engine issued. An object already tracked (sealed by a restore)
    /// keeps what is known of it, its generation too.
    pub(super) fn sealed(
        &mut self,
        id: ObjectId,
        sizes: ObjectSizes,
        generation: u64,
    ) -> &mut Tracked {
        self.tick += 1;
        let used = self.tick;
        match self.objects.entry(id) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(new) => {
                let t = new.insert(Tracked {
                    sizes,
                    tiers: TierSet::EMPTY,
                    durability: Durability::Memory,
                    generation,
                    failure: None,
                    used,
                    in_flight: [false; 2],
                    skip_burst: false,
                    origin: None,
                    claimed: false,
                });
                self.tallies.add(t);
                t
            }
        }
    }

    /// An object found in the manifest at start (on tiers only).
    /// Room for `more` objects (a restart loads a million at once).
    pub(super) fn reserve(&mut self, more: usize) {
        self.objects.reserve(more);
    }

    pub(super) fn recovered(&mut self, id: ObjectId, record: &ObjectRecord) {
        self.recovered_from(None, id, record);
    }

    /// An object on the tiers of `origin` (`None`: this node's own), from
    /// the record its engine holds.
    pub(super) fn recovered_from(
        &mut self,
        origin: Option<u32>,
        id: ObjectId,
        record: &ObjectRecord,
    ) {
        self.remove(&id);
        let tracked = Tracked {
            sizes: record.sizes,
            tiers: record.tiers,
            durability: record.durability,
            generation: record.generation,
            failure: None,
            used: 0,
            in_flight: [false; 2],
            skip_burst: false,
            origin,
            // Its engine holds a record: a delete must commit there.
            claimed: true,
        };
        self.tallies.add(&tracked);
        self.objects.insert(id, tracked);
    }

    /// Tracks `id` again as it was before [`remove`](Self::remove) (its
    /// delete failed), unless a newer object of that id is tracked by now.
    pub(super) fn reinstate(&mut self, id: ObjectId, mut tracked: Tracked) {
        if let Some(newer) = self.objects.get_mut(&id) {
            // The older one's writes may have left a record: the newer's
            // delete must go through the engine, which removes it too.
            newer.claimed |= tracked.claimed;
            return;
        }
        // Its jobs were cancelled or are refused: none is in flight.
        tracked.in_flight = [false; 2];
        self.tallies.add(&tracked);
        self.objects.insert(id, tracked);
    }

    /// Forgets `id` (deleted, or lost). Its jobs' outcomes are then ignored.
    pub(super) fn remove(&mut self, id: &ObjectId) -> Option<Tracked> {
        let removed = self.objects.remove(id)?;
        self.tallies.remove(&removed);
        Some(removed)
    }

    pub(super) fn add_job(&mut self, seq: u64, mut job: Job) {
        if let Some(t) = self.objects.get_mut(&job.id) {
            t.in_flight[job.target as usize] = true;
            job.cleaning = t.tiers.is_empty();
        }
        if job.cleaning {
            self.cleaning += job.bytes;
        }
        self.jobs.insert((job.lane, job.target, seq), job);
    }

    /// The job of an outcome; `current` says whether it is for the object
    /// tracked now under its id (not one deleted since).
    pub(super) fn finish_job(
        &mut self,
        lane: Lane,
        target: TierLevel,
        seq: u64,
    ) -> Option<(Job, bool)> {
        let job = self.jobs.remove(&(lane, target, seq))?;
        if job.cleaning {
            self.cleaning -= job.bytes;
        }
        let current = match self.objects.get_mut(&job.id) {
            Some(t) if t.generation == job.generation => {
                t.in_flight[job.target as usize] = false;
                true
            }
            _ => false,
        };
        Some((job, current))
    }

    /// Objects with copies on both tiers, oldest use first: what burst-buffer
    /// pressure may drop from the burst buffer.
    pub(super) fn burst_evictable(&self) -> Vec<(ObjectId, u64)> {
        let both = TierSet::of(TierLevel::Burst).with(TierLevel::Backing);
        let mut found: Vec<(u64, ObjectId, u64)> = self
            .objects
            .iter()
            .filter(|(_, t)| t.tiers == both && !t.in_flight.iter().any(|f| *f))
            .map(|(id, t)| (t.used, *id, t.sizes.stored_len()))
            .collect();
        found.sort_unstable_by_key(|(used, _, _)| *used);
        found.into_iter().map(|(_, id, len)| (id, len)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ObjectId {
        ObjectId([n; 20])
    }

    fn sizes() -> ObjectSizes {
        ObjectSizes {
            data_size: 10,
            meta_size: 0,
        }
    }

    /// The dirty bytes a walk over every object finds.
    fn walked_dirty(index: &Index) -> u64 {
        index
            .objects
            .values()
            .filter(|t| t.tiers.is_empty())
            .map(|t| t.sizes.payload_len())
            .sum()
    }

    #[test]
    fn dirty_bytes_a_drain_job_is_writing_do_not_count_as_waiting() {
        let mut index = Index::default();
        index.sealed(id(1), sizes(), 1);
        index.sealed(id(2), sizes(), 2);
        let job = |n: u8, generation: u64| Job {
            id: id(n),
            lane: Lane::Background,
            generation,
            target: TierLevel::Burst,
            pinned: true,
            bytes: 10,
            cleaning: false,
        };
        index.add_job(7, job(1, 1));
        assert_eq!((index.dirty_bytes(), index.dirty_waiting()), (20, 10));
        // Its copy lands, then its outcome: clean, nothing on its way.
        index.set_tiers(&id(1), TierSet::of(TierLevel::Burst));
        assert_eq!((index.dirty_bytes(), index.dirty_waiting()), (10, 0));
        assert!(index
            .finish_job(Lane::Background, TierLevel::Burst, 7)
            .is_some());
        assert_eq!((index.dirty_bytes(), index.dirty_waiting()), (10, 10));
        // A job whose object is deleted while it runs.
        index.add_job(8, job(2, 2));
        index.remove(&id(2));
        assert_eq!((index.dirty_bytes(), index.dirty_waiting()), (0, 0));
        let (_, current) = index
            .finish_job(Lane::Background, TierLevel::Burst, 8)
            .unwrap();
        assert!(!current);
        assert_eq!((index.dirty_bytes(), index.dirty_waiting()), (0, 0));
        assert_eq!(index.cleaning, 0);
    }

    #[test]
    fn a_claim_of_an_incarnation_whose_delete_failed_passes_to_the_next() {
        let mut index = Index::default();
        index.sealed(id(1), sizes(), 1).claimed = true;
        // Its delete takes it out of the index, then fails below (it is
        // reinstated), but the id was created again meanwhile, unwritten.
        let old = index.remove(&id(1)).unwrap();
        assert!(!index.sealed(id(1), sizes(), 2).claimed);
        index.reinstate(id(1), old);
        let newer = index.get(&id(1)).unwrap();
        assert_eq!(newer.generation, 2, "the newer incarnation stays");
        assert!(
            newer.claimed,
            "its delete must reach the older one's record"
        );
        // Records found at start count as claimed.
        let record = ObjectRecord {
            sizes: sizes(),
            checksum: 0,
            tiers: TierSet::of(TierLevel::Burst),
            durability: Durability::Memory,
            sealed_at_ms: 0,
            modified_ms: 0,
            name: None,
            generation: 5,
        };
        index.recovered(id(2), &record);
        assert!(index.get(&id(2)).unwrap().claimed);
    }

    #[test]
    fn the_durable_count_follows_every_change_of_an_objects_tiers() {
        let burst = TierSet::of(TierLevel::Burst);
        let both = burst.with(TierLevel::Backing);
        let mut index = Index::default();
        index.sealed(id(1), sizes(), 1);
        index.sealed(id(2), sizes(), 2);
        assert_eq!(index.durable(), 0, "dirty objects are not durable");
        assert_eq!(index.dirty_bytes(), 20);
        assert!(index.set_tiers(&id(1), burst).is_some());
        assert!(index.set_tiers(&id(1), both).is_some());
        assert_eq!(index.durable(), 1, "a second tier is the same object");
        assert!(index.set_tiers(&id(2), burst).is_some());
        assert_eq!(index.durable(), 2);
        assert!(index.set_tiers(&id(2), TierSet::EMPTY).is_some());
        assert_eq!(index.durable(), 1, "evicted from its last tier");
        assert_eq!(index.dirty_bytes(), 10, "dirty again");
        assert!(
            index.set_tiers(&id(9), burst).is_none(),
            "unknown ids change nothing"
        );
        assert_eq!(index.durable(), 1);
        // Sealed again (a restore) keeps what is known.
        index.sealed(id(1), sizes(), 3);
        assert_eq!(index.get(&id(1)).unwrap().generation, 1);
        assert_eq!(index.durable(), 1);
        let record = ObjectRecord {
            sizes: sizes(),
            checksum: 0,
            tiers: both,
            durability: Durability::Local,
            sealed_at_ms: 0,
            modified_ms: 0,
            name: None,
            generation: 4,
        };
        index.recovered(id(3), &record);
        index.recovered(id(3), &record);
        assert_eq!(index.durable(), 2, "recovered twice counts once");
        assert_eq!(index.dirty_bytes(), walked_dirty(&index));
        index.recovered(
            id(1),
            &ObjectRecord {
                tiers: TierSet::EMPTY,
                ..record.clone()
            },
        );
        assert_eq!(index.durable(), 1, "replaced by a record with no copy");
        assert_eq!(index.dirty_bytes(), 20, "both with no copy");
        let (removed, again) = (index.remove(&id(1)).unwrap(), index.objects.len());
        assert_eq!(index.dirty_bytes(), 10);
        index.reinstate(id(1), removed);
        assert_eq!((index.objects.len(), index.dirty_bytes()), (again + 1, 20));
        assert!(index.remove(&id(3)).is_some());
        assert!(index.remove(&id(2)).is_some());
        assert!(index.remove(&id(3)).is_none());
        assert_eq!(index.durable(), 0);
        assert_eq!(index.dirty_bytes(), walked_dirty(&index));
        assert_eq!(
            index.durable(),
            index
                .objects
                .values()
                .filter(|t| !t.tiers.is_empty())
                .count() as u64
        );
    }
}

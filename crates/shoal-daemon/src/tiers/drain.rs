//! The write-behind drain, one feeder per tier: ids wait in a backlog (ids
//! only, so waiting costs no memory), and the feeder turns each into a job
//! when the tier's bounded queue has room — a copy from the tier above, or a
//! write from memory pinned by a reference of the tiers principal. Outcomes
//! update the index, release the pins, and queue the next tier down.

use std::rc::Rc;
use std::time::{Duration, Instant};

use shoal_core::error::ErrorKind;
use shoal_core::ObjectId;
use shoal_tiers::{DrainEvent, DrainJob, ObjectSizes, TierLevel, TierSet, WriteInfo};
use tokio::sync::mpsc;

use crate::principals;
use crate::tiers::index::{Job, Lane};
use crate::tiers::Tiers;

/// Puts this recent make write-behind wait (`yield_to_puts`)...
const QUIET: Duration = Duration::from_millis(50);
/// ...for at most this long at a time.
const YIELD_MAX: Duration = Duration::from_secs(2);

/// Drain jobs pin at most 1/PIN_SHARE of the store's capacity, within
/// [PIN_MIN, PIN_MAX].
const PIN_SHARE: u64 = 8;
const PIN_MIN: u64 = 8 << 20;
const PIN_MAX: u64 = 256 << 20;

impl Tiers {
    /// Feeds the queue of tier `level` from its backlog, waiting while the
    /// queue is full (back-pressure: ids wait, memory stays where it is).
    pub(super) async fn feed(self: Rc<Self>, lane: Lane, level: TierLevel) {
        loop {
            let id = self.next_due(lane, level).await;
            if lane == Lane::Background {
                self.yield_to_puts().await;
            }
            self.pin_room(lane, id, level).await;
            let Some((job, pinned, generation)) = self.job_for(lane, id, level) else {
                continue;
            };
            let sizes = self.sizes(&id).unwrap_or(ObjectSizes {
                data_size: 0,
                meta_size: 0,
            });
            let drainer = self
                .drainer(lane, level)
                .expect("a feeder per configured tier");
            // Recorded first: the outcome may arrive before `submit` returns
            // here (this is the drainer's only submitter, so the number is exact).
            let seq = drainer.next_seq();
            self.index.borrow_mut().add_job(
                seq,
                Job {
                    id,
                    lane,
                    generation,
                    target: level,
                    pinned,
                    bytes: sizes.payload_len(),
                    cleaning: false,
                },
            );
            match drainer.submit(job).await {
                Ok(got) => debug_assert_eq!(got, seq),
                Err(err) => {
                    // Only at shutdown: the drainer has stopped.
                    tracing::debug!(%id, %err, "drain submit");
                    self.index.borrow_mut().finish_job(lane, level, seq);
                    if pinned {
                        self.unpin(lane, &id, sizes.payload_len());
                    }
                    return;
                }
            }
        }
    }

    /// The next id of the backlog of `lane` and `level`, waiting for one.
    /// Write-behind (the background lane) takes a dirty object (memory
    /// only) once it has waited `drain_after` (`TierConfig`), or at once
    /// while dirty objects no job is writing yet hold more than
    /// `dirty_percent` of the store (oldest first, so eviction keeps finding
    /// clean objects); any other id at once (one with a copy below already,
    /// going a tier further down, or one no longer tracked). Why: an object
    /// deleted before its turn is never written, which is most of a
    /// shuffle's pieces (bench/results/dask-pressure.md), the way the
    /// kernel's dirty-page expiry and background ratio spare short-lived
    /// files.
    async fn next_due(&self, lane: Lane, level: TierLevel) -> ObjectId {
        let (l, t) = (lane as usize, level as usize);
        let after = self.config.drain_after;
        loop {
            let front = self.backlog[l][t].borrow().front().copied();
            let Some((queued, id)) = front else {
                self.bell[l][t].notified().await;
                continue;
            };
            let due = queued + after;
            let dirty = self.index.borrow().get(&id).map(|t| t.tiers().is_empty());
            let taken = lane == Lane::Urgent
                || after.is_zero()
                || dirty != Some(true)
                || Instant::now() >= due
                || self.over_dirty_share();
            if taken {
                self.backlog[l][t].borrow_mut().pop_front();
                return id;
            }
            // A seal rings the bell: it may have passed the dirty share.
            tokio::select! {
                _ = tokio::time::sleep_until(due.into()) => {}
                _ = self.bell[l][t].notified() => {}
            }
        }
    }

    /// Whether dirty objects no drain job is writing yet hold more than
    /// `dirty_percent` of the store (those being written will be clean).
    fn over_dirty_share(&self) -> bool {
        let capacity = self.node.read(|store| store.capacity());
        let limit = capacity / 100 * u64::from(self.config.dirty_percent);
        self.index.borrow().dirty_waiting() > limit
    }

    /// Write-behind yields to a burst of puts: while objects were sealed in
    /// the last `QUIET`, a background job waits — at most `YIELD_MAX` at a
    /// time, and not at all once the store is more than half full (then
    /// eviction needs clean objects more than the puts need the machine).
    /// Why: the drain's copies and checksums compete with the puts for the
    /// memory bandwidth and caches, which a lower CPU priority does not
    /// share out.
    async fn yield_to_puts(&self) {
        let started = Instant::now();
        loop {
            let since = self.last_seal.get().elapsed();
            if since >= QUIET || started.elapsed() >= YIELD_MAX {
                return;
            }
            let (used, capacity) = self.node.read(|store| (store.used(), store.capacity()));
            if used.saturating_mul(2) > capacity {
                return;
            }
            tokio::time::sleep(QUIET - since).await;
        }
    }

    /// Waits until the memory that drain jobs pin leaves room for `id`'s,
    /// if its job to `level` will read memory: the queue holds whole group
    /// commits of small objects, but never pins more than a share of the
    /// store (creates wait for pinned bytes) — one job always may.
    /// (Per lane: a background lane full of pins never holds up a seal.)
    async fn pin_room(&self, lane: Lane, id: ObjectId, level: TierLevel) {
        loop {
            let bytes = {
                let index = self.index.borrow();
                match index.get(&id) {
                    Some(t) if !self.copies_from_burst(level, t.tiers(), &id) => {
                        t.sizes.payload_len()
                    }
                    _ => return,
                }
            };
            let budget =
                (self.node.read(|store| store.capacity()) / PIN_SHARE).clamp(PIN_MIN, PIN_MAX);
            let pinned = self.pinned[lane as usize].get();
            if pinned == 0 || pinned + bytes <= budget {
                return;
            }
            // Single-threaded: no unpin can slip in before this waits.
            self.unpinned.notified().await;
        }
    }

    /// Whether the job bringing `id` to `level` copies its burst image (see
    /// [`copies_from_burst`]) rather than writing it from memory.
    fn copies_from_burst(&self, level: TierLevel, tiers: TierSet, id: &ObjectId) -> bool {
        let (resident, used, capacity) = self
            .node
            .read(|store| (store.contains(id), store.used(), store.capacity()));
        copies_from_burst(level, tiers, resident, used, capacity)
    }

    /// The job that brings `id` to `level`, if it still needs one.
    fn job_for(&self, lane: Lane, id: ObjectId, level: TierLevel) -> Option<(DrainJob, bool, u64)> {
        let (tiers, in_flight, skip_burst, durability, generation, sizes) = {
            let index = self.index.borrow();
            let t = index.get(&id)?;
            (
                t.tiers(),
                t.in_flight[level as usize],
                t.skip_burst,
                t.durability,
                t.generation,
                t.sizes,
            )
        };
        if in_flight || self.next_level(tiers, skip_burst) != Some(level) {
            return None;
        }
        if self.copies_from_burst(level, tiers, &id) {
            return Some((
                DrainJob::Copy {
                    id,
                    generation,
                    from: TierLevel::Burst,
                    to: TierLevel::Backing,
                },
                false,
                generation,
            ));
        }
        // From memory: pinned so it is neither evicted nor freed meanwhile.
        let location = self
            .node
            .mutate(|store| store.get_for_copy(principals::TIERS, &id))?;
        debug_assert_eq!(location.size(), sizes.payload_len());
        let pinned = &self.pinned[lane as usize];
        pinned.set(pinned.get() + location.size());
        // SAFETY: the reference just taken keeps the block allocated, and a
        // sealed object is never written; it is released only when the
        // job's outcome arrives, after the engine dropped the range.
        let src = unsafe { self.source(location) };
        Some((
            DrainJob::Write {
                // Claimed now, while the index says the object is alive: a
                // delete from here on makes the job write nothing.
                claim: self.claim(id, generation),
                level,
                sizes: ObjectSizes {
                    data_size: location.data_size,
                    meta_size: location.meta_size,
                },
                src,
                info: WriteInfo {
                    durability,
                    name: self.node.name_of(&id),
                    modified_ms: self.node.mtime_of(&id),
                    ..Default::default()
                },
            },
            true,
            generation,
        ))
    }

    fn unpin(&self, lane: Lane, id: &ObjectId, bytes: u64) {
        let pinned = &self.pinned[lane as usize];
        pinned.set(pinned.get().saturating_sub(bytes));
        self.unpinned.notify_waiters();
        if let Err(err) = self
            .node
            .mutate(|store| store.release(principals::TIERS, id))
        {
            tracing::error!(%id, %err, "drain pin not released");
        }
    }

    /// Applies the drain's outcomes as they arrive.
    pub(super) async fn outcomes(
        self: Rc<Self>,
        lane: Lane,
        mut events: mpsc::Receiver<DrainEvent>,
    ) {
        while let Some(event) = events.recv().await {
            self.outcome(lane, event);
        }
    }

    fn outcome(self: &Rc<Self>, lane: Lane, event: DrainEvent) {
        let Some((job, current)) =
            self.index
                .borrow_mut()
                .finish_job(lane, event.target, event.seq)
        else {
            tracing::error!(id = %event.id, seq = event.seq, "outcome of an unknown drain job");
            return;
        };
        if job.pinned {
            self.unpin(job.lane, &job.id, job.bytes);
        }
        if !current {
            return; // deleted since: its delete removes whatever was written
        }
        let id = job.id;
        match event.result {
            Ok(record) => {
                let newly_clean = {
                    let mut index = self.index.borrow_mut();
                    let was_dirty = index.get(&id).expect("current").tiers().is_empty();
                    index.set_tiers(&id, record.tiers).expect("current").failure = None;
                    was_dirty
                };
                // Renamed or given a time while the job ran (`names_changed`
                // skips objects with no copy yet): the record holds what the
                // job was made with. Both are read again when the fix runs.
                let modified = self.node.mtime_of(&id);
                if record.name != self.node.name_of(&id)
                    || modified.is_some_and(|ms| ms != record.modified_ms)
                {
                    let (engine, node) = (self.engine.clone(), self.node.clone());
                    self.supervisor.spawn_local("record a rename", async move {
                        let (name, modified) = (node.name_of(&id), node.mtime_of(&id));
                        if let Err(err) = engine.set_name(id, name, modified).await {
                            tracing::warn!(%id, %err, "the record keeps its old name or time");
                        }
                    });
                }
                {
                    let mut counters = self.counters.borrow_mut();
                    counters.drained_objects += 1;
                    counters.drained_bytes += record.sizes.payload_len();
                    counters
                        .recent
                        .push_back((Instant::now(), record.sizes.payload_len()));
                }
                if newly_clean {
                    // A copy exists now: if a failed spill kept it in
                    // memory, it may leave for free.
                    self.node.mutate(|store| store.readmit(&id));
                }
                self.changed.notify_waiters();
                self.queue(id, false);
                self.relieve_burst_if_high();
            }
            Err(err) => {
                tracing::warn!(%id, target = %event.target, attempts = event.attempts, %err, "drain failed");
                self.counters.borrow_mut().failures += 1;
                let full_burst =
                    err.kind() == ErrorKind::StoreFull && event.target == TierLevel::Burst;
                if let Some(t) = self.index.borrow_mut().get_mut(&id) {
                    t.failure = Some(err);
                    // Straight to the backing store from now on.
                    t.skip_burst |= full_burst;
                }
                self.changed.notify_waiters();
                if full_burst {
                    self.relieve_burst_if_high();
                    self.queue(id, true);
                }
            }
        }
    }
}

/// Whether an object's backing copy is made from its burst image rather
/// than from memory: when it has a burst image and memory no longer holds
/// it (`resident`), or memory is more than half full (then eviction needs
/// the object unpinned more than the drain needs the cheaper source).
/// Why memory first: a copy reads the whole image back into a fresh buffer
/// (page faults, a copy and a checksum) before writing it again; with eight
/// writers on a FUSE mount the drain's CPU fell from 42 % to 18 % of the
/// samples without it (perf), all of it spent beside the writers.
fn copies_from_burst(
    level: TierLevel,
    tiers: TierSet,
    resident: bool,
    used: u64,
    capacity: u64,
) -> bool {
    level == TierLevel::Backing
        && tiers.contains(TierLevel::Burst)
        && (!resident || used.saturating_mul(2) > capacity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backing_copy_comes_from_memory_while_memory_holds_it_and_has_room() {
        let on_burst = TierSet::of(TierLevel::Burst);
        let (backing, burst) = (TierLevel::Backing, TierLevel::Burst);
        assert!(!copies_from_burst(backing, on_burst, true, 10, 100));
        assert!(
            !copies_from_burst(backing, on_burst, true, 50, 100),
            "half full"
        );
        assert!(
            copies_from_burst(backing, on_burst, true, 51, 100),
            "over half"
        );
        assert!(
            copies_from_burst(backing, on_burst, false, 10, 100),
            "evicted"
        );
        // Nothing to copy from: written from memory (or not at all).
        assert!(!copies_from_burst(backing, TierSet::EMPTY, false, 10, 100));
        assert!(!copies_from_burst(burst, on_burst, false, 90, 100));
    }
}

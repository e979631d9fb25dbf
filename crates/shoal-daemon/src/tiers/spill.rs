//! Spilling: a dirty object chosen for eviction is written to the nearest
//! tier that takes it while the node holds its memory, then freed. If no
//! tier takes it, it stays in memory (kept out of eviction for a while), and
//! nothing sealed is lost.

use std::rc::Rc;
use std::time::Instant;

use futures_util::StreamExt;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::store::Victim;
use shoal_core::ObjectId;
use shoal_tiers::{
    ObjectRecord, ObjectSizes, SourceRange, TierLevel, TierSet, WriteInfo, WriteItem,
};

use crate::tiers::Tiers;

/// Spills written at once.
const SPILL_PARALLEL: usize = 4;

impl Tiers {
    /// Called from the eviction gate (the store is borrowed): only queues.
    pub(super) fn spill_later(self: &Rc<Self>, victim: Victim) {
        let mut spills = self.spills.borrow_mut();
        spills.push(victim);
        if spills.len() > 1 {
            return; // the task spawned for the first takes it too
        }
        let tiers = self.clone();
        self.supervisor.spawn_local("spill", async move {
            loop {
                let batch = std::mem::take(&mut *tiers.spills.borrow_mut());
                if batch.is_empty() {
                    return;
                }
                let retry = tiers.spill_batch(batch).await;
                futures_util::stream::iter(retry)
                    .for_each_concurrent(SPILL_PARALLEL, |victim| tiers.spill(victim))
                    .await;
            }
        });
    }

    /// Spills a batch of victims as group commits: the victims bound for
    /// the same first tier go down in one `write_batch`. Returns the victims
    /// whose write failed, for one-by-one spills (which make room on the
    /// burst buffer, or fall through to the backing store).
    async fn spill_batch(&self, victims: Vec<Victim>) -> Vec<Victim> {
        let mut groups: [Vec<Victim>; 2] = Default::default();
        let mut retry = Vec::new();
        for victim in victims {
            // The nearest tier that may take it, as the drain picks it.
            match self.next_level(TierSet::EMPTY, self.spill_info(&victim).2) {
                Some(level) => groups[level as usize].push(victim),
                None => retry.push(victim), // `spill` reports why
            }
        }
        for (level, group) in TierLevel::ALL.into_iter().zip(groups) {
            if group.is_empty() {
                continue;
            }
            let items = group
                .iter()
                .map(|victim| {
                    let (sizes, info, _) = self.spill_info(victim);
                    WriteItem {
                        id: victim.id,
                        sizes,
                        // SAFETY: as in `spill`: the victim is held until
                        // `finish_spill` (or the retry) ends its eviction.
                        src: unsafe { self.source(victim.location) },
                        info,
                    }
                })
                .collect();
            let written = self.engine.write_batch(level, items).await;
            for (victim, result) in group.into_iter().zip(written) {
                match result {
                    Ok(record) => self.finish_spill(victim, Ok(record)),
                    Err(err) => {
                        tracing::debug!(id = %victim.id, %level, %err, "batched spill failed; retrying alone");
                        retry.push(victim);
                    }
                }
            }
        }
        retry
    }

    /// The sizes of a victim, what its write records, and whether it skips
    /// the burst buffer (which was full for it).
    fn spill_info(&self, victim: &Victim) -> (ObjectSizes, WriteInfo, bool) {
        let (durability, skip_burst) = self
            .index
            .borrow()
            .get(&victim.id)
            .map_or((Default::default(), false), |t| {
                (t.durability, t.skip_burst)
            });
        (
            ObjectSizes {
                data_size: victim.location.data_size,
                meta_size: victim.location.meta_size,
            },
            WriteInfo {
                durability,
                name: self.node.name_of(&victim.id),
                ..Default::default()
            },
            skip_burst,
        )
    }

    async fn spill(&self, victim: Victim) {
        let (sizes, info, skip_burst) = self.spill_info(&victim);
        // SAFETY: the victim is held (`Verdict::Hold`): its block stays
        // allocated and unchanged until `finish_eviction`/`cancel_eviction`,
        // both called by `finish_spill`, after the write returned (and so
        // dropped its range) — or never, if the daemon stops first.
        let src = unsafe { self.source(victim.location) };
        let result = self
            .write_down(victim.id, sizes, src, info, skip_burst)
            .await;
        self.finish_spill(victim, result);
    }

    /// Ends a victim's eviction after its spill: freed if a tier took it,
    /// kept in memory (and out of eviction for a while) if none did.
    fn finish_spill(&self, victim: Victim, result: Result<ObjectRecord>) {
        let id = victim.id;
        match result {
            Ok(record) => {
                // (Deleted while spilling: the delete removes the copy.)
                if let Some(t) = self.index.borrow_mut().set_tiers(&id, record.tiers) {
                    t.failure = None;
                }
                self.counters.borrow_mut().spilled_bytes += victim.location.size();
                self.changed.notify_waiters();
                self.node.finish_eviction(&id);
                // A copy on the burst buffer only goes on to the backing store.
                self.queue(id, false);
            }
            Err(err) => {
                tracing::warn!(%id, %err, "spill failed; the object stays in memory");
                if let Some(t) = self.index.borrow_mut().get_mut(&id) {
                    t.failure = Some(err);
                }
                self.counters.borrow_mut().failures += 1;
                self.changed.notify_waiters();
                self.kept.borrow_mut().push_back((Instant::now(), id));
                self.node.cancel_eviction(&id);
            }
        }
    }

    /// Writes `src` to the nearest tier that takes it: the burst buffer
    /// (making room there first if it is full), else the backing store.
    pub(super) async fn write_down(
        &self,
        id: ObjectId,
        sizes: ObjectSizes,
        src: SourceRange,
        info: WriteInfo,
        skip_burst: bool,
    ) -> Result<ObjectRecord> {
        let mut last: Option<ShoalError> = None;
        for level in TierLevel::ALL {
            if !self.levels.contains(level) || (level == TierLevel::Burst && skip_burst) {
                continue;
            }
            let mut tries = 0;
            loop {
                tries += 1;
                match self
                    .engine
                    .write(id, level, sizes, src.clone(), info.clone())
                    .await
                {
                    Ok(record) => return Ok(record),
                    Err(err)
                        if err.kind() == ErrorKind::StoreFull
                            && level == TierLevel::Burst
                            && tries == 1
                            && self.relieve_burst(sizes.stored_len()).await > 0 =>
                    {
                        continue
                    }
                    Err(err) => {
                        last = Some(err);
                        break;
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| ShoalError::invalid("this node has no tier below memory")))
    }
}

//! Spilling: a dirty object chosen for eviction is written to the nearest
//! tier that takes it while the node holds its memory, then freed. If no
//! tier takes it, it stays in memory (kept out of eviction for a while), and
//! nothing sealed is lost.

use std::rc::Rc;
use std::time::Instant;

use futures_util::StreamExt;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ObjectId;
use shoal_store::store::Victim;
use shoal_tiers::{
    ObjectRecord, ObjectSizes, SourceRange, TierLevel, TierSet, WriteClaim, WriteInfo, WriteItem,
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
        let mut groups: [Vec<(Victim, WriteItem)>; 2] = Default::default();
        let mut retry = Vec::new();
        for victim in victims {
            let Some((sizes, info, skip_burst, claim)) = self.spill_info(&victim) else {
                self.finish_spill(victim, None, Err(ShoalError::not_found(&victim.id)));
                continue;
            };
            let item = WriteItem {
                claim,
                sizes,
                // SAFETY: as in `spill`: the victim is held until
                // `finish_spill` (or the retry) ends its eviction.
                src: unsafe { self.source(victim.location) },
                info,
            };
            // The nearest tier that may take it, as the drain picks it.
            match self.next_level(TierSet::EMPTY, skip_burst) {
                Some(level) => groups[level as usize].push((victim, item)),
                None => retry.push(victim), // `spill` reports why
            }
        }
        for (level, group) in TierLevel::ALL.into_iter().zip(groups) {
            if group.is_empty() {
                continue;
            }
            let (victims, items): (Vec<Victim>, Vec<WriteItem>) = group.into_iter().unzip();
            let claims: Vec<WriteClaim> = items.iter().map(|item| item.claim.clone()).collect();
            let written = self.engine.write_batch(level, items).await;
            for ((victim, claim), result) in victims.into_iter().zip(claims).zip(written) {
                match result {
                    Ok(record) => self.finish_spill(victim, Some(&claim), Ok(record)),
                    Err(err) if !self.is_current(&victim.id, &claim) => {
                        self.finish_spill(victim, Some(&claim), Err(err))
                    }
                    Err(err) => {
                        tracing::debug!(id = %victim.id, %level, %err, "batched spill failed; retrying alone");
                        retry.push(victim);
                    }
                }
            }
        }
        retry
    }

    /// Whether `claim` is of the incarnation of `id` tracked now (not one
    /// deleted since).
    fn is_current(&self, id: &ObjectId, claim: &WriteClaim) -> bool {
        self.index
            .borrow()
            .get(id)
            .is_some_and(|t| t.generation == claim.generation())
    }

    /// The sizes of a victim, what its write records, whether it skips the
    /// burst buffer (which was full for it), and the claim of its write;
    /// `None` if it is no longer tracked (deleted).
    fn spill_info(&self, victim: &Victim) -> Option<(ObjectSizes, WriteInfo, bool, WriteClaim)> {
        let (durability, skip_burst, generation) = {
            let index = self.index.borrow();
            let t = index.get(&victim.id)?;
            (t.durability, t.skip_burst, t.generation)
        };
        Some((
            ObjectSizes {
                data_size: victim.location.data_size,
                meta_size: victim.location.meta_size,
            },
            WriteInfo {
                durability,
                name: self.node.name_of(&victim.id),
                modified_ms: self.node.mtime_of(&victim.id),
                ..Default::default()
            },
            skip_burst,
            // Claimed while the index says it is alive: a delete from here
            // on makes the write write nothing.
            self.claim(victim.id, generation),
        ))
    }

    async fn spill(&self, victim: Victim) {
        let Some((sizes, info, skip_burst, claim)) = self.spill_info(&victim) else {
            self.finish_spill(victim, None, Err(ShoalError::not_found(&victim.id)));
            return;
        };
        // SAFETY: the victim is held (`Verdict::Hold`): its block stays
        // allocated and unchanged until `finish_eviction`/`cancel_eviction`,
        // both called by `finish_spill`, after the write returned (and so
        // dropped its range) — or never, if the daemon stops first.
        let src = unsafe { self.source(victim.location) };
        let result = self.write_down(&claim, sizes, src, info, skip_burst).await;
        self.finish_spill(victim, Some(&claim), result);
    }

    /// Ends a victim's eviction after its spill (`claim`: of its write,
    /// `None` if it was deleted before one was made): freed if a tier took
    /// it, or if it was deleted meanwhile; kept in memory (and out of
    /// eviction for a while) if no tier took it.
    fn finish_spill(
        &self,
        victim: Victim,
        claim: Option<&WriteClaim>,
        result: Result<ObjectRecord>,
    ) {
        let id = victim.id;
        if !claim.is_some_and(|c| self.is_current(&id, c)) {
            // Deleted while spilling: the write wrote nothing (its claim was
            // ended) or its copy went with the delete; the bytes are free.
            self.node.finish_eviction(&id);
            return;
        }
        match result {
            Ok(record) => {
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
        claim: &WriteClaim,
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
                    .write(claim.clone(), level, sizes, src.clone(), info.clone())
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

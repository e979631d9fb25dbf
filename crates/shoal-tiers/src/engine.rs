//! `TierEngine`: the tiers of one node plus its manifest, and the order in
//! which their writes happen (docs/tiers.md).
//!
//! The daemon decides (what to spill, drain, evict, restore); the engine
//! does the I/O and keeps the manifest consistent with the tiers:
//!
//! - write: tier `put` (data fsync → rename → dir fsync) → manifest commit →
//!   return. Only after the return may the daemon treat the object as clean
//!   (evictable without a spill) or acknowledge a `local`/`backing` seal.
//! - evict a tier copy: manifest commit (copy forgotten) → file removed. A
//!   crash in between leaves a verified stray, which recovery adopts again.
//! - delete: manifest commit (record gone, tombstone in) → files removed on
//!   every tier → tombstone cleared. A crash in between: recovery finishes it.
//!
//! Futures of the engine are `Send` and may run on any tokio runtime,
//! including the daemon's current-thread one: blocking work goes to the
//! blocking pool.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ObjectId;
use tracing::warn;

use crate::format::{check_destination, ObjectSizes};
use crate::locks::IdLocks;
use crate::manifest::{Change, Manifest};
use crate::range::{DestRange, SourceRange};
use crate::record::{Durability, ObjectRecord, TierLevel, TierSet};
use crate::tier::{PutItem, Tier, TierUsage};

/// The tiers and manifest of a node. Open them first (each checks the
/// owner), then [`TierEngine::open`] runs recovery.
#[derive(Debug)]
pub struct EngineConfig {
    pub manifest: Manifest,
    pub burst: Option<Arc<dyn Tier>>,
    pub backing: Option<Arc<dyn Tier>>,
}

/// What a write records besides sizes and checksum.
#[derive(Debug, Clone, Default)]
pub struct WriteInfo {
    /// The durability the object was sealed with (kept as the maximum of
    /// every write's).
    pub durability: Durability,
    /// Seal time in ms since the epoch; `None` = now.
    pub sealed_at_ms: Option<u64>,
    pub name: Option<String>,
}

/// One object of a [`TierEngine::write_batch`].
#[derive(Debug)]
pub struct WriteItem {
    pub id: ObjectId,
    pub sizes: ObjectSizes,
    /// The payload (data then metadata), from memory.
    pub src: SourceRange,
    pub info: WriteInfo,
}

/// The record of an object after a write of its bytes (`sizes`, `checksum`)
/// to `level`, from its record before (`old`), and the tiers whose copies
/// are now stale (other bytes were there under this id).
fn merged(
    old: Option<ObjectRecord>,
    level: TierLevel,
    sizes: ObjectSizes,
    checksum: u32,
    info: &WriteInfo,
    now_ms: u64,
) -> (ObjectRecord, TierSet) {
    match old {
        Some(old) if old.checksum == checksum && old.sizes == sizes => (
            ObjectRecord {
                tiers: old.tiers.with(level),
                durability: old.durability.max(info.durability),
                name: info.name.clone().or(old.name),
                ..old
            },
            TierSet::EMPTY,
        ),
        old => (
            ObjectRecord {
                sizes,
                checksum,
                tiers: TierSet::of(level),
                durability: info.durability,
                sealed_at_ms: info.sealed_at_ms.unwrap_or(now_ms),
                name: info.name.clone(),
            },
            old.map_or(TierSet::EMPTY, |o| o.tiers.without(level)),
        ),
    }
}

/// The result of a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The tier the bytes came from.
    pub from: TierLevel,
    /// The record after the restore (copies found corrupt on the way are gone
    /// from it).
    pub record: ObjectRecord,
    /// Tiers whose copy failed its checksum and was removed.
    pub corrupt: Vec<TierLevel>,
}

/// The storage engine below memory. Share it with an `Arc`.
#[derive(Debug)]
pub struct TierEngine {
    manifest: Arc<Manifest>,
    tiers: [Option<Arc<dyn Tier>>; 2],
    locks: IdLocks,
}

impl std::fmt::Debug for IdLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdLocks")
    }
}

impl TierEngine {
    /// The engine over the opened tiers and manifest, before recovery
    /// (`TierEngine::open` in recover.rs runs it).
    pub(crate) fn assemble(config: EngineConfig) -> Self {
        Self {
            manifest: Arc::new(config.manifest),
            tiers: [config.burst, config.backing],
            locks: IdLocks::default(),
        }
    }

    pub fn tier(&self, level: TierLevel) -> Option<&Arc<dyn Tier>> {
        self.tiers[level as usize].as_ref()
    }

    pub(crate) fn configured(&self) -> impl Iterator<Item = (TierLevel, &Arc<dyn Tier>)> {
        TierLevel::ALL
            .into_iter()
            .filter_map(|level| self.tier(level).map(|tier| (level, tier)))
    }

    fn need_tier(&self, level: TierLevel) -> Result<&Arc<dyn Tier>> {
        self.tier(level)
            .ok_or_else(|| ShoalError::invalid(format!("this node has no {level} tier")))
    }

    pub(crate) async fn manifest<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Manifest) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let manifest = self.manifest.clone();
        tokio::task::spawn_blocking(move || f(&manifest))
            .await
            .map_err(|e| ShoalError::io("manifest task", e))?
    }

    /// Capacity and use of each configured tier.
    pub fn usage(&self) -> Vec<(TierLevel, TierUsage)> {
        self.configured()
            .map(|(level, tier)| (level, tier.usage()))
            .collect()
    }

    /// The manifest's record of `id`.
    pub async fn record(&self, id: ObjectId) -> Result<Option<ObjectRecord>> {
        self.manifest(move |m| m.get(&id)).await
    }

    /// Sets the name `id`'s record carries (a rename in the POSIX view);
    /// an id without a record is skipped.
    pub async fn set_name(&self, id: ObjectId, name: Option<String>) -> Result<()> {
        let _guard = self.locks.lock(id).await;
        self.manifest(move |m| m.update(&id, |old| old.map(|r| ObjectRecord { name, ..r })))
            .await
            .map(drop)
    }

    /// Every record (for `shoal ls`, for re-queueing after a restart).
    pub async fn records(&self) -> Result<Vec<(ObjectId, ObjectRecord)>> {
        self.manifest(|m| m.all()).await
    }

    /// Writes `src` (the object's payload, from memory) to tier `level` and
    /// records the copy. When this returns `Ok`, the copy is durable and in
    /// the manifest: the daemon may acknowledge the durability it gives and
    /// treat the object as clean. On `Err` the manifest is unchanged, the
    /// object is wherever it was before, and the tier holds no partial image.
    pub async fn write(
        &self,
        id: ObjectId,
        level: TierLevel,
        sizes: ObjectSizes,
        src: SourceRange,
        info: WriteInfo,
    ) -> Result<ObjectRecord> {
        let item = WriteItem {
            id,
            sizes,
            src,
            info,
        };
        let mut out = self.write_distinct(level, vec![item]).await;
        out.pop().expect("one outcome per item")
    }

    /// [`write`](Self::write) for several objects at once, with each one's
    /// guarantees, outcomes in order: the tier publishes the images with one
    /// sync pass and the manifest records them in one commit (a group
    /// commit), so small objects cost a share of two fsyncs instead of four
    /// each. An id given twice is written twice, in order.
    pub async fn write_batch(
        &self,
        level: TierLevel,
        items: Vec<WriteItem>,
    ) -> Vec<Result<ObjectRecord>> {
        // Rounds of distinct ids (an id given twice is rare: the daemon
        // writes an object to a tier once at a time), in order per id.
        let mut seen: HashMap<ObjectId, usize> = HashMap::new();
        let mut rounds: Vec<Vec<(usize, WriteItem)>> = Vec::new();
        let count = items.len();
        for (i, item) in items.into_iter().enumerate() {
            let round = seen.entry(item.id).or_insert(0);
            if rounds.len() <= *round {
                rounds.push(Vec::new());
            }
            rounds[*round].push((i, item));
            *round += 1;
        }
        let mut out: Vec<Option<Result<ObjectRecord>>> = (0..count).map(|_| None).collect();
        for round in rounds {
            let (slots, items): (Vec<usize>, Vec<WriteItem>) = round.into_iter().unzip();
            for (slot, outcome) in slots
                .into_iter()
                .zip(self.write_distinct(level, items).await)
            {
                out[slot] = Some(outcome);
            }
        }
        out.into_iter()
            .map(|o| o.expect("every item has an outcome"))
            .collect()
    }

    /// `write_batch` of distinct ids.
    async fn write_distinct(
        &self,
        level: TierLevel,
        items: Vec<WriteItem>,
    ) -> Vec<Result<ObjectRecord>> {
        let tier = match self.need_tier(level) {
            Ok(tier) => tier.clone(),
            Err(err) => return items.iter().map(|_| Err(err.clone())).collect(),
        };
        let mut ids: Vec<ObjectId> = items.iter().map(|item| item.id).collect();
        ids.sort_unstable();
        // In id order, so two batches never wait for each other in a circle.
        let mut guards = Vec::with_capacity(ids.len());
        for id in ids {
            guards.push(self.locks.lock(id).await);
        }
        let (meta, puts): (Vec<_>, Vec<_>) = items
            .into_iter()
            .map(|item| {
                (
                    (item.id, item.sizes, item.info),
                    PutItem {
                        id: item.id,
                        sizes: item.sizes,
                        src: item.src,
                    },
                )
            })
            .unzip();
        let headers = tier.put_batch(puts).await;
        let now = now_ms();
        // Records of the images now in place, in one commit.
        let placed: Vec<(usize, ObjectId, ObjectSizes, WriteInfo, u32)> = headers
            .iter()
            .zip(meta)
            .enumerate()
            .filter_map(|(i, (header, (id, sizes, info)))| {
                header
                    .as_ref()
                    .ok()
                    .map(|h| (i, id, sizes, info, h.checksum))
            })
            .collect();
        let placed_ids: Vec<ObjectId> = placed.iter().map(|p| p.1).collect();
        let committed = {
            let placed = placed.clone();
            self.manifest(move |m| {
                let mut stale = vec![TierSet::EMPTY; placed.len()];
                let records = m.update_each(&placed_ids, |i, old| {
                    let (_, _, sizes, info, checksum) = &placed[i];
                    let (record, gone) = merged(old, level, *sizes, *checksum, info, now);
                    stale[i] = gone;
                    Some(record)
                })?;
                Ok((records, stale))
            })
            .await
        };
        // Failed puts keep their error; placed ones are filled in below.
        let mut out: Vec<Option<Result<ObjectRecord>>> = headers
            .into_iter()
            .map(|header| header.err().map(Err))
            .collect();
        match committed {
            Ok((records, stale)) => {
                for ((i, id, ..), (record, stale)) in
                    placed.iter().zip(records.into_iter().zip(stale))
                {
                    out[*i] = Some(Ok(record.expect("update_each returned a record")));
                    for level in stale.iter() {
                        if let Some(tier) = self.tier(level) {
                            if let Err(err) = tier.delete(*id).await {
                                warn!(
                                    "object {id}: stale {level} copy not removed ({err}); recovery removes it"
                                );
                            }
                        }
                    }
                }
            }
            // Images in place but unrecorded: recovery adopts them, a retry
            // replaces them; the manifest (and so the object) is unchanged.
            Err(err) => {
                for (i, ..) in &placed {
                    out[*i] = Some(Err(err.clone()));
                }
            }
        }
        drop(guards);
        out.into_iter()
            .map(|o| o.expect("every item has an outcome"))
            .collect()
    }

    /// Copies `id` from tier `from` to tier `to` without it being in memory
    /// (a drain of an evicted object, or burst-buffer pressure), through a
    /// bounce buffer of the object's size. Same guarantees as
    /// [`TierEngine::write`]; a corrupt source copy is removed and reported as
    /// `ObjectCorrupt`.
    pub async fn copy(&self, id: ObjectId, from: TierLevel, to: TierLevel) -> Result<ObjectRecord> {
        let source = self.need_tier(from)?.clone();
        let target = self.need_tier(to)?.clone();
        let _guard = self.locks.lock(id).await;
        let record = self.need_record(id).await?;
        if record.tiers.contains(to) {
            return Ok(record);
        }
        if !record.tiers.contains(from) {
            return Err(ShoalError::new(
                ErrorKind::ObjectNotFound,
                format!("object {id} has no {from} copy"),
            ));
        }
        let (dst, buffer) = DestRange::buffer(record.sizes.payload_len() as usize);
        let (dst, got) = source.get(id, dst).await;
        drop(dst);
        if let Err(err) = got {
            if err.kind() == ErrorKind::ObjectCorrupt {
                self.forget_copy(id, from, &source).await;
            }
            return Err(err);
        }
        let bytes = buffer.take().expect("the destination range was dropped");
        let header = target
            .put(id, record.sizes, SourceRange::from_vec(bytes))
            .await?;
        debug_assert_eq!(header.checksum, record.checksum);
        let record = self
            .manifest(move |m| {
                m.update(&id, |r| {
                    r.map(|r| ObjectRecord {
                        tiers: r.tiers.with(to),
                        ..r
                    })
                })
            })
            .await?;
        record.ok_or_else(|| ShoalError::not_found(&id))
    }

    /// Drops the copy of `id` on tier `level` (eviction down the chain: the
    /// object must have another tier copy). The manifest forgets the copy
    /// before the file goes, so a crash in between leaves only a stray that
    /// recovery re-adopts. Refused for the last tier copy: use `delete`.
    pub async fn evict(&self, id: ObjectId, level: TierLevel) -> Result<ObjectRecord> {
        let tier = self.need_tier(level)?.clone();
        let _guard = self.locks.lock(id).await;
        let record = self.need_record(id).await?;
        if !record.tiers.contains(level) {
            return Ok(record);
        }
        if record.tiers.without(level).is_empty() {
            return Err(ShoalError::new(
                ErrorKind::ObjectInUse,
                format!("object {id}: the {level} copy is its last durable copy"),
            ));
        }
        let record = self
            .manifest(move |m| {
                m.update(&id, |r| {
                    r.map(|r| ObjectRecord {
                        tiers: r.tiers.without(level),
                        ..r
                    })
                })
            })
            .await?
            .ok_or_else(|| ShoalError::not_found(&id))?;
        tier.delete(id).await?;
        Ok(record)
    }

    /// Fills `dst` (exactly the payload's length) from the nearest tier whose
    /// copy verifies. A copy that fails its checksum is removed (manifest
    /// first, then file) and the next tier is tried; if none is left the
    /// error is `ObjectCorrupt` and the object is gone. An I/O error on one
    /// tier also moves on to the next tier, but keeps the copy.
    pub async fn restore(&self, id: ObjectId, dst: DestRange) -> Result<Restored> {
        let _guard = self.locks.lock(id).await;
        let record = self.need_record(id).await?;
        check_destination(&id, dst.len() as u64, record.sizes.payload_len())?;
        let mut dst = dst;
        let mut corrupt = Vec::new();
        let mut last_error = None;
        for level in record.tiers.iter() {
            let Some(tier) = self.tier(level).cloned() else {
                continue;
            };
            let (back, got) = tier.get(id, dst).await;
            dst = back;
            match got {
                Ok(header) if header.checksum == record.checksum => {
                    let record = if corrupt.is_empty() {
                        record
                    } else {
                        self.record(id)
                            .await?
                            .ok_or_else(|| ShoalError::not_found(&id))?
                    };
                    return Ok(Restored {
                        from: level,
                        record,
                        corrupt,
                    });
                }
                Ok(header) => {
                    // A verified image of other bytes than the record's.
                    warn!(
                        "object {id}: {level} copy has checksum {:#x}, the manifest {:#x}",
                        header.checksum, record.checksum
                    );
                    self.forget_copy(id, level, &tier).await;
                    corrupt.push(level);
                }
                Err(err) if err.kind() == ErrorKind::ObjectCorrupt => {
                    warn!("object {id}: {level} copy is corrupt: {err}");
                    self.forget_copy(id, level, &tier).await;
                    corrupt.push(level);
                    last_error = Some(err);
                }
                Err(err) => {
                    warn!("object {id}: {level} copy unreadable: {err}");
                    last_error = Some(err);
                }
            }
        }
        if !corrupt.is_empty() && corrupt.len() == record.tiers.iter().count() {
            return Err(ShoalError::new(
                ErrorKind::ObjectCorrupt,
                format!(
                    "object {id}: every stored copy failed its checksum ({}); the object is lost",
                    last_error.map_or_else(String::new, |e| e.to_string())
                ),
            ));
        }
        Err(last_error.unwrap_or_else(|| {
            ShoalError::new(
                ErrorKind::ObjectNotFound,
                format!("object {id}: no configured tier holds a copy"),
            )
        }))
    }

    /// Deletes `id` everywhere. `Ok(false)` if the manifest had no record (any
    /// stray file is still removed). Once the tombstone is committed the
    /// delete is final: a tier that fails to remove its file keeps the
    /// tombstone, and [`TierEngine::finish_deletes`] or the next recovery
    /// retries it; such failures are logged, not returned.
    pub async fn delete(&self, id: ObjectId) -> Result<bool> {
        let _guard = self.locks.lock(id).await;
        let old = self.manifest(move |m| m.tombstone(&id)).await?;
        if self.remove_files(id).await {
            self.manifest(move |m| m.apply(&[Change::ClearTombstone(id)]))
                .await?;
        }
        Ok(old.is_some())
    }

    /// Retries the file removals of deletes whose tombstones remain. Returns
    /// how many completed.
    pub async fn finish_deletes(&self) -> Result<u64> {
        let ids = self.manifest(|m| m.tombstones()).await?;
        let mut done = Vec::new();
        for id in ids {
            let _guard = self.locks.lock(id).await;
            if self.remove_files(id).await {
                done.push(Change::ClearTombstone(id));
            }
        }
        let n = done.len() as u64;
        self.manifest(move |m| m.apply(&done)).await?;
        Ok(n)
    }

    /// Removes `id` from every configured tier; `true` if none failed.
    pub(crate) async fn remove_files(&self, id: ObjectId) -> bool {
        let mut all = true;
        for (level, tier) in self.configured() {
            if let Err(err) = tier.delete(id).await {
                warn!("object {id}: {level} file not removed yet: {err}");
                all = false;
            }
        }
        all
    }

    async fn need_record(&self, id: ObjectId) -> Result<ObjectRecord> {
        self.record(id).await?.ok_or_else(|| {
            ShoalError::new(
                ErrorKind::ObjectNotFound,
                format!("object {id} is on no tier"),
            )
        })
    }

    /// A copy found corrupt: the manifest forgets it (the record goes when no
    /// copy is left), then the file is removed. Errors are logged: the copy is
    /// already useless, and recovery re-checks strays.
    async fn forget_copy(&self, id: ObjectId, level: TierLevel, tier: &Arc<dyn Tier>) {
        let forgot = self
            .manifest(move |m| {
                m.update(&id, |r| {
                    r.map(|r| ObjectRecord {
                        tiers: r.tiers.without(level),
                        ..r
                    })
                    .filter(|r| !r.tiers.is_empty())
                })
            })
            .await;
        if let Err(err) = forgot {
            warn!("object {id}: could not forget its corrupt {level} copy: {err}");
            return;
        }
        if let Err(err) = tier.delete(id).await {
            warn!("object {id}: corrupt {level} file not removed: {err}");
        }
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

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
//! - deletes are final: every write carries the generation of the
//!   incarnation it writes, claimed when the write was decided
//!   ([`TierEngine::claim`]); a delete ends its generation under the id's
//!   lock, and a write whose generation has ended is refused under the same
//!   lock before any I/O. Once under the lock, a write or copy runs to its
//!   end even if its caller stops waiting, so the lock never frees while a
//!   file of it may still land.
//!
//! Futures of the engine are `Send` and may run on any tokio runtime,
//! including the daemon's current-thread one: blocking work goes to the
//! blocking pool.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ObjectId;
use tracing::warn;

use crate::format::{check_destination, ObjectSizes};
pub use crate::locks::WriteClaim;
use crate::locks::{IdGuard, IdLocks};
use crate::manifest::{Change, Manifest, Tombstoned};
use crate::range::{DestRange, SourceRange};
use crate::record::{Durability, ObjectRecord, TierLevel, TierSet};
use crate::tier::{PutItem, Tier, TierUsage};

/// The tiers and manifest of a node. Open them first (each checks the
/// owner), then [`TierEngine::open`] runs recovery.
#[derive(Debug)]
pub struct EngineConfig {
    /// The node's manifest, opened for the same owner as the tiers.
    pub manifest: Manifest,
    /// The burst buffer, if the node has one (a `DirTier`, normally on
    /// local NVMe).
    pub burst: Option<Arc<dyn Tier>>,
    /// The backing store, if any (a `DirTier` on a shared file system, or an
    /// `S3Tier`). With one, recovery lists what it lacks for re-draining
    /// (`RecoveryReport::to_drain`).
    pub backing: Option<Arc<dyn Tier>>,
    /// The backing store is shared with nodes that may adopt it when this
    /// node is removed for good: they know its objects only by the images
    /// there (this manifest, and its tombstones, stay on this node's disk).
    /// A delete is then acknowledged only once its backing image is gone
    /// ([`TierEngine::delete`]).
    pub shared_backing: bool,
}

/// What a write records besides sizes and checksum.
#[derive(Debug, Clone, Default)]
pub struct WriteInfo {
    /// The durability the object was sealed with (kept as the maximum of
    /// every write's).
    pub durability: Durability,
    /// Seal time in ms since the epoch; `None` = now.
    pub sealed_at_ms: Option<u64>,
    /// The modification time its name shows, if set since the seal
    /// (utimens); `None`: the record's (the seal time for a new one).
    pub modified_ms: Option<u64>,
    /// The path-like name the record carries (POSIX view). `None` keeps the
    /// name of a record of the same incarnation and bytes; any other write
    /// records exactly this.
    pub name: Option<String>,
}

/// One object of a [`TierEngine::write_batch`].
#[derive(Debug)]
pub struct WriteItem {
    /// The object (`claim.id()`) and its incarnation.
    pub claim: WriteClaim,
    /// Data and metadata sizes; `src` is exactly their sum long.
    pub sizes: ObjectSizes,
    /// The payload (data then metadata), from memory.
    pub src: SourceRange,
    /// What the record gets besides sizes and checksum.
    pub info: WriteInfo,
}

/// The record of an object after a write of its bytes (`sizes`, `checksum`)
/// of incarnation `generation` to `level`, from its record before (`old`,
/// of that generation or an older one), and the tiers whose copies are now
/// stale (other bytes were there under this id).
fn merged(
    old: Option<ObjectRecord>,
    level: TierLevel,
    sizes: ObjectSizes,
    checksum: u32,
    info: &WriteInfo,
    generation: u64,
    now_ms: u64,
) -> (ObjectRecord, TierSet) {
    let sealed_at_ms = info.sealed_at_ms.unwrap_or(now_ms);
    let fresh = |tiers| ObjectRecord {
        sizes,
        checksum,
        tiers,
        durability: info.durability,
        sealed_at_ms,
        modified_ms: info.modified_ms.unwrap_or(sealed_at_ms),
        name: info.name.clone(),
        generation,
    };
    match old {
        Some(old) if old.checksum == checksum && old.sizes == sizes => {
            if old.generation == generation {
                (
                    ObjectRecord {
                        tiers: old.tiers.with(level),
                        durability: old.durability.max(info.durability),
                        name: info.name.clone().or(old.name),
                        modified_ms: info.modified_ms.unwrap_or(old.modified_ms),
                        ..old
                    },
                    TierSet::EMPTY,
                )
            } else {
                // A new incarnation with the same bytes: the old copies
                // serve it as well.
                (fresh(old.tiers.with(level)), TierSet::EMPTY)
            }
        }
        old => (
            fresh(TierSet::of(level)),
            old.map_or(TierSet::EMPTY, |o| o.tiers.without(level)),
        ),
    }
}

/// The error of a write or copy whose incarnation was deleted (or replaced
/// by a newer one) since it was decided.
fn ended(id: ObjectId, generation: u64) -> ShoalError {
    ShoalError::new(
        ErrorKind::ObjectNotFound,
        format!("object {id}: generation {generation} was deleted; not written"),
    )
}

/// Runs `work` on its own task, so it runs to its end even if the caller
/// stops waiting for it (a drain stopped at shutdown): what holds an id's
/// lock must not free it while a file or a record of it may still land.
async fn detached<T: Send + 'static>(
    work: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    match tokio::spawn(work).await {
        Ok(out) => out,
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        // The runtime is shutting down: the process is ending.
        Err(err) => Err(ShoalError::io("tier write task", err)),
    }
}

/// The files a removal left, by tier, with why.
#[derive(Debug, Default)]
pub(crate) struct NotRemoved {
    burst: Option<ShoalError>,
    backing: Option<ShoalError>,
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
    shared: Shared,
    locks: Arc<IdLocks>,
    /// [`EngineConfig::shared_backing`].
    shared_backing: bool,
    /// The next generation to issue: above every one the manifest holds
    /// (set by recovery), so generations increase across restarts.
    generations: AtomicU64,
}

/// What the engine's detached work needs: the manifest and the tiers.
#[derive(Debug, Clone)]
struct Shared {
    manifest: Arc<Manifest>,
    tiers: [Option<Arc<dyn Tier>>; 2],
}

impl Shared {
    fn tier(&self, level: TierLevel) -> Option<&Arc<dyn Tier>> {
        self.tiers[level as usize].as_ref()
    }

    async fn manifest<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Manifest) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let manifest = self.manifest.clone();
        tokio::task::spawn_blocking(move || f(&manifest))
            .await
            .map_err(|e| ShoalError::io("manifest task", e))?
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
            shared: Shared {
                manifest: Arc::new(config.manifest),
                tiers: [config.burst, config.backing],
            },
            locks: Arc::default(),
            shared_backing: config.shared_backing,
            generations: AtomicU64::new(1),
        }
    }

    /// The tier at `level`; `None` if this node has none there.
    pub fn tier(&self, level: TierLevel) -> Option<&Arc<dyn Tier>> {
        self.shared.tier(level)
    }

    /// A new generation: for an object sealed in memory (a new incarnation
    /// of its id), which its writes then claim. Never issued twice, and
    /// above every generation the manifest held at open.
    pub fn next_generation(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::Relaxed)
    }

    /// Recovery: generations from now on are at least `first`.
    pub(crate) fn issue_from(&self, first: u64) {
        self.generations.fetch_max(first, Ordering::Relaxed);
    }

    /// Claims a write of `id`'s incarnation `generation` (see
    /// [`WriteClaim`]). Take it synchronously with the caller's own check
    /// that the object is alive, and hand it to the write: a
    /// [`delete`](Self::delete) of that generation from then on, or a claim
    /// of a newer one, makes the write fail with `ObjectNotFound` and write
    /// nothing.
    pub fn claim(&self, id: ObjectId, generation: u64) -> WriteClaim {
        self.locks.claim(id, generation)
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
        self.shared.manifest(f).await
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

    /// Sets the name `id`'s record carries (a rename in the POSIX view)
    /// and, if given, the modification time it shows (utimens); an id
    /// without a record is skipped.
    pub async fn set_name(
        &self,
        id: ObjectId,
        name: Option<String>,
        modified_ms: Option<u64>,
    ) -> Result<()> {
        let _guard = self.locks.lock(id).await;
        self.manifest(move |m| {
            m.update(&id, |old| {
                old.map(|r| ObjectRecord {
                    modified_ms: modified_ms.unwrap_or(r.modified_ms),
                    name,
                    ..r
                })
            })
        })
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
    /// A claim revoked by a delete fails with `ObjectNotFound`, nothing
    /// written.
    pub async fn write(
        &self,
        claim: WriteClaim,
        level: TierLevel,
        sizes: ObjectSizes,
        src: SourceRange,
        info: WriteInfo,
    ) -> Result<ObjectRecord> {
        let item = WriteItem {
            claim,
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
            let round = seen.entry(item.claim.id()).or_insert(0);
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
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_unstable_by_key(|&i| items[i].claim.id());
        // In id order, so two batches never wait for each other in a circle.
        let mut guards: Vec<Option<IdGuard>> = (0..items.len()).map(|_| None).collect();
        for i in order {
            let claim = &items[i].claim;
            guards[i] = Some(self.locks.lock_slot(claim.id(), claim.slot()).await);
        }
        let guards: Vec<IdGuard> = guards.into_iter().map(|g| g.expect("locked")).collect();
        let n = items.len();
        let shared = self.shared.clone();
        detached(async move { Ok(write_locked(shared, level, tier, items, guards).await) })
            .await
            .unwrap_or_else(|err| (0..n).map(|_| Err(err.clone())).collect())
    }

    /// Copies `id` from tier `from` to tier `to` without it being in memory
    /// (a drain of an evicted object, or burst-buffer pressure), through a
    /// bounce buffer of the object's size. Same guarantees as
    /// [`TierEngine::write`]; a corrupt source copy, or one that verifies
    /// but holds other bytes than the record's, is removed (manifest first,
    /// as a restore does) and reported as `ObjectCorrupt`. Only the record
    /// of incarnation `generation` is copied: if the id is gone or is
    /// another incarnation now, nothing is written (`ObjectNotFound`).
    pub async fn copy(
        &self,
        id: ObjectId,
        generation: u64,
        from: TierLevel,
        to: TierLevel,
    ) -> Result<ObjectRecord> {
        let source = self.need_tier(from)?.clone();
        let target = self.need_tier(to)?.clone();
        let guard = self.locks.lock(id).await;
        let shared = self.shared.clone();
        detached(async move {
            let record = shared.need_record(id).await?;
            if record.generation != generation {
                return Err(ended(id, generation));
            }
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
            let source_header = match got {
                Ok(header) => header,
                Err(err) => {
                    if err.kind() == ErrorKind::ObjectCorrupt {
                        shared.forget_copy(id, from, &source).await;
                    }
                    return Err(err);
                }
            };
            // A verified image of other bytes than the record's (as a restore
            // finds it): never copied down and recorded as this object.
            if source_header.checksum != record.checksum
                || source_header.data_size != record.sizes.data_size
                || source_header.meta_size != record.sizes.meta_size
            {
                warn!(
                    "object {id}: {from} copy has checksum {:#x}, the manifest {:#x}",
                    source_header.checksum, record.checksum
                );
                shared.forget_copy(id, from, &source).await;
                return Err(ShoalError::new(
                    ErrorKind::ObjectCorrupt,
                    format!(
                        "object {id}: its {from} copy holds other bytes than the manifest \
                         records (checksum {:#x}, not {:#x}); removed, not copied to {to}",
                        source_header.checksum, record.checksum
                    ),
                ));
            }
            let bytes = buffer.take().expect("the destination range was dropped");
            let header = target
                .put(id, record.sizes, SourceRange::from_vec(bytes))
                .await?;
            if header.checksum != record.checksum {
                // The buffer verified and is ours alone: this cannot happen
                // short of a memory fault. Record nothing, keep no image.
                let _ = target.delete(id).await;
                return Err(ShoalError::new(
                    ErrorKind::ObjectCorrupt,
                    format!(
                        "object {id}: written to {to} with checksum {:#x}, not {:#x}; not recorded",
                        header.checksum, record.checksum
                    ),
                ));
            }
            let record = shared
                .manifest(move |m| {
                    m.update(&id, |r| {
                        r.map(|r| ObjectRecord {
                            tiers: r.tiers.with(to),
                            ..r
                        })
                    })
                })
                .await?;
            drop(guard);
            record.ok_or_else(|| ShoalError::not_found(&id))
        })
        .await
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
                    self.shared.forget_copy(id, level, &tier).await;
                    corrupt.push(level);
                }
                Err(err) if err.kind() == ErrorKind::ObjectCorrupt => {
                    warn!("object {id}: {level} copy is corrupt: {err}");
                    self.shared.forget_copy(id, level, &tier).await;
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

    /// Deletes `id`'s incarnations up to `generation` everywhere (a record
    /// of a newer generation is left alone). `Ok(false)` if the manifest had
    /// no record of them (any stray file is still removed). From the call on,
    /// writes claimed for those generations are refused; once the tombstone
    /// is committed the delete is final: a tier that fails to remove its
    /// file keeps the tombstone, and [`TierEngine::finish_deletes`] or the
    /// next recovery retries it; such failures are logged, not returned.
    ///
    /// With a [shared](EngineConfig::shared_backing) backing store, a
    /// backing image that could not be removed fails the delete instead
    /// (`NodeUnavailable`, or the tier's error): a node that adopts this
    /// one's backing store after its removal would find the image and serve
    /// the object again, so the delete is not acknowledged. It is still final
    /// here, and a retry (or `finish_deletes`) completes it.
    pub async fn delete(&self, id: ObjectId, generation: u64) -> Result<bool> {
        let guard = self.locks.lock(id).await;
        // Before the tombstone, under the lock: a write waiting for this lock
        // finds its generation ended and writes nothing.
        guard.end_through(generation);
        let old = match self.manifest(move |m| m.tombstone(&id, generation)).await? {
            Tombstoned::Newer(_) => return Ok(false),
            Tombstoned::Deleted(old) => old,
        };
        // Final from here: what is left undone, recovery finishes.
        let removed = self.remove_files(id, TierSet::EMPTY).await;
        if removed.is_ok() {
            let cleared = self
                .manifest(move |m| m.apply(&[Change::ClearTombstone(id, generation)]))
                .await;
            if let Err(err) = cleared {
                warn!("object {id}: tombstone not cleared yet: {err}");
            }
        }
        match removed {
            Err(failed) if self.shared_backing && failed.backing.is_some() => {
                let err = failed.backing.expect("checked");
                Err(ShoalError::new(
                    if err.kind() == ErrorKind::Io {
                        ErrorKind::Io
                    } else {
                        ErrorKind::NodeUnavailable
                    },
                    format!(
                        "object {id}: delete not acknowledged: its image on the shared backing \
                         store could not be removed ({err}), and a node adopting this one's \
                         backing store would serve it again; it is retried, ask again"
                    ),
                ))
            }
            _ => Ok(old.is_some()),
        }
    }

    /// Retries the file removals of deletes whose tombstones remain. Returns
    /// how many completed.
    pub async fn finish_deletes(&self) -> Result<u64> {
        let tombstones = self.manifest(|m| m.tombstones()).await?;
        let mut done = Vec::new();
        for (id, generation) in tombstones {
            let guard = self.locks.lock(id).await;
            guard.end_through(generation);
            // A newer incarnation written since keeps its own copies.
            let keep = match self.record(id).await? {
                Some(r) if r.generation > generation => r.tiers,
                _ => TierSet::EMPTY,
            };
            if self.remove_files(id, keep).await.is_ok() {
                // Of this generation only: the lock is let go before the
                // clears commit, and a newer delete may tombstone it again.
                done.push(Change::ClearTombstone(id, generation));
            }
        }
        let n = done.len() as u64;
        self.manifest(move |m| m.apply(&done)).await?;
        Ok(n)
    }

    /// Removes `id` from every configured tier but those in `keep`; `Err`
    /// says which failed (each failure is logged).
    pub(crate) async fn remove_files(
        &self,
        id: ObjectId,
        keep: TierSet,
    ) -> std::result::Result<(), NotRemoved> {
        let mut failed = NotRemoved::default();
        for (level, tier) in self.configured() {
            if keep.contains(level) {
                continue;
            }
            if let Err(err) = tier.delete(id).await {
                warn!("object {id}: {level} file not removed yet: {err}");
                match level {
                    TierLevel::Burst => failed.burst = Some(err),
                    TierLevel::Backing => failed.backing = Some(err),
                }
            }
        }
        if failed.burst.is_none() && failed.backing.is_none() {
            Ok(())
        } else {
            Err(failed)
        }
    }

    async fn need_record(&self, id: ObjectId) -> Result<ObjectRecord> {
        self.shared.need_record(id).await
    }
}

impl Shared {
    async fn need_record(&self, id: ObjectId) -> Result<ObjectRecord> {
        self.manifest(move |m| m.get(&id)).await?.ok_or_else(|| {
            ShoalError::new(
                ErrorKind::ObjectNotFound,
                format!("object {id} is on no tier"),
            )
        })
    }
}

/// The body of a batch write, under the locks of its ids (`guards[i]` is
/// `items[i]`'s): items whose generation has ended are refused first; the
/// others' images are placed, then recorded in one commit.
async fn write_locked(
    shared: Shared,
    level: TierLevel,
    tier: Arc<dyn Tier>,
    items: Vec<WriteItem>,
    guards: Vec<IdGuard>,
) -> Vec<Result<ObjectRecord>> {
    let mut out: Vec<Option<Result<ObjectRecord>>> = (0..items.len()).map(|_| None).collect();
    let mut slots = Vec::with_capacity(items.len());
    let mut meta = Vec::with_capacity(items.len());
    let mut puts = Vec::with_capacity(items.len());
    for (i, (item, guard)) in items.into_iter().zip(&guards).enumerate() {
        let (id, generation) = (item.claim.id(), item.claim.generation());
        if !guard.admits(generation) {
            out[i] = Some(Err(ended(id, generation)));
            continue;
        }
        slots.push(i);
        meta.push((id, item.sizes, item.info, generation));
        puts.push(PutItem {
            id,
            sizes: item.sizes,
            src: item.src,
        });
    }
    let headers = if puts.is_empty() {
        Vec::new()
    } else {
        tier.put_batch(puts).await
    };
    let now = now_ms();
    // Records of the images now in place, in one commit.
    let placed: Vec<(usize, ObjectId, ObjectSizes, WriteInfo, u64, u32)> = headers
        .iter()
        .zip(meta)
        .zip(&slots)
        .filter_map(|((header, (id, sizes, info, generation)), &slot)| {
            header
                .as_ref()
                .ok()
                .map(|h| (slot, id, sizes, info, generation, h.checksum))
        })
        .collect();
    let placed_ids: Vec<ObjectId> = placed.iter().map(|p| p.1).collect();
    let committed = {
        let placed = placed.clone();
        shared
            .manifest(move |m| {
                let mut stale = vec![TierSet::EMPTY; placed.len()];
                let mut newer = vec![false; placed.len()];
                let records = m.update_each(&placed_ids, |i, old| {
                    let (_, _, sizes, info, generation, checksum) = &placed[i];
                    match old {
                        // A newer incarnation's record is never replaced by
                        // an older one's (the claims keep this from
                        // happening: a claim of the newer one revoked it).
                        Some(old) if old.generation > *generation => {
                            newer[i] = true;
                            Some(old)
                        }
                        old => {
                            let (record, gone) =
                                merged(old, level, *sizes, *checksum, info, *generation, now);
                            stale[i] = gone;
                            Some(record)
                        }
                    }
                })?;
                Ok((records, stale, newer))
            })
            .await
    };
    // Failed puts keep their error; placed ones are filled in below.
    for (header, &slot) in headers.into_iter().zip(&slots) {
        if let Err(err) = header {
            out[slot] = Some(Err(err));
        }
    }
    match committed {
        Ok((records, stale, newer)) => {
            for (((slot, id, _, _, generation, _), record), (stale, newer)) in
                placed.iter().zip(records).zip(stale.into_iter().zip(newer))
            {
                if newer {
                    tracing::error!(
                        "object {id}: generation {generation} written over a newer one"
                    );
                    out[*slot] = Some(Err(ended(*id, *generation)));
                    continue;
                }
                out[*slot] = Some(Ok(record.expect("update_each returned a record")));
                for level in stale.iter() {
                    if let Some(tier) = shared.tier(level) {
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
        // replaces them, a delete removes them; the manifest (and so the
        // object) is unchanged.
        Err(err) => {
            for (slot, ..) in &placed {
                out[*slot] = Some(Err(err.clone()));
            }
        }
    }
    drop(guards);
    out.into_iter()
        .map(|o| o.expect("every item has an outcome"))
        .collect()
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

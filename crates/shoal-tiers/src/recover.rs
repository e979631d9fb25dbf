//! Recovery at open: make the manifest and the tiers agree again after a
//! crash at any point of the write order (docs/tiers.md, "Recovery").
//!
//! 1. Sweep each tier: temporary files and unfinished uploads go.
//! 2. Finish deletes: every tombstoned id is removed from every tier, with
//!    any record of a generation the tombstone ended (a newer incarnation's
//!    record keeps its copies).
//! 3. List each tier and compare with the records:
//!    - a listed image the record knows: kept (its checksum is checked when
//!      it is read; checking 1 M images here would blow the restart budget);
//!    - a listed image with no record, or whose record lacks that tier (a
//!      crash between rename and manifest commit, or between an evict's
//!      commit and its unlink): verified in full, then adopted if it matches
//!      the record (or there is none), else removed;
//!    - a record naming a tier whose image is missing: that copy is forgotten,
//!      and a record left with no copy is removed.
//! 4. Everything not yet in the backing tier is returned for re-draining.

use std::collections::{HashMap, HashSet};

use shoal_core::error::{ErrorKind, Result};
use shoal_core::ids::ObjectId;
use tracing::{info, warn};

use crate::engine::{now_ms, EngineConfig, TierEngine};
use crate::format::ObjectSizes;
use crate::manifest::Change;
use crate::record::{Durability, ObjectRecord, TierLevel, TierSet};

/// What recovery found and did at open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Records after recovery: every object that reached a durable tier.
    pub objects: u64,
    /// Temporary files / unfinished uploads removed.
    pub swept: u64,
    /// Deletes committed before the crash whose files were removed now.
    pub deletes_finished: u64,
    /// Complete images with no (or a stale) record, verified and recorded.
    pub adopted: Vec<ObjectId>,
    /// Images removed: no record and failing verification, or a tombstone.
    pub discarded: u64,
    /// Record entries whose file was missing (forgotten).
    pub lost_copies: u64,
    /// Records left with no copy at all (removed).
    pub dropped: Vec<ObjectId>,
    /// Objects not yet in the backing tier (when there is one): re-queue them.
    pub to_drain: Vec<ObjectId>,
    /// The records after recovery (what the manifest now holds), so the
    /// caller need not read the manifest again to know what it serves.
    pub records: Vec<(ObjectId, ObjectRecord)>,
}

impl TierEngine {
    /// Takes the opened tiers and manifest, runs recovery (docs/tiers.md,
    /// "Recovery") and returns the engine with what recovery did.
    pub async fn open(config: EngineConfig) -> Result<(Self, RecoveryReport)> {
        let engine = Self::assemble(config);
        let report = recover(&engine, Strays::Verify).await?;
        Ok((engine, report))
    }

    /// [`open`](Self::open) for another node's tiers adopted with an empty
    /// manifest: every image is a stray, and each is recorded from its
    /// checked header ([`Tier::header`](crate::tier::Tier::header)) instead of
    /// a read of the whole store; its payload is verified when it is read.
    pub async fn open_adopted(config: EngineConfig) -> Result<(Self, RecoveryReport)> {
        let engine = Self::assemble(config);
        let report = recover(&engine, Strays::Header).await?;
        Ok((engine, report))
    }
}

/// How recovery checks an image the manifest has no record of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strays {
    /// Read whole and checksummed (a crash's leftover on this node's own tier).
    Verify,
    /// Its header checked (an adopted store: all of it is strays).
    Header,
}

pub(crate) async fn recover(engine: &TierEngine, strays: Strays) -> Result<RecoveryReport> {
    let started = std::time::Instant::now();
    let mut report = RecoveryReport::default();
    // The manifest is read while the tiers are swept (a directory tier is
    // still walking itself then: the two overlap). Reading is safe before
    // the sweep: the sweep touches no recorded image.
    let sweep = async {
        let mut swept = 0;
        for (_, tier) in engine.configured() {
            swept += tier.sweep().await?;
        }
        Ok::<_, shoal_core::error::ShoalError>(swept)
    };
    let (swept, read) =
        futures_util::future::join(sweep, engine.manifest(|m| Ok((m.tombstones()?, m.all()?))))
            .await;
    report.swept = swept?;
    let (tombstones, all) = read?;

    // Generations issued from now on are above every one recorded.
    let highest = all
        .iter()
        .map(|(_, r)| r.generation)
        .chain(tombstones.iter().map(|(_, g)| *g))
        .max()
        .unwrap_or(0);
    engine.issue_from(highest + 1);

    // Records in id order (as the manifest gives them), looked up by binary
    // search: a million of them, and a hash map of them costs more than the
    // compare itself.
    let mut records: Vec<(ObjectId, ObjectRecord)> = all;
    debug_assert!(records.windows(2).all(|w| w[0].0 < w[1].0));
    let find = |records: &[(ObjectId, ObjectRecord)], id: &ObjectId| {
        records.binary_search_by(|(r, _)| r.cmp(id)).ok()
    };

    // A tombstone of generation g ends every record of the id up to g: such
    // a record (only a write that raced its delete could have made one) goes
    // with its files. A newer incarnation's record keeps its own copies.
    let mut cleared = Vec::new();
    let mut removed = Vec::new();
    let mut tombstoned = HashSet::new();
    for (id, generation) in &tombstones {
        let keep = match find(&records, id) {
            Some(i) if records[i].1.generation > *generation => records[i].1.tiers,
            Some(_) => {
                warn!("recovery: record of {id} is older than its delete; removed");
                removed.push(*id);
                TierSet::EMPTY
            }
            None => TierSet::EMPTY,
        };
        if keep.is_empty() {
            tombstoned.insert(*id);
        }
        if engine.remove_files(*id, keep).await.is_ok() {
            cleared.push(Change::ClearTombstone(*id, *generation));
        }
    }
    if !removed.is_empty() {
        records.retain(|(id, _)| !removed.contains(id));
    }
    report.deletes_finished = cleared.len() as u64;
    cleared.extend(removed.into_iter().map(Change::Remove));
    engine.manifest(move |m| m.apply(&cleared)).await?;

    let mut changed: HashSet<ObjectId> = HashSet::new();
    let mut adopted_new: HashMap<ObjectId, ObjectRecord> = HashMap::new();
    for (level, tier) in engine.configured() {
        let mut listed = tier.list().await?;
        listed.sort_unstable();
        for &id in &listed {
            if tombstoned.contains(&id) {
                // Its delete could not remove this file yet (error logged above).
                continue;
            }
            let at = records.binary_search_by(|(r, _)| r.cmp(&id)).ok();
            let known = at.is_some_and(|i| records[i].1.tiers.contains(level));
            if known {
                continue;
            }
            let verified = match strays {
                Strays::Verify => tier.verify(id).await,
                Strays::Header => tier.header(id).await,
            };
            let prior = at.map(|i| &records[i].1).or_else(|| adopted_new.get(&id));
            let adopt = match (&verified, prior) {
                (Ok(header), Some(record)) => {
                    header.checksum == record.checksum
                        && header.data_size == record.sizes.data_size
                        && header.meta_size == record.sizes.meta_size
                }
                (Ok(_), None) => true,
                (Err(err), _) if err.kind() == ErrorKind::ObjectCorrupt => false,
                (Err(err), _) if err.kind() == ErrorKind::ObjectNotFound => continue,
                // An I/O error: leave the file alone, the next start looks again.
                (Err(err), _) => {
                    warn!("recovery: {level} image of {id} unreadable, left as is: {err}");
                    continue;
                }
            };
            if adopt {
                let header = verified.expect("adopted images verified");
                let record = match at {
                    Some(i) => &mut records[i].1,
                    None => adopted_new.entry(id).or_insert_with(|| ObjectRecord {
                        sizes: ObjectSizes {
                            data_size: header.data_size,
                            meta_size: header.meta_size,
                        },
                        checksum: header.checksum,
                        tiers: Default::default(),
                        // Nothing was acknowledged for a file the manifest
                        // never saw.
                        durability: Durability::Memory,
                        sealed_at_ms: now_ms(),
                        modified_ms: now_ms(),
                        name: None,
                        generation: engine.next_generation(),
                    }),
                };
                record.tiers = record.tiers.with(level);
                changed.insert(id);
                report.adopted.push(id);
            } else {
                warn!("recovery: {level} image of {id} discarded: {verified:?}");
                tier.delete(id).await?;
                report.discarded += 1;
            }
        }
        for (id, record) in records.iter_mut() {
            if record.tiers.contains(level) && listed.binary_search(id).is_err() {
                warn!("recovery: {level} copy of {id} is missing; forgotten");
                record.tiers = record.tiers.without(level);
                changed.insert(*id);
                report.lost_copies += 1;
            }
        }
    }
    // Strays adopted with no record join the others, in id order again.
    if !adopted_new.is_empty() {
        records.extend(adopted_new);
        records.sort_unstable_by_key(|(id, _)| *id);
    }
    let record_of = |id: &ObjectId| {
        records
            .binary_search_by(|(r, _)| r.cmp(id))
            .map(|i| &records[i].1)
            .expect("changed ids have records")
    };
    let mut changes = Vec::with_capacity(changed.len());
    for id in changed {
        let record = record_of(&id);
        if record.tiers.is_empty() {
            changes.push(Change::Remove(id));
            report.dropped.push(id);
        } else {
            changes.push(Change::Put(id, record.clone()));
        }
    }
    report.dropped.sort();
    if !report.dropped.is_empty() {
        records.retain(|(id, _)| report.dropped.binary_search(id).is_err());
    }
    engine.manifest(move |m| m.apply(&changes)).await?;

    if engine.tier(TierLevel::Backing).is_some() {
        report.to_drain = records
            .iter()
            .filter(|(_, r)| !r.tiers.contains(TierLevel::Backing))
            .map(|(id, _)| *id)
            .collect();
        report.to_drain.sort();
    }
    report.objects = records.len() as u64;
    report.records = records;
    report.adopted.sort();
    info!(
        "tiers recovered in {:?}: {} objects, {} adopted, {} discarded, {} swept, {} deletes finished, {} to drain",
        started.elapsed(),
        report.objects,
        report.adopted.len(),
        report.discarded,
        report.swept,
        report.deletes_finished,
        report.to_drain.len()
    );
    Ok(report)
}

//! Fills a burst-buffer directory that a daemon already initialised (its
//! `shoal-tier.id` marker and `manifest.redb` exist, the daemon stopped) with
//! COUNT tiny objects, the way spills leave them: put through the directory
//! tier in batches (so they are packed into segment files, one fsync per
//! batch) and one manifest record each, committed per batch. For the restart
//! benchmark of issue 10 (bench/tiers.py): putting a million objects through
//! a daemon would take minutes of protocol round trips that the benchmark
//! does not measure; the files and records written here are the same.
//!
//! `cargo run --release -p shoal-tiers --example fill_manifest -- BURST_DIR COUNT`
//! prints the id of the last object it wrote.

use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use shoal_core::ids::ObjectId;
use shoal_tiers::manifest::Change;
use shoal_tiers::{
    DirTier, Durability, Manifest, ObjectRecord, ObjectSizes, PutItem, SourceRange, Tier,
    TierIdentity, TierLevel, TierSet,
};

/// Objects per put batch and manifest transaction.
const BATCH: usize = 50_000;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: fill_manifest BURST_DIR COUNT";
    let dir = PathBuf::from(args.next().ok_or_else(|| anyhow::anyhow!(usage))?);
    let count: usize = args.next().ok_or_else(|| anyhow::anyhow!(usage))?.parse()?;
    let marker = dir.join("shoal-tier.id");
    let owner = TierIdentity::decode(
        &std::fs::read_to_string(&marker)?,
        &marker.display().to_string(),
    )?;
    let manifest = Manifest::open(&dir.join("manifest.redb"), &owner)?;
    let tier = DirTier::open(&dir, &owner, u64::MAX)?;
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let payload = b"shoal-1m".to_vec();
    let checksum = crc32c::crc32c(&payload);
    let sealed_at_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let sizes = ObjectSizes {
        data_size: payload.len() as u64,
        meta_size: 0,
    };
    let started = Instant::now();
    let mut last = None;
    let mut done = 0;
    while done < count {
        let n = BATCH.min(count - done);
        let ids: Vec<ObjectId> = (0..n).map(|_| ObjectId::random()).collect();
        let items = ids
            .iter()
            .map(|&id| PutItem {
                id,
                sizes,
                src: SourceRange::from_vec(payload.clone()),
            })
            .collect();
        for put in runtime.block_on(tier.put_batch(items)) {
            put?;
        }
        let changes: Vec<Change> = ids
            .iter()
            .map(|&id| {
                Change::Put(
                    id,
                    ObjectRecord {
                        sizes,
                        checksum,
                        tiers: TierSet::EMPTY.with(TierLevel::Burst),
                        durability: Durability::Local,
                        sealed_at_ms,
                        modified_ms: sealed_at_ms,
                        name: None,
                        generation: 1,
                    },
                )
            })
            .collect();
        manifest.apply(&changes)?;
        done += n;
        last = ids.last().copied();
        eprintln!("{done} objects in {:.1} s", started.elapsed().as_secs_f64());
    }
    // One of the objects, for the benchmark's `contains` probe.
    if let Some(id) = last {
        println!("{}", id.to_hex());
    }
    Ok(())
}

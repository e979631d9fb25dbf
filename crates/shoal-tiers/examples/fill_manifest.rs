//! Fills a burst-buffer directory that a daemon already initialised (its
//! `shoal-tier.id` marker and `manifest.redb` exist) with COUNT tiny objects:
//! one valid image per object under `objects/xx/` and one manifest record
//! each, committed in large batches. For the restart benchmark of issue 10
//! (bench/tiers.py): putting a million objects through a daemon, one fsync'ed
//! spill each, would take hours; the files and records written here are the
//! same ones a spill leaves, without the per-object fsyncs (the benchmark
//! syncs the file system once before restarting).
//!
//! `cargo run --release -p shoal-tiers --example fill_manifest -- BURST_DIR COUNT`
//! prints the id of the last object it wrote.

use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use shoal_core::ids::ObjectId;
use shoal_tiers::format::ObjectHeader;
use shoal_tiers::manifest::Change;
use shoal_tiers::{Durability, Manifest, ObjectRecord, ObjectSizes, TierIdentity, TierSet};

/// Records per manifest transaction.
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
    let payload = *b"shoal-1m";
    let checksum = crc32c::crc32c(&payload);
    let sealed_at_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let sizes = ObjectSizes {
        data_size: payload.len() as u64,
        meta_size: 0,
    };
    let started = Instant::now();
    let mut last = None;
    let mut changes = Vec::with_capacity(BATCH);
    for done in 0..count {
        let id = ObjectId::random();
        last = Some(id);
        let header = ObjectHeader {
            id,
            data_size: sizes.data_size,
            meta_size: 0,
            checksum,
        };
        let mut image = header.encode().to_vec();
        image.extend_from_slice(&payload);
        let hex = id.to_hex();
        std::fs::write(dir.join("objects").join(&hex[..2]).join(&hex), &image)?;
        changes.push(Change::Put(
            id,
            ObjectRecord {
                sizes,
                checksum,
                tiers: TierSet::EMPTY.with(shoal_tiers::TierLevel::Burst),
                durability: Durability::Local,
                sealed_at_ms,
                name: None,
            },
        ));
        if changes.len() == BATCH || done + 1 == count {
            manifest.apply(&changes)?;
            changes.clear();
            eprintln!(
                "{} objects in {:.1} s",
                done + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    // One of the objects, for the benchmark's `contains` probe.
    if let Some(id) = last {
        println!("{}", id.to_hex());
    }
    Ok(())
}

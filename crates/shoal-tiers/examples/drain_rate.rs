//! A probe of the write-behind drain's path through `TierEngine` on one
//! directory tier: objects written as the drain writes them (group commits
//! of `BATCH` with `write_batch`), then deleted one by one as clients do.
//! Prints the write and delete rates; for A/B runs of a change to the write
//! or delete path (claims, locks, the manifest commit).
//!
//! `cargo run --release -p shoal-tiers --example drain_rate -- DIR [SIZE_KIB] [COUNT] [BATCH]`

use std::sync::Arc;
use std::time::Instant;

use shoal_core::ids::ObjectId;
use shoal_tiers::{
    DirTier, EngineConfig, Manifest, ObjectSizes, SourceRange, TierEngine, TierIdentity, TierLevel,
    WriteInfo, WriteItem,
};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(
        args.next()
            .ok_or_else(|| anyhow::anyhow!("usage: drain_rate DIR [SIZE_KIB] [COUNT] [BATCH]"))?,
    );
    let size_kib: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let count: usize = args.next().map_or(Ok(4096), |s| s.parse())?;
    let batch: usize = args.next().map_or(Ok(128), |s| s.parse())?;
    let me = TierIdentity::new("probe", 0);
    let tier = DirTier::open(&dir.join("burst"), &me, u64::MAX)?;
    let manifest = Manifest::open(&dir.join("manifest.redb"), &me)?;
    let (engine, _) = TierEngine::open(EngineConfig {
        manifest,
        burst: Some(Arc::new(tier)),
        backing: None,
        shared_backing: false,
    })
    .await?;
    let len = size_kib << 10;
    let bytes: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
    let source = SourceRange::from_vec(bytes);
    let sizes = ObjectSizes {
        data_size: len as u64,
        meta_size: 0,
    };
    let ids: Vec<(ObjectId, u64)> = (0..count)
        .map(|_| (ObjectId::random(), engine.next_generation()))
        .collect();
    let started = Instant::now();
    for chunk in ids.chunks(batch.max(1)) {
        let items = chunk
            .iter()
            .map(|(id, generation)| WriteItem {
                claim: engine.claim(*id, *generation),
                sizes,
                src: source.clone(),
                info: WriteInfo::default(),
            })
            .collect();
        for outcome in engine.write_batch(TierLevel::Burst, items).await {
            outcome?;
        }
    }
    let written = started.elapsed();
    let started = Instant::now();
    for (id, generation) in &ids {
        engine.delete(*id, *generation).await?;
    }
    let deleted = started.elapsed();
    let total = (len * count) as f64 / (1 << 20) as f64;
    println!(
        "{count} x {size_kib} KiB in batches of {batch}: write {:.0} MiB/s ({:.0} objects/s), delete {:.0} objects/s",
        total / written.as_secs_f64(),
        count as f64 / written.as_secs_f64(),
        count as f64 / deleted.as_secs_f64()
    );
    Ok(())
}

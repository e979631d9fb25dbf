//! A quick probe of spill and restore rates through `TierEngine` on one
//! directory tier (durable writes: fsync, rename, dir fsync, manifest
//! commit). Not the benchmark of issue 10 (that one runs beside Ray and the
//! disk's own limit); a first number for a change to the write path.
//!
//! `cargo run --release -p shoal-tiers --example spill_rate -- DIR [SIZE_MIB] [COUNT]`

use std::sync::Arc;
use std::time::Instant;

use shoal_core::ids::ObjectId;
use shoal_tiers::{
    DestRange, DirTier, EngineConfig, Manifest, ObjectSizes, SourceRange, TierEngine, TierIdentity,
    TierLevel, WriteInfo,
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(
        args.next()
            .ok_or_else(|| anyhow::anyhow!("usage: spill_rate DIR [SIZE_MIB] [COUNT]"))?,
    );
    let size_mib: usize = args.next().map_or(Ok(100), |s| s.parse())?;
    let count: usize = args.next().map_or(Ok(5), |s| s.parse())?;
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
    let len = size_mib << 20;
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
    for (id, generation) in &ids {
        engine
            .write(
                engine.claim(*id, *generation),
                TierLevel::Burst,
                sizes,
                source.clone(),
                WriteInfo::default(),
            )
            .await?;
    }
    let spill = started.elapsed();
    let started = Instant::now();
    for (id, _) in &ids {
        let (dst, _buffer) = DestRange::buffer(len);
        engine.restore(*id, dst).await?;
    }
    let restore = started.elapsed();
    let total = (len * count) as f64 / (1 << 20) as f64;
    println!(
        "{count} x {size_mib} MiB: spill {:.0} MiB/s, restore {:.0} MiB/s (restore from page cache unless dropped)",
        total / spill.as_secs_f64(),
        total / restore.as_secs_f64()
    );
    for (id, generation) in ids {
        engine.delete(id, generation).await?;
    }
    Ok(())
}

//! The tier chain on the command line (`shoal serve --burst … --backing …`),
//! merged over what a cluster file gives the node; and `shoal stage-in` /
//! `stage-out`, which move objects between memory and the tiers with a
//! progress bar.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use shoal_client::Client;
use shoal_cluster::NodeTiers;
use shoal_core::durability::Durability;
use shoal_core::protocol::TierReport;
use shoal_core::units::format_size;
use shoal_core::ObjectId;
use shoal_daemon::tiers::{Backing, TierConfig};

#[derive(clap::Args, Debug, Clone, Default)]
pub struct TierArgs {
    /// Burst buffer: a local directory (normally on NVMe) below memory.
    #[arg(long, value_name = "DIR")]
    pub burst: Option<PathBuf>,
    /// Bytes the burst buffer may hold [default: until its file system is full].
    #[arg(long, value_parser = crate::args::size, value_name = "SIZE")]
    pub burst_capacity: Option<u64>,
    /// Backing store: a directory (a shared or parallel file system) or
    /// s3://BUCKET/PREFIX (endpoint and keys from --s3-endpoint,
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION).
    #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX")]
    pub backing: Option<String>,
    /// Bytes the backing store may hold [default: unbounded].
    #[arg(long, value_parser = crate::args::size, value_name = "SIZE")]
    pub backing_capacity: Option<u64>,
    /// The S3 endpoint of an s3:// backing store, e.g. http://127.0.0.1:9000.
    #[arg(long, env = "SHOAL_S3_ENDPOINT", value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// The tiers' manifest (a local file) [default: manifest.redb in the
    /// burst buffer, else in the backing directory].
    #[arg(long, value_name = "PATH")]
    pub tier_manifest: Option<PathBuf>,
    /// The durability a seal gets when it names none: memory, local (fsync'ed
    /// on the burst buffer) or backing (in the backing store) [default: memory].
    #[arg(long, value_name = "LEVEL")]
    pub durability: Option<String>,
    /// How many nice steps the write-behind drain's threads run below the
    /// daemon: 0 runs it at the daemon's priority (faster durability under
    /// load), higher values leave more of the CPU to puts and gets [default: 10].
    #[arg(long, value_name = "0-19", value_parser = clap::value_parser!(i32).range(0..=19))]
    pub drain_nice: Option<i32>,
    /// How long write-behind leaves a sealed object in memory only before
    /// writing it down: an object deleted sooner is never written (a
    /// shuffle's pieces). Dirty objects beyond --drain-dirty-percent of the
    /// store are written at once, oldest first [default: 0, at once].
    #[arg(long, value_name = "MS")]
    pub drain_after_ms: Option<u64>,
    /// The share of the store dirty objects may hold while they wait
    /// --drain-after-ms [default: 25].
    #[arg(long, value_name = "1-100", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub drain_dirty_percent: Option<u8>,
}

impl TierArgs {
    /// The tier chain: these flags over the cluster file's `node` settings.
    pub fn config(&self, node: Option<&NodeTiers>) -> Result<Option<TierConfig>> {
        let node = node.cloned().unwrap_or_default();
        let burst = self.burst.clone().or(node.burst);
        let backing = self.backing.clone().or(node.backing);
        if burst.is_none() && backing.is_none() {
            if self.durability.is_some() || node.durability.is_some() {
                bail!("a durability above memory needs --burst or --backing");
            }
            return Ok(None);
        }
        let mut config = TierConfig::new();
        config.burst = burst.map(|dir| {
            let capacity = self
                .burst_capacity
                .or(node.burst_capacity)
                .unwrap_or(u64::MAX);
            (dir, capacity)
        });
        let backing_capacity = self
            .backing_capacity
            .or(node.backing_capacity)
            .unwrap_or(u64::MAX);
        config.backing = backing
            .map(|text| self.backing_store(&text, backing_capacity))
            .transpose()?;
        config.manifest = self.tier_manifest.clone();
        config.s3_endpoint = self.s3_endpoint.clone();
        if let Some(level) = self.durability.clone().or(node.durability) {
            config.durability = level.parse::<Durability>()?;
        }
        if let Some(nice) = self.drain_nice {
            config.drain_nice = nice;
        }
        if let Some(ms) = self.drain_after_ms {
            config.drain_after = std::time::Duration::from_millis(ms);
        }
        if let Some(percent) = self.drain_dirty_percent {
            config.dirty_percent = percent;
        }
        Ok(Some(config))
    }

    fn backing_store(&self, text: &str, capacity: u64) -> Result<Backing> {
        Ok(Backing::from_spec(
            text,
            capacity,
            self.s3_endpoint.as_deref(),
        )?)
    }
}

#[derive(clap::Args, Debug)]
pub struct StageArgs {
    #[command(flatten)]
    pub socket: crate::args::SocketArg,
    /// Object ids (40 hex digits) [default with --all: every object].
    pub ids: Vec<String>,
    /// Every object: staged in = every object only on a tier; staged out =
    /// every object in memory.
    #[arg(long, conflicts_with = "ids")]
    pub all: bool,
}

/// Objects per request: small enough for the bar to move, large enough to
/// keep the tiers busy.
const STAGE_BATCH: usize = 16;

/// `shoal stage-in` (`out = false`) and `shoal stage-out`.
pub fn stage(args: StageArgs, out: bool) -> Result<()> {
    let mut client = Client::connect(args.socket.path())?;
    let objects = client.list()?;
    let ids: Vec<(ObjectId, u64)> = if args.all {
        objects
            .iter()
            .filter(|o| o.sealed && o.resident == out)
            .map(|o| (o.id, o.location.size()))
            .collect()
    } else {
        if args.ids.is_empty() {
            bail!("name the objects, or pass --all");
        }
        args.ids
            .iter()
            .map(|text| {
                let id = ObjectId::from_hex(text)
                    .with_context(|| format!("{text:?} is not an object id (40 hex digits)"))?;
                let size = objects
                    .iter()
                    .find(|o| o.id == id)
                    .map_or(0, |o| o.location.size());
                Ok((id, size))
            })
            .collect::<Result<_>>()?
    };
    let total: u64 = ids.iter().map(|(_, size)| size).sum();
    let bar = crate::progress::bytes(total, if out { "stage-out" } else { "stage-in" });
    let mut failed = 0;
    for chunk in ids.chunks(STAGE_BATCH) {
        let batch: Vec<ObjectId> = chunk.iter().map(|(id, _)| *id).collect();
        let results = if out {
            client.stage_out(&batch)?
        } else {
            client.stage_in(&batch)?
        };
        for ((id, size), result) in chunk.iter().zip(results) {
            bar.inc(*size);
            if let Err(err) = result {
                failed += 1;
                bar.suspend(|| eprintln!("{id}: {err}"));
            }
        }
    }
    bar.finish_and_clear();
    let verb = if out { "staged out" } else { "staged in" };
    println!(
        "{verb} {} of {} objects ({})",
        ids.len() - failed,
        ids.len(),
        shoal_core::units::format_size(total)
    );
    if failed > 0 {
        bail!("{failed} objects failed");
    }
    Ok(())
}

/// Where an object is, for `shoal ls`: "memory", "burst", "backing", joined by "+".
pub fn residence(o: &shoal_core::protocol::ObjectInfo) -> String {
    let mut parts = Vec::new();
    if o.resident {
        parts.push("memory");
    }
    if o.tiers & 1 != 0 {
        parts.push("burst");
    }
    if o.tiers & 2 != 0 {
        parts.push("backing");
    }
    parts.join("+")
}

fn capacity_text(bytes: u64) -> String {
    if bytes == u64::MAX {
        "unbounded".into()
    } else {
        format_size(bytes)
    }
}

/// The tiers part of `shoal stat`.
pub fn print_report(t: &TierReport) {
    if t.tiers.is_empty() {
        println!("tiers       none (memory only: evicted objects are gone)");
        return;
    }
    println!(
        "tiers       default durability {}, {} objects durable below memory",
        t.default_durability, t.durable_objects
    );
    for tier in &t.tiers {
        println!(
            "  {:<8}  {} of {} used, {} objects  ({})",
            tier.level_name(),
            format_size(tier.used),
            capacity_text(tier.capacity),
            tier.objects,
            tier.describe
        );
    }
    println!(
        "drain       {} queued, {}/s now, {} objects ({}) drained, {} failures",
        t.queue_depth,
        format_size(t.drain_rate),
        t.drained_objects,
        format_size(t.drained_bytes),
        t.failures
    );
    println!(
        "spill       {} spilled, {} restores ({})",
        format_size(t.spilled_bytes),
        t.restores,
        format_size(t.restored_bytes)
    );
}

/// The tiers part of `shoal stat --json`.
pub fn report_json(t: &TierReport) -> String {
    let tiers: Vec<String> = t
        .tiers
        .iter()
        .map(|tier| {
            format!(
                "{{\"level\":\"{}\",\"path\":{:?},\"capacity\":{},\"used\":{},\"objects\":{}}}",
                tier.level_name(),
                tier.describe,
                tier.capacity,
                tier.used,
                tier.objects
            )
        })
        .collect();
    format!(
        "{{\"default_durability\":\"{}\",\"queue_depth\":{},\"drain_rate\":{},\"drained_objects\":{},\"drained_bytes\":{},\"spilled_bytes\":{},\"restores\":{},\"restored_bytes\":{},\"durable_objects\":{},\"failures\":{},\"levels\":[{}]}}",
        t.default_durability,
        t.queue_depth,
        t.drain_rate,
        t.drained_objects,
        t.drained_bytes,
        t.spilled_bytes,
        t.restores,
        t.restored_bytes,
        t.durable_objects,
        t.failures,
        tiers.join(",")
    )
}

//! A node's tier chain as configured (`shoal serve` flags, the cluster
//! TOML), and opening it: each tier checks it belongs to this node, then the
//! engine runs recovery.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use shoal_core::durability::Durability;
use shoal_core::error::{Result, ShoalError};
use shoal_tiers::{
    DirTier, DrainConfig, EngineConfig, Manifest, RecoveryReport, S3Config, S3Tier, Tier,
    TierEngine, TierIdentity,
};

/// The drain's default priority, in nice steps below the daemon's.
pub(super) const DEFAULT_DRAIN_NICE: i32 = 10;

/// The share of the store (per cent) dirty objects may hold while they wait
/// for write-behind (the kernel's `dirty_background_ratio` is 10 % of all
/// memory; a store is all cache, and eviction needs only its older part clean).
pub(super) const DEFAULT_DIRTY_PERCENT: u8 = 25;

/// Where the backing store is.
#[derive(Debug, Clone)]
pub enum Backing {
    /// A directory, normally on a shared or parallel file system.
    Dir { path: PathBuf, capacity: u64 },
    /// An S3-compatible object store.
    S3(Box<S3Config>),
}

impl Backing {
    /// The backing store a cluster file or `--backing` names: a directory,
    /// or `s3://BUCKET/PREFIX` at `endpoint` (else `AWS_ENDPOINT_URL`) with
    /// the credentials in the daemon's environment (`AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`).
    pub fn from_spec(text: &str, capacity: u64, endpoint: Option<&str>) -> Result<Self> {
        let Some(rest) = text.strip_prefix("s3://") else {
            return Ok(Backing::Dir {
                path: PathBuf::from(text),
                capacity,
            });
        };
        // Before anything else, so a build without the client says so and starts nothing.
        shoal_tiers::s3::require(&format!("the backing store {text}"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(ShoalError::invalid(format!("{text}: no bucket")));
        }
        let env = |name: &str, why: &str| {
            std::env::var(name)
                .map_err(|_| ShoalError::invalid(format!("an s3:// backing store needs {why}")))
        };
        let endpoint = match endpoint {
            Some(endpoint) => endpoint.to_owned(),
            None => env("AWS_ENDPOINT_URL", "--s3-endpoint (or AWS_ENDPOINT_URL)")?,
        };
        let key = env("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID")?;
        let secret = env("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY")?;
        let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
        let mut config = S3Config::new(&endpoint, bucket, prefix, &key, &secret);
        config.region = region;
        config.capacity = capacity;
        Ok(Backing::S3(Box::new(config)))
    }
}

#[derive(Debug, Clone)]
pub struct TierConfig {
    /// The burst buffer: a local directory (normally NVMe) and its capacity.
    pub burst: Option<(PathBuf, u64)>,
    pub backing: Option<Backing>,
    /// The manifest (redb). Default: `manifest.redb` in the burst buffer's
    /// directory, else in the backing directory; required with an S3
    /// backing store and no burst buffer.
    pub manifest: Option<PathBuf>,
    /// The durability a seal gets when it names none.
    pub durability: Durability,
    pub drain: DrainConfig,
    /// The S3 endpoint `--s3-endpoint` gave, for the backing stores of other
    /// nodes this one adopts (`None`: `AWS_ENDPOINT_URL`).
    pub s3_endpoint: Option<String>,
    /// Other nodes may adopt this node's backing store when it is removed
    /// for good (a membership service): a delete is acknowledged only once
    /// its backing image is gone (`EngineConfig::shared_backing`).
    pub shared_backing: bool,
    /// How many nice steps the drain's threads run below the daemon's
    /// priority (0: at it): write-behind gets what foreground work leaves of
    /// the CPU.
    pub drain_nice: i32,
    /// How long write-behind leaves a sealed object in memory only before
    /// writing it down (zero: at once); an object deleted within it is never
    /// written. Dirty objects beyond `dirty_percent` of the store go at once,
    /// oldest first.
    pub drain_after: Duration,
    /// The share of the store (per cent) dirty objects may hold while they
    /// wait `drain_after`.
    pub dirty_percent: u8,
}

impl TierConfig {
    pub fn new() -> Self {
        Self {
            burst: None,
            backing: None,
            manifest: None,
            durability: Durability::Memory,
            drain: DrainConfig::default(),
            s3_endpoint: None,
            shared_backing: false,
            drain_nice: DEFAULT_DRAIN_NICE,
            drain_after: Duration::ZERO,
            dirty_percent: DEFAULT_DIRTY_PERCENT,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.burst.is_none() && self.backing.is_none()
    }

    fn manifest_path(&self) -> Result<PathBuf> {
        if let Some(path) = &self.manifest {
            return Ok(path.clone());
        }
        match (&self.burst, &self.backing) {
            (Some((dir, _)), _) | (None, Some(Backing::Dir { path: dir, .. })) => {
                Ok(dir.join("manifest.redb"))
            }
            _ => Err(ShoalError::invalid(
                "an S3 backing store without a burst buffer needs --tier-manifest PATH (a local file)",
            )),
        }
    }

    /// Opens every tier and the manifest for `owner`, then recovers.
    pub async fn open(&self, owner: &TierIdentity) -> Result<(TierEngine, RecoveryReport)> {
        if self.durability == Durability::Backing && self.backing.is_none() {
            return Err(ShoalError::invalid(
                "default durability backing needs a backing store",
            ));
        }
        if self.durability == Durability::Local && self.is_empty() {
            return Err(ShoalError::invalid("default durability local needs a tier"));
        }
        // Tiers first: a directory's marker is written before the manifest
        // file appears beside it.
        let burst: Option<Arc<dyn Tier>> = match &self.burst {
            Some((path, capacity)) => Some(Arc::new(DirTier::open(path, owner, *capacity)?)),
            None => None,
        };
        let backing: Option<Arc<dyn Tier>> = match &self.backing {
            Some(Backing::Dir { path, capacity }) => {
                Some(Arc::new(DirTier::open(path, owner, *capacity)?))
            }
            Some(Backing::S3(config)) => {
                Some(Arc::new(S3Tier::open((**config).clone(), owner).await?))
            }
            None => None,
        };
        let manifest = Manifest::open(&self.manifest_path()?, owner)?;
        TierEngine::open(EngineConfig {
            manifest,
            burst,
            backing,
            shared_backing: self.shared_backing,
        })
        .await
    }

    /// Where this node keeps the manifest of another node's backing store it
    /// adopted: beside its own manifest.
    pub fn adopted_manifest(&self, origin: u32) -> Result<PathBuf> {
        let own = self.manifest_path()?;
        let dir = own.parent().unwrap_or(std::path::Path::new("."));
        Ok(dir.join(format!("adopted-{origin}.redb")))
    }

    /// The origins of the adopted manifests kept beside this node's own.
    pub fn adopted_origins(&self) -> Result<Vec<u32>> {
        let own = self.manifest_path()?;
        let dir = own.parent().unwrap_or(std::path::Path::new("."));
        let mut origins = Vec::new();
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(origins),
            Err(e) => return Err(ShoalError::io(&format!("read {}", dir.display()), e)),
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let origin = name
                .to_str()
                .and_then(|n| n.strip_prefix("adopted-"))
                .and_then(|n| n.strip_suffix(".redb"))
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse::<u32>().ok());
            origins.extend(origin);
        }
        origins.sort_unstable();
        Ok(origins)
    }

    /// Opens the backing store of `adopter.node` (removed for good) for
    /// `adopter.adopted_by` (this node), with its own manifest here, and
    /// recovers it: every complete image there, its header checked, becomes
    /// a record (deletes there were acknowledged only once their image was
    /// gone). Refused
    /// unless this node adopted it already or `may_take` accepts its
    /// current adopter ([`TierIdentity::adoption`]).
    pub async fn open_adopted(
        &self,
        backing: &Backing,
        adopter: &TierIdentity,
        may_take: impl Fn(Option<u32>) -> bool + Send + Sync + 'static,
    ) -> Result<(TierEngine, RecoveryReport)> {
        let origin = adopter.node;
        let tier: Arc<dyn Tier> = match backing {
            // Blocking (the marker's fsync, the layout): off the store's thread.
            Backing::Dir { path, capacity } => {
                let (path, adopter, capacity) = (path.clone(), adopter.clone(), *capacity);
                let opened = tokio::task::spawn_blocking(move || {
                    DirTier::adopt(&path, &adopter, capacity, may_take)
                })
                .await
                .map_err(|e| ShoalError::io("adopt task", e))??;
                Arc::new(opened)
            }
            Backing::S3(config) => {
                Arc::new(S3Tier::adopt((**config).clone(), adopter, may_take).await?)
            }
        };
        let manifest = Manifest::open(&self.adopted_manifest(origin)?, adopter)?;
        TierEngine::open_adopted(EngineConfig {
            manifest,
            burst: None,
            backing: Some(tier),
            shared_backing: true,
        })
        .await
    }
}

impl Default for TierConfig {
    fn default() -> Self {
        Self::new()
    }
}

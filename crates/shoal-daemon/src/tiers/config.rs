//! A node's tier chain as configured (`shoal serve` flags, the cluster
//! TOML), and opening it: each tier checks it belongs to this node, then the
//! engine runs recovery.

use std::path::PathBuf;
use std::sync::Arc;

use shoal_core::durability::Durability;
use shoal_core::error::{Result, ShoalError};
use shoal_tiers::{
    DirTier, DrainConfig, EngineConfig, Manifest, RecoveryReport, S3Config, S3Tier, Tier,
    TierEngine, TierIdentity,
};

/// The drain's default priority, in nice steps below the daemon's.
pub(super) const DEFAULT_DRAIN_NICE: i32 = 10;

/// Where the backing store is.
#[derive(Debug, Clone)]
pub enum Backing {
    /// A directory, normally on a shared or parallel file system.
    Dir { path: PathBuf, capacity: u64 },
    /// An S3-compatible object store.
    S3(Box<S3Config>),
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
    /// How many nice steps the drain's threads run below the daemon's
    /// priority (0: at it): write-behind gets what foreground work leaves of
    /// the CPU.
    pub drain_nice: i32,
}

impl TierConfig {
    pub fn new() -> Self {
        Self {
            burst: None,
            backing: None,
            manifest: None,
            durability: Durability::Memory,
            drain: DrainConfig::default(),
            drain_nice: DEFAULT_DRAIN_NICE,
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
        })
        .await
    }
}

impl Default for TierConfig {
    fn default() -> Self {
        Self::new()
    }
}

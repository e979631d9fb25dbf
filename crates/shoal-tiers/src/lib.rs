//! shoal tiers: the storage engine below memory.
//!
//! Memory → burst buffer (a local directory, normally NVMe) → backing store
//! (a directory on a shared file system, or an S3-compatible store). This
//! crate does the I/O and keeps the crash-safe manifest; the daemon decides
//! what to drain, evict and restore (docs/tiers.md).
//!
//! - [`range`]: the memory ranges a spill reads and a restore fills, in place.
//! - [`format`](mod@format): the image of an object on a tier (header + checksummed payload).
//! - [`tier`]: the backend trait; [`dir`], [`s3`] backends; [`faulty`] injects faults.
//! - [`identity`]: which node owns a tier; another node's tier is refused.
//! - [`manifest`] (redb) of [`record`]s; [`engine`]: the write order over
//!   tiers and manifest, and recovery at open.

#![warn(missing_docs)]

pub mod dir;
pub mod drain;
pub mod engine;
pub mod faulty;
pub mod format;
pub mod identity;
mod locks;
pub mod manifest;
pub mod range;
pub mod record;
mod recover;
pub mod retry;
pub mod s3;
pub mod tier;

pub use dir::DirTier;
pub use drain::{DrainConfig, DrainEvent, DrainJob, Drainer, Refused};
pub use engine::{EngineConfig, Restored, TierEngine, WriteClaim, WriteInfo, WriteItem};
pub use faulty::{FaultTiming, FaultyTier, Held};
pub use format::{ObjectHeader, ObjectSizes};
pub use identity::{Adoption, TierIdentity};
pub use manifest::{Manifest, Tombstoned};
pub use range::{DestBuffer, DestRange, KeepAlive, SourceRange};
pub use record::{Durability, ObjectRecord, TierLevel, TierSet};
pub use recover::RecoveryReport;
pub use retry::{with_backoff, Backoff};
pub use s3::{S3Config, S3Tier};
pub use tier::{PutItem, Tier, TierUsage};

//! What the elastic capacity controller of a daemon is configured with
//! (`shoal serve --elastic …`, a cluster node's `[node.elastic]`).

use std::num::NonZeroUsize;
use std::path::PathBuf;

use shoal_capacity::ControllerConfig;

/// Where the controller reads the node's memory use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SourceChoice {
    /// The daemon's cgroup v2 if it has a memory limit below the host's
    /// memory, else the host (/proc/meminfo).
    #[default]
    Detect,
    /// /proc/meminfo and /proc/pressure/memory, whatever the cgroup.
    Host,
    /// This cgroup v2 directory.
    Cgroup(PathBuf),
    /// A file in /proc/meminfo's format (and optionally one in PSI's), read
    /// every step: a test or a benchmark decides what the node's memory is.
    Files {
        meminfo: PathBuf,
        pressure: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ElasticConfig {
    /// The law's parameters and T (shoal-core's defaults are the paper's).
    pub controller: ControllerConfig,
    pub source: SourceChoice,
    /// Steps the capacity-over-time trace keeps (default 18,000: 30 min at
    /// T = 100 ms, 1 MiB).
    pub trace_points: NonZeroUsize,
    /// Prefetch on growth: bytes of what left memory while the store was
    /// shrunk restored, per shrink, when it grows again (0: off, the
    /// default; `prefetch.rs`).
    pub prefetch: u64,
}

impl Default for ElasticConfig {
    fn default() -> Self {
        Self {
            controller: ControllerConfig::default(),
            source: SourceChoice::Detect,
            trace_points: NonZeroUsize::new(18_000).expect("non-zero"),
            prefetch: 0,
        }
    }
}

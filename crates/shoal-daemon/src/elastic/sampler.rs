//! Reads v_i, M and the memory pressure from the source the daemon was
//! configured with: shoal-core's `MemorySource` (host or cgroup v2), or a
//! pair of files in /proc's formats (tests, benchmarks).

use std::path::PathBuf;

use shoal_capacity::{read_meminfo, read_pressure, MemorySource, MemoryUsage, Pressure};
use shoal_core::error::Result;

use super::config::SourceChoice;

pub(super) enum Sampler {
    Source(MemorySource),
    Files {
        meminfo: PathBuf,
        pressure: Option<PathBuf>,
    },
}

impl Sampler {
    pub(super) fn new(choice: &SourceChoice) -> Result<Self> {
        Ok(match choice {
            SourceChoice::Detect => Self::Source(MemorySource::detect()?),
            SourceChoice::Host => Self::Source(MemorySource::Host),
            SourceChoice::Cgroup(dir) => Self::Source(MemorySource::Cgroup(dir.clone())),
            SourceChoice::Files { meminfo, pressure } => Self::Files {
                meminfo: meminfo.clone(),
                pressure: pressure.clone(),
            },
        })
    }

    /// v_i and M now.
    pub(super) fn usage(&self) -> Result<MemoryUsage> {
        match self {
            Self::Source(source) => source.read_usage(),
            Self::Files { meminfo, .. } => Ok(read_meminfo(meminfo)?.usage()),
        }
    }

    /// Memory pressure now; `None` when the source has none.
    pub(super) fn pressure(&self) -> Result<Option<Pressure>> {
        match self {
            Self::Source(source) => source.read_pressure(),
            Self::Files {
                pressure: Some(path),
                ..
            } => read_pressure(path),
            Self::Files { pressure: None, .. } => Ok(None),
        }
    }

    /// For `shoal stat` and the log: where the numbers come from.
    pub(super) fn describe(&self) -> String {
        match self {
            Self::Source(MemorySource::Host) => "host".into(),
            Self::Source(MemorySource::Cgroup(dir)) => format!("cgroup {}", dir.display()),
            Self::Files { meminfo, .. } => format!("meminfo {}", meminfo.display()),
        }
    }
}

//! Where the controller reads the node's memory: the host (/proc/meminfo,
//! /proc/pressure/memory) or, when the daemon runs in a memory-limited cgroup
//! v2, that cgroup (memory.current, memory.stat, memory.pressure).
//!
//! cgroup v1 limits are not read: a v1-limited daemon is controlled against
//! the host's memory, which is the safe side only if the v1 limit is large.

use std::path::{Path, PathBuf};

use shoal_core::error::Result;

use super::cgroup::{own_cgroup_dir, CgroupMemory};
use super::meminfo::{read_meminfo, HOST_MEMINFO};
use super::percpu::{read_percpu_free_bytes, HOST_ZONEINFO};
use super::pressure::{read_pressure, Pressure, HOST_PRESSURE};
use super::usage::MemoryUsage;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemorySource {
    /// The whole host: M = MemTotal.
    Host,
    /// A cgroup v2 directory whose limit is below the host's memory.
    Cgroup(PathBuf),
}

impl MemorySource {
    /// The daemon's own cgroup if it has a memory limit below MemTotal
    /// (a limit above it never binds), else the host.
    pub fn detect() -> Result<Self> {
        let host_total = read_meminfo(Path::new(HOST_MEMINFO))?.total;
        Ok(match own_cgroup_dir() {
            Some(dir) => Self::for_cgroup(dir, host_total),
            None => Self::Host,
        })
    }

    /// [`detect`](Self::detect)'s choice for a given cgroup directory. A
    /// directory without readable memory files (the root group, a v1-only
    /// memory controller) means the host.
    pub fn for_cgroup(dir: PathBuf, host_total: u64) -> Self {
        match CgroupMemory::read(&dir) {
            Ok(CgroupMemory {
                limit: Some(limit), ..
            }) if limit < host_total => Self::Cgroup(dir),
            _ => Self::Host,
        }
    }

    /// v_i and M now. In a cgroup, M is also capped at the host's MemTotal
    /// (a limit raised above it at run time), and a limit removed at run time
    /// falls back to the host's numbers.
    pub fn read_usage(&self) -> Result<MemoryUsage> {
        let host = read_meminfo(Path::new(HOST_MEMINFO))?;
        let Self::Cgroup(dir) = self else {
            // Pages free on the per-CPU lists are free (percpu.rs); a
            // cgroup is uncharged at once, so only the host needs this.
            let usage = host.usage();
            let percpu = read_percpu_free_bytes(Path::new(HOST_ZONEINFO));
            return MemoryUsage::new(usage.used().saturating_sub(percpu), usage.total());
        };
        let cgroup = CgroupMemory::read(dir)?;
        Ok(match cgroup.usage() {
            Some(usage) if usage.total() <= host.total => usage,
            Some(usage) => MemoryUsage::new(usage.used(), host.total)?,
            None => host.usage(),
        })
    }

    /// The PSI file of this source.
    pub fn pressure_path(&self) -> PathBuf {
        match self {
            Self::Host => PathBuf::from(HOST_PRESSURE),
            Self::Cgroup(dir) => dir.join("memory.pressure"),
        }
    }

    /// Memory pressure now; `None` when the kernel reports none.
    pub fn read_pressure(&self) -> Result<Option<Pressure>> {
        read_pressure(&self.pressure_path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_cgroup(max: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("memory.current", "3000\n");
        write("memory.max", max);
        write("memory.high", "max\n");
        write("memory.stat", "file 1000\nshmem 400\n");
        write(
            "memory.pressure",
            "some avg10=2.00 avg60=0.00 avg300=0.00 total=10\n",
        );
        dir
    }

    #[test]
    fn a_limited_cgroup_is_the_source_and_its_files_are_read() {
        let dir = fake_cgroup("8000\n");
        let source = MemorySource::for_cgroup(dir.path().to_path_buf(), 1 << 40);
        assert_eq!(source, MemorySource::Cgroup(dir.path().to_path_buf()));
        let usage = source.read_usage().unwrap();
        assert_eq!((usage.used(), usage.total()), (2400, 8000));
        assert_eq!(source.read_pressure().unwrap().unwrap().some.avg10, 2.0);
    }

    #[test]
    fn an_unlimited_or_unreadable_cgroup_means_the_host() {
        let unlimited = fake_cgroup("max\n");
        assert_eq!(
            MemorySource::for_cgroup(unlimited.path().to_path_buf(), 1 << 40),
            MemorySource::Host
        );
        let above_host = fake_cgroup("8000\n");
        assert_eq!(
            MemorySource::for_cgroup(above_host.path().to_path_buf(), 4000),
            MemorySource::Host
        );
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            MemorySource::for_cgroup(empty.path().to_path_buf(), 1 << 40),
            MemorySource::Host
        );
    }

    #[test]
    fn detects_and_reads_this_machine() {
        if !Path::new(HOST_MEMINFO).exists() {
            eprintln!("skipped: no {HOST_MEMINFO} on this system");
            return;
        }
        let source = MemorySource::detect().unwrap();
        let usage = source.read_usage().unwrap();
        assert!(usage.total() > 0);
        // Absent PSI is fine; a PSI file that does not parse is not.
        source.read_pressure().unwrap();
    }
}

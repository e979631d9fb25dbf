//! Memory use of a memory-limited cgroup v2 (the daemon in a container or a
//! systemd slice with MemoryMax): v = memory.current − reclaimable file cache,
//! M = the limit.
//!
//! Reclaimable file cache is memory.stat `file` minus `shmem`, not `file`
//! alone: the kernel counts tmpfs and shared memory in `file`, and the store's
//! region is shared memory charged to the daemon's cgroup. Subtracting all of
//! `file` would hide the store's own resident bytes from v_i, and the law
//! would keep growing the store while the cgroup runs into its limit.
//! Active file pages are left out of v too (cAdvisor's "working set" keeps
//! them): the kernel reclaims them before it OOM-kills the group.
//!
//! The limit is the lower of memory.max and memory.high: above memory.high
//! the kernel already throttles and reclaims the group hard.

use std::path::{Path, PathBuf};

use shoal_core::error::{Result, ShoalError};

use super::error::ParseError;
use super::usage::MemoryUsage;

/// A cgroup's memory counters, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupMemory {
    /// memory.current: everything charged to the group.
    pub current: u64,
    /// min(memory.max, memory.high); `None` when both are "max" (no limit).
    pub limit: Option<u64>,
    /// memory.stat `file`: page cache, tmpfs and shared memory included.
    pub file: u64,
    /// memory.stat `shmem`: the swap-backed part of `file` (tmpfs, shm).
    pub shmem: u64,
}

impl CgroupMemory {
    /// v = current − (file − shmem) of M = limit; `None` without a limit.
    pub fn usage(&self) -> Option<MemoryUsage> {
        let limit = self.limit.filter(|&l| l > 0)?;
        let reclaimable = self.file.saturating_sub(self.shmem);
        MemoryUsage::new(self.current.saturating_sub(reclaimable), limit).ok()
    }

    /// Reads the counters of the cgroup directory `dir`.
    pub fn read(dir: &Path) -> Result<Self> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path)
                .map_err(|e| ShoalError::io(&format!("read {}", path.display()), e))
        };
        let max = parse_limit(&read("memory.max")?, "memory.max")?;
        let high = parse_limit(&read("memory.high")?, "memory.high")?;
        let stat = parse_memory_stat(&read("memory.stat")?)?;
        Ok(Self {
            current: parse_counter(&read("memory.current")?, "memory.current")?,
            limit: match (max, high) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            file: stat.file,
            shmem: stat.shmem,
        })
    }
}

/// Parses a one-number file (memory.current).
pub fn parse_counter(text: &str, file: &'static str) -> Result<u64, ParseError> {
    let value = text.trim();
    value.parse().map_err(|_| ParseError::BadValue {
        file,
        field: "value",
        value: value.to_string(),
    })
}

/// Parses memory.max / memory.high: a byte count, or "max" for no limit.
pub fn parse_limit(text: &str, file: &'static str) -> Result<Option<u64>, ParseError> {
    match text.trim() {
        "max" => Ok(None),
        _ => parse_counter(text, file).map(Some),
    }
}

/// The fields of memory.stat the controller uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStat {
    pub file: u64,
    pub shmem: u64,
}

/// Parses memory.stat ("key value" lines, bytes).
pub fn parse_memory_stat(text: &str) -> Result<MemoryStat, ParseError> {
    const FILE: &str = "memory.stat";
    let mut file = None;
    let mut shmem = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (field, slot) = match words.next() {
            Some("file") => ("file", &mut file),
            Some("shmem") => ("shmem", &mut shmem),
            _ => continue,
        };
        let value = words.next().unwrap_or("");
        let parsed = value.parse::<u64>().ok().filter(|_| words.next().is_none());
        *slot = Some(parsed.ok_or_else(|| ParseError::BadValue {
            file: FILE,
            field,
            value: line.trim().to_string(),
        })?);
    }
    let need =
        |value: Option<u64>, field| value.ok_or(ParseError::MissingField { file: FILE, field });
    Ok(MemoryStat {
        file: need(file, "file")?,
        shmem: need(shmem, "shmem")?,
    })
}

/// The process's cgroup v2 path from /proc/self/cgroup (the "0::/path"
/// line), relative to the cgroup2 mount; `None` on a v1-only host.
pub fn parse_own_cgroup(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::trim)
}

/// Where cgroup2 is mounted, from /proc/self/mountinfo: the mount point
/// (field 5) of the first line whose filesystem type (first field after the
/// " - " separator) is cgroup2. Hybrid hosts mount it at
/// /sys/fs/cgroup/unified, pure v2 hosts at /sys/fs/cgroup.
pub fn parse_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (fields, rest) = line.split_once(" - ")?;
        if rest.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        fields.split_whitespace().nth(4).map(unescape_mount_path)
    })
}

/// mountinfo escapes space, tab, newline and backslash as \ooo octal.
fn unescape_mount_path(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |n, c| n * 8 + u32::from(c - b'0')));
        match octal.and_then(|n| u8::try_from(n).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// This process's cgroup v2 directory, if the host has cgroup2 mounted and
/// the process is in a v2 group.
pub fn own_cgroup_dir() -> Option<PathBuf> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = parse_cgroup2_mount(&mountinfo)?;
    let relative = parse_own_cgroup(&cgroup)?.trim_start_matches('/');
    Some(mount.join(relative))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const STAT: &str = "anon 1000\nfile 7000\nkernel 300\nshmem 5000\nfile_mapped 10\n";

    #[test]
    fn usage_counts_shared_memory_but_not_page_cache() {
        let stat = parse_memory_stat(STAT).unwrap();
        assert_eq!(
            stat,
            MemoryStat {
                file: 7000,
                shmem: 5000
            }
        );
        let cg = CgroupMemory {
            current: 9000,
            limit: Some(20_000),
            file: stat.file,
            shmem: stat.shmem,
        };
        // 2000 of the 7000 file bytes are page cache; the 5000 of shared memory
        // (the store's region) stay counted.
        let usage = cg.usage().unwrap();
        assert_eq!(usage.used(), 7000);
        assert_eq!(usage.total(), 20_000);
        assert_eq!(CgroupMemory { limit: None, ..cg }.usage(), None);
    }

    #[test]
    fn reads_a_cgroup_directory_and_takes_the_lower_limit() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("memory.current", "9000\n");
        write("memory.max", "max\n");
        write("memory.high", "20000\n");
        write("memory.stat", STAT);
        let cg = CgroupMemory::read(dir.path()).unwrap();
        assert_eq!(cg.limit, Some(20_000));
        assert_eq!(cg.usage().unwrap().used(), 7000);
        write("memory.max", "15000\n");
        assert_eq!(CgroupMemory::read(dir.path()).unwrap().limit, Some(15_000));
        write("memory.high", "max\n");
        write("memory.max", "max\n");
        assert_eq!(CgroupMemory::read(dir.path()).unwrap().limit, None);
        write("memory.current", "lots\n");
        let err = CgroupMemory::read(dir.path()).unwrap_err();
        assert_eq!(err.kind(), shoal_core::ErrorKind::Io);
        std::fs::remove_file(dir.path().join("memory.stat")).unwrap();
        assert!(CgroupMemory::read(dir.path()).is_err());
    }

    #[test]
    fn malformed_files_give_typed_errors() {
        assert_eq!(parse_limit("max\n", "memory.max"), Ok(None));
        assert_eq!(parse_limit("4096\n", "memory.max"), Ok(Some(4096)));
        assert!(matches!(
            parse_limit("maximum", "memory.max"),
            Err(ParseError::BadValue {
                file: "memory.max",
                ..
            })
        ));
        assert!(matches!(
            parse_counter("", "memory.current"),
            Err(ParseError::BadValue { .. })
        ));
        assert_eq!(
            parse_memory_stat("anon 5\nshmem 1\n"),
            Err(ParseError::MissingField {
                file: "memory.stat",
                field: "file"
            })
        );
        for bad in [
            "file x\nshmem 1",
            "file\nshmem 1",
            "file 1 2\nshmem 1",
            "file -1\nshmem 1",
        ] {
            assert!(
                matches!(
                    parse_memory_stat(bad),
                    Err(ParseError::BadValue { field: "file", .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn finds_the_v2_group_and_the_cgroup2_mount() {
        let hybrid = "9:name=systemd:/\n4:memory:/process_api/ee4a\n0::/user.slice/job\n";
        assert_eq!(parse_own_cgroup(hybrid), Some("/user.slice/job"));
        assert_eq!(parse_own_cgroup("4:memory:/x\n"), None);
        let mountinfo = "\
22 1 0:20 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n\
30 22 0:26 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755\n\
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw\n\
32 30 0:28 / /sys/fs/cgroup/memory rw shared:11 - cgroup cgroup rw,memory\n";
        assert_eq!(
            parse_cgroup2_mount(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            parse_cgroup2_mount("31 30 0:27 / /a rw - cgroup cgroup rw"),
            None
        );
        assert_eq!(
            parse_cgroup2_mount("40 1 0:30 / /mnt/my\\040cg rw - cgroup2 none rw"),
            Some(PathBuf::from("/mnt/my cg"))
        );
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_text(text in "(?s).{0,200}") {
            let _ = parse_memory_stat(&text);
            let _ = parse_limit(&text, "memory.max");
            let _ = parse_own_cgroup(&text);
            let _ = parse_cgroup2_mount(&text);
        }
    }
}

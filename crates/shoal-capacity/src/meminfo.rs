//! The host's memory use from /proc/meminfo: v = MemTotal − MemAvailable.
//!
//! MemAvailable is the kernel's estimate of what can be allocated without
//! swapping (free pages plus reclaimable cache). Shared memory (tmpfs,
//! /dev/shm, where the store's region lives) is not reclaimable, so the
//! store's resident bytes count as used: v_i includes the store, as DynIMS'
//! v_i includes Alluxio's RAM disk. A hugetlbfs pool counts as used whole.

use std::path::Path;

use shoal_core::error::{Result, ShoalError};

use super::error::ParseError;
use super::usage::MemoryUsage;

pub const HOST_MEMINFO: &str = "/proc/meminfo";

const FILE: &str = HOST_MEMINFO;

/// The two fields of /proc/meminfo the controller reads, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    pub total: u64,
    pub available: u64,
}

impl MemInfo {
    /// v = MemTotal − MemAvailable of M = MemTotal.
    pub fn usage(&self) -> MemoryUsage {
        MemoryUsage::new(self.total.saturating_sub(self.available), self.total)
            .expect("parse_meminfo refuses MemTotal = 0")
    }
}

/// Parses /proc/meminfo text ("MemTotal:  24683656 kB" lines; the kernel's
/// "kB" is KiB). Lines the controller does not need are skipped unread.
pub fn parse_meminfo(text: &str) -> Result<MemInfo, ParseError> {
    let mut total = None;
    let mut available = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (field, slot) = match key.trim() {
            "MemTotal" => ("MemTotal", &mut total),
            "MemAvailable" => ("MemAvailable", &mut available),
            _ => continue,
        };
        if slot.is_none() {
            *slot = Some(parse_kib(field, value)?);
        }
    }
    let total = total.ok_or(ParseError::MissingField {
        file: FILE,
        field: "MemTotal",
    })?;
    // MemAvailable exists since Linux 3.14; without it the estimate would
    // have to be rebuilt from Free + Cached, which the controller does not try.
    let available = available.ok_or(ParseError::MissingField {
        file: FILE,
        field: "MemAvailable",
    })?;
    if total == 0 {
        return Err(ParseError::Impossible {
            file: FILE,
            field: "MemTotal",
            value: 0,
        });
    }
    Ok(MemInfo { total, available })
}

fn parse_kib(field: &'static str, value: &str) -> Result<u64, ParseError> {
    let bad = || ParseError::BadValue {
        file: FILE,
        field,
        value: value.trim().to_string(),
    };
    let mut words = value.split_whitespace();
    let number: u64 = words.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    match (words.next(), words.next()) {
        (Some("kB"), None) => number.checked_mul(1024).ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// Reads and parses /proc/meminfo (or another file in its format).
pub fn read_meminfo(path: &Path) -> Result<MemInfo> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ShoalError::io(&format!("read {}", path.display()), e))?;
    Ok(parse_meminfo(&text)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = "MemTotal:       24683656 kB\n\
                          MemFree:        17591764 kB\n\
                          MemAvailable:   22552008 kB\n\
                          Buffers:           41588 kB\n\
                          HugePages_Total:       0\n";

    #[test]
    fn reads_total_and_available_in_bytes() {
        let info = parse_meminfo(SAMPLE).unwrap();
        assert_eq!(info.total, 24683656 * 1024);
        assert_eq!(info.available, 22552008 * 1024);
        let usage = info.usage();
        assert_eq!(usage.used(), (24683656 - 22552008) * 1024);
        assert_eq!(usage.total(), 24683656 * 1024);
    }

    #[test]
    fn malformed_text_gives_typed_errors() {
        assert_eq!(
            parse_meminfo(""),
            Err(ParseError::MissingField {
                file: FILE,
                field: "MemTotal"
            })
        );
        assert_eq!(
            parse_meminfo("MemTotal: 100 kB\n"),
            Err(ParseError::MissingField {
                file: FILE,
                field: "MemAvailable"
            })
        );
        for bad in [
            "MemTotal: lots kB\nMemAvailable: 1 kB",
            "MemTotal: 100 MB\nMemAvailable: 1 kB",
            "MemTotal: 100\nMemAvailable: 1 kB",
            "MemTotal: -5 kB\nMemAvailable: 1 kB",
            "MemTotal: 100 kB extra\nMemAvailable: 1 kB",
            "MemTotal: 99999999999999999999 kB\nMemAvailable: 1 kB",
        ] {
            assert!(
                matches!(
                    parse_meminfo(bad),
                    Err(ParseError::BadValue {
                        field: "MemTotal",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            parse_meminfo("MemTotal: 0 kB\nMemAvailable: 0 kB"),
            Err(ParseError::Impossible { .. })
        ));
        let err: ShoalError = parse_meminfo("").unwrap_err().into();
        assert_eq!(err.kind(), shoal_core::ErrorKind::Io);
    }

    #[test]
    fn available_above_total_reads_as_nothing_used() {
        let info = parse_meminfo("MemTotal: 10 kB\nMemAvailable: 20 kB").unwrap();
        assert_eq!(info.usage().used(), 0);
    }

    #[test]
    fn reads_this_hosts_meminfo() {
        let path = Path::new(HOST_MEMINFO);
        if !path.exists() {
            eprintln!("skipped: {HOST_MEMINFO} does not exist on this system");
            return;
        }
        let info = read_meminfo(path).unwrap();
        assert!(info.total > 0);
        assert!(info.usage().utilisation() <= 1.0);
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_text(text in "(?s).{0,300}") {
            let _ = parse_meminfo(&text);
        }

        #[test]
        fn never_panics_on_near_miss_lines(
            total in "[0-9a-zA-Z -]{0,24}", avail in "[0-9a-zA-Z -]{0,24}"
        ) {
            let _ = parse_meminfo(&format!("MemTotal:{total}\nMemAvailable:{avail}\n"));
        }
    }
}

//! Free pages the kernel keeps on its per-CPU lists (/proc/zoneinfo
//! `pagesets`, the `count:` of each CPU), which MemFree and MemAvailable
//! do not include. Since Linux 6.7 these lists tune their size to the
//! freeing rate, and a shrink frees a lot at once: on this 2-CPU VM
//! (6.18) punching 1 GiB out of the region raised MemAvailable by only
//! ~100 MiB while ~1.5 GiB sat free on the lists, so v_i = MemTotal −
//! MemAvailable kept counting memory the store had given back and the
//! controller shrank on. The host's v_i subtracts them.

use std::path::Path;

pub const HOST_ZONEINFO: &str = "/proc/zoneinfo";

/// Pages on the per-CPU free lists of every zone: the sum of the
/// `count:` lines (they appear only in the `pagesets` sections).
pub fn parse_percpu_free_pages(text: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.trim_start().strip_prefix("count:"))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum()
}

/// Bytes free on the per-CPU lists now; 0 when /proc/zoneinfo cannot be
/// read (then v_i is MemAvailable's, as before).
pub fn read_percpu_free_bytes(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .map(|text| parse_percpu_free_pages(&text) * shoal_core::populate::page_size() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_count_of_every_cpu_of_every_zone() {
        let text = "Node 0, zone      DMA\n  pages free     3840\n  pagesets\n    cpu: 0\n              count:    0\n              high:     0\n    cpu: 1\n              count:    7\n  node_unreclaimable:  0\nNode 0, zone   Normal\n  pagesets\n    cpu: 0\n              count:    221389\n              high:     223418\n              batch:    63\n    cpu: 1\n              count:    173702\n";
        assert_eq!(parse_percpu_free_pages(text), 7 + 221_389 + 173_702);
        assert_eq!(parse_percpu_free_pages("count: junk\n"), 0);
    }
}

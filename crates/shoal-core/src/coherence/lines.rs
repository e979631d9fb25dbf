//! Line arithmetic: which cache lines a byte range touches.
//!
//! Shared by the real cache maintenance (which walks addresses at the
//! hardware stride) and the simulated fabric (which walks line indices at its
//! configured line size), so both agree on the one rule that matters: a range
//! whose start or end is not on a line boundary still covers the partial lines
//! at both ends.

use std::ops::Range;

/// The indices of the `line`-byte lines that `[offset, offset + len)` touches.
///
/// Empty when `len == 0`. `line` must be a power of two.
///
/// # Panics
/// If `offset + len` overflows `usize` (never true of a real mapping).
pub fn touched_lines(offset: usize, len: usize, line: usize) -> Range<usize> {
    debug_assert!(
        line.is_power_of_two(),
        "line size {line} is not a power of two"
    );
    if len == 0 {
        return 0..0;
    }
    let end = offset
        .checked_add(len)
        .unwrap_or_else(|| panic!("range {offset:#x}+{len:#x} overflows the address space"));
    (offset / line)..end.div_ceil(line)
}

/// Calls `op` with the first address of every `stride`-byte line that
/// `[addr, addr + len)` touches, lowest first.
///
/// The addresses passed are line-aligned, so the first one may lie before
/// `addr`; it is still in the same page (a line never crosses a page, since
/// every line size divides every page size), so it is mapped whenever `addr`
/// is.
pub fn for_each_line(addr: usize, len: usize, stride: usize, mut op: impl FnMut(usize)) {
    for index in touched_lines(addr, len, stride) {
        op(index * stride);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn visited(addr: usize, len: usize, stride: usize) -> Vec<usize> {
        let mut out = Vec::new();
        for_each_line(addr, len, stride, |a| out.push(a));
        out
    }

    #[test]
    fn empty_range_touches_nothing() {
        assert_eq!(touched_lines(0, 0, 128), 0..0);
        assert_eq!(touched_lines(1000, 0, 128), 0..0);
        assert!(visited(0x1003, 0, 64).is_empty());
    }

    #[test]
    fn aligned_range_touches_exactly_its_lines() {
        assert_eq!(touched_lines(256, 128, 128), 2..3);
        assert_eq!(touched_lines(256, 256, 128), 2..4);
        assert_eq!(visited(0x1000, 128, 64), vec![0x1000, 0x1040]);
    }

    #[test]
    fn unaligned_ends_cover_partial_lines() {
        // One byte in the middle of a line.
        assert_eq!(visited(0x1010, 1, 64), vec![0x1000]);
        // Last byte of one line and first of the next.
        assert_eq!(visited(0x103f, 2, 64), vec![0x1000, 0x1040]);
        // Starts mid-line, ends mid-line three lines later.
        assert_eq!(visited(0x1020, 0x90, 64), vec![0x1000, 0x1040, 0x1080]);
        assert_eq!(touched_lines(127, 2, 128), 0..2);
    }

    #[test]
    fn every_touched_byte_is_in_a_visited_line() {
        for stride in [32usize, 64, 128] {
            for addr in 0x4000..0x4000 + 2 * stride {
                for len in 0..3 * stride {
                    let lines = visited(addr, len, stride);
                    assert_eq!(lines.len(), touched_lines(addr, len, stride).len());
                    for byte in addr..addr + len {
                        let line = byte & !(stride - 1);
                        assert!(lines.contains(&line), "{addr:#x}+{len} misses {byte:#x}");
                    }
                    // And no line is visited that the range does not touch.
                    for &line in &lines {
                        assert!(line < addr + len && line + stride > addr);
                    }
                }
            }
        }
    }
}

//! aarch64: `dc civac` (clean and invalidate by VA to the point of coherency).
//!
//! One instruction serves both directions: it writes a dirty line back and
//! drops it. Linux lets EL0 issue it (SCTLR_EL1.UCI is set). `dc ivac`
//! (invalidate without clean) is not usable from EL0, and would lose dirty
//! data if the protocol were ever broken, so it is not used.
//!
//! Barriers: `dsb sy`, not `dsb ish`. The other node is outside this host's
//! inner-shareable domain — to this CPU it is an observer like a non-coherent
//! DMA device — and a DSB only waits for maintenance to complete for the
//! domain it names. Linux uses `dsb sy` after `dc civac` for non-coherent DMA
//! for the same reason. The cost is one barrier per range, not per line.
//! An `isb` after an invalidate discards anything already fetched past it.
//!
//! Checked in CI without aarch64 hardware: `scripts/check-cross-arch.sh`
//! cross-builds shoal-core's tests for `aarch64-unknown-linux-gnu` and runs
//! the coherence tests under `qemu-aarch64`, which executes `dc civac`,
//! `dsb sy`, `isb` and the CTR_EL0 read with EL0's permissions (so `dc ivac`
//! would die of SIGILL there). qemu has no caches to observe; it has not run
//! on aarch64 hardware.

use std::arch::asm;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::lines::for_each_line;

/// The smallest data cache line in the hierarchy (CTR_EL0.DminLine), read
/// once; zero until then. Stepping by the smallest line never misses one.
static STRIDE: AtomicUsize = AtomicUsize::new(0);

fn stride() -> usize {
    let cached = STRIDE.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    let ctr: u64;
    // SAFETY: CTR_EL0 is readable at EL0 on Linux (SCTLR_EL1.UCT is set, or
    // the kernel traps and emulates the read); reading it has no side effects.
    unsafe {
        asm!("mrs {0}, ctr_el0", out(reg) ctr, options(nomem, nostack, preserves_flags));
    }
    // DminLine, bits [19:16]: log2 of the line size in 4-byte words.
    let line = 4usize << ((ctr >> 16) & 0xf);
    STRIDE.store(line, Ordering::Relaxed);
    line
}

pub(super) fn flush_instruction() -> &'static str {
    "dc civac"
}

pub(super) fn invalidate_instruction() -> &'static str {
    "dc civac"
}

/// # Safety
/// See [`super::flush_range`].
pub(super) unsafe fn flush_range(ptr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    // Earlier stores complete before the maintenance that must include them.
    dsb_sy();
    // SAFETY: the caller guarantees the range is mapped; every line address
    // is inside a page the range touches.
    for_each_line(ptr as usize, len, stride(), |line| unsafe {
        dc_civac(line)
    });
    dsb_sy();
}

/// # Safety
/// See [`super::invalidate_range`].
pub(super) unsafe fn invalidate_range(ptr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: as in `flush_range`.
    for_each_line(ptr as usize, len, stride(), |line| unsafe {
        dc_civac(line)
    });
    dsb_sy();
    // SAFETY: ISB touches no memory and no registers.
    unsafe { asm!("isb", options(nostack, preserves_flags)) };
}

pub(super) fn fence() {
    dsb_sy();
}

// No `nomem`/`readonly` on the maintenance and barrier asm: the compiler must
// keep loads and stores on their side of it.

#[inline(always)]
unsafe fn dc_civac(line: usize) {
    // SAFETY: the caller guarantees `line` is mapped.
    unsafe { asm!("dc civac, {0}", in(reg) line, options(nostack, preserves_flags)) };
}

#[inline(always)]
fn dsb_sy() {
    // SAFETY: a barrier touches no memory and no registers.
    unsafe { asm!("dsb sy", options(nostack, preserves_flags)) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coherence::LINE;

    #[test]
    fn stride_is_a_real_line_no_larger_than_the_object_line() {
        let stride = stride();
        assert!(stride.is_power_of_two(), "stride {stride}");
        // No aarch64 core has data lines under 16 bytes; a smaller stride
        // means the wrong CTR_EL0 field was decoded.
        assert!(stride >= 16, "stride {stride} is below any real line");
        // Objects are padded to LINE so that no two share a hardware line
        // (protocol step 1); a longer line (A64FX has 256 bytes) breaks that.
        assert!(stride <= LINE, "hardware line {stride} exceeds LINE {LINE}");
    }

    #[test]
    fn stride_agrees_with_the_c_library() {
        // glibc decodes CTR_EL0 itself for this sysconf name; a version
        // without it answers 0 or -1, and then there is nothing to compare.
        // SAFETY: sysconf only reads.
        let libc_line = unsafe { libc::sysconf(libc::_SC_LEVEL1_DCACHE_LINESIZE) };
        if libc_line <= 0 {
            eprintln!("skipped: this C library does not report the L1 data line size");
            return;
        }
        assert_eq!(stride(), libc_line as usize);
    }
}

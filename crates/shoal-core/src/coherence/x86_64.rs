//! x86_64: CLWB, CLFLUSHOPT or CLFLUSH, chosen once by CPUID.
//!
//! Ordering rules relied on (Intel SDM vol. 2, the three instructions' pages):
//! - CLFLUSHOPT and CLWB are ordered only by store-fencing operations (SFENCE,
//!   MFENCE, locked instructions) and are *not* ordered with each other, so
//!   every batch ends with a fence. An SFENCE before the batch also makes any
//!   earlier non-temporal stores (which `memcpy` may use for large copies)
//!   globally visible before the write-backs.
//! - CLFLUSH is ordered with writes, fences and other CLFLUSHes, but not with
//!   later loads; MFENCE orders both, so CLFLUSH batches end with MFENCE.
//! - None of the three stops a *later load* from being satisfied early, so an
//!   invalidate (after which the caller reads) always ends with MFENCE, which
//!   orders loads as well as stores.
//!
//! The instructions act on the 64-byte x86 line, so we step at 64 bytes even
//! though objects are padded to [`LINE`](super::LINE) = 128: a 128-byte object
//! line is two hardware lines and both are flushed.

use std::arch::asm;
use std::sync::atomic::{AtomicU8, Ordering};

use super::lines::for_each_line;

/// The x86 cache line size: the stride of the maintenance loops. CPUID leaf 1
/// reports 64 on every x86_64 part shipped; a stride no larger than the real
/// line can only visit a line twice, never miss one.
const STRIDE: usize = 64;

/// The cache maintenance instructions this CPU has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Features {
    clwb: bool,
    clflushopt: bool,
}

/// Bit 0: detection done; bit 1: CLFLUSHOPT; bit 2: CLWB. Zero until the first
/// call. Two threads may both detect at once; they store the same value.
static FEATURES: AtomicU8 = AtomicU8::new(0);
const DETECTED: u8 = 1;
const HAS_CLFLUSHOPT: u8 = 2;
const HAS_CLWB: u8 = 4;

fn features() -> Features {
    let mut bits = FEATURES.load(Ordering::Relaxed);
    if bits == 0 {
        bits = detect();
        FEATURES.store(bits, Ordering::Relaxed);
    }
    Features {
        clwb: bits & HAS_CLWB != 0,
        clflushopt: bits & HAS_CLFLUSHOPT != 0,
    }
}

fn detect() -> u8 {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // `__cpuid` became a safe function in later Rust releases; the block keeps
    // the crate building with the older toolchains its MSRV allows.
    // SAFETY: CPUID exists on every x86_64 CPU and has no side effects.
    #[allow(unused_unsafe)]
    let max_leaf = unsafe { __cpuid(0) }.eax;
    let mut bits = DETECTED;
    // Leaf 7 must be asked for only when the CPU has it: a CPU whose highest
    // leaf is lower answers an out-of-range leaf with the data of its highest
    // leaf, whose bits mean something else.
    if max_leaf >= 7 {
        // SAFETY: as above; leaf 7 exists (checked).
        #[allow(unused_unsafe)]
        let ebx = unsafe { __cpuid_count(7, 0) }.ebx;
        if ebx & (1 << 23) != 0 {
            bits |= HAS_CLFLUSHOPT;
        }
        if ebx & (1 << 24) != 0 {
            bits |= HAS_CLWB;
        }
    }
    bits
}

/// The write-back instruction: CLWB (keeps the line, clean) over CLFLUSHOPT
/// (evicts) over CLFLUSH (evicts, serialising).
pub(super) fn flush_instruction() -> &'static str {
    let f = features();
    if f.clwb {
        "clwb"
    } else if f.clflushopt {
        "clflushopt"
    } else {
        "clflush"
    }
}

/// The invalidate instruction: CLWB is never used because it may keep the
/// line, and a reader needs the line gone.
pub(super) fn invalidate_instruction() -> &'static str {
    if features().clflushopt {
        "clflushopt"
    } else {
        "clflush"
    }
}

/// # Safety
/// See [`super::flush_range`].
pub(super) unsafe fn flush_range(ptr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let addr = ptr as usize;
    let f = features();
    // Earlier stores, non-temporal ones included, are ordered before the
    // write-backs that must include them.
    sfence();
    // SAFETY (all three loops): the caller guarantees every byte of the range
    // is mapped; each address passed is the start of a line that contains one
    // of those bytes, in the same page, so it is mapped too. The instructions
    // change no architectural state but the cache, and no flags.
    if f.clwb {
        // SAFETY: as above.
        for_each_line(addr, len, STRIDE, |line| unsafe { clwb(line) });
        sfence();
    } else if f.clflushopt {
        // SAFETY: as above.
        for_each_line(addr, len, STRIDE, |line| unsafe { clflushopt(line) });
        sfence();
    } else {
        // SAFETY: as above.
        for_each_line(addr, len, STRIDE, |line| unsafe { clflush(line) });
        mfence();
    }
}

/// # Safety
/// See [`super::invalidate_range`].
pub(super) unsafe fn invalidate_range(ptr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let addr = ptr as usize;
    if features().clflushopt {
        // SAFETY: as in `flush_range`.
        for_each_line(addr, len, STRIDE, |line| unsafe { clflushopt(line) });
    } else {
        // SAFETY: as in `flush_range`.
        for_each_line(addr, len, STRIDE, |line| unsafe { clflush(line) });
    }
    mfence();
}

pub(super) fn fence() {
    mfence();
}

// The asm blocks below deliberately omit `nomem` and `readonly`: the compiler
// must treat each as reading and writing memory, so it neither sinks earlier
// stores past a flush nor hoists later loads above an invalidate.

#[inline(always)]
unsafe fn clwb(line: usize) {
    // SAFETY: the caller guarantees `line` is mapped.
    unsafe { asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags)) };
}

#[inline(always)]
unsafe fn clflushopt(line: usize) {
    // SAFETY: the caller guarantees `line` is mapped.
    unsafe { asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags)) };
}

#[inline(always)]
unsafe fn clflush(line: usize) {
    // SAFETY: the caller guarantees `line` is mapped.
    unsafe { asm!("clflush [{0}]", in(reg) line, options(nostack, preserves_flags)) };
}

#[inline(always)]
fn sfence() {
    // SAFETY: a fence touches no memory and no registers.
    unsafe { asm!("sfence", options(nostack, preserves_flags)) };
}

#[inline(always)]
fn mfence() {
    // SAFETY: a fence touches no memory and no registers.
    unsafe { asm!("mfence", options(nostack, preserves_flags)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_is_stable_and_consistent() {
        let first = features();
        assert_eq!(features(), first);
        // Every CPU with CLWB also has CLFLUSHOPT (Skylake-SP onwards); if this
        // ever fails, invalidate_range still works (it falls back to CLFLUSH).
        if first.clwb {
            assert!(first.clflushopt, "CLWB without CLFLUSHOPT");
        }
        assert_ne!(invalidate_instruction(), "clwb");
    }

    #[test]
    fn each_instruction_runs_on_this_cpu() {
        let buf = vec![0x5au8; 4 * STRIDE];
        let f = features();
        // SAFETY: `buf` is mapped; each call gets an address inside it.
        unsafe {
            clflush(buf.as_ptr() as usize);
            if f.clflushopt {
                clflushopt(buf.as_ptr() as usize + STRIDE);
            }
            if f.clwb {
                clwb(buf.as_ptr() as usize + 2 * STRIDE);
            }
        }
        sfence();
        mfence();
        assert!(buf.iter().all(|&b| b == 0x5a));
    }
}

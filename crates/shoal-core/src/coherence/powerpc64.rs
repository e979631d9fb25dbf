//! powerpc64 (POWER8/9/10, the ThymesisFlow hosts): `dcbf` with L = 0.
//!
//! `dcbf 0,rB` writes the block containing the address in rB back if it is
//! modified and invalidates it in every processor of the coherence domain.
//! It is the only user-mode way to drop a line: `dcbi` is privileged and gone
//! on POWER9. So flush and invalidate are the same loop; they differ in the
//! barriers around it.
//!
//! Barriers, following the thesis the protocol comes from (section 3.5.3):
//! `sync` (hwsync) before the loop so no earlier store to the block is
//! reordered after its flush, `sync` after it so the flushes complete before
//! anything later (the seal RPC, a read), and `isync` after an invalidate so
//! no later instruction has already run against the old contents.
//!
//! Inline asm on PowerPC was stabilised by rust-lang/rust#147996 and builds
//! with the Rust 1.95 used here; releases before that reject this file (they
//! need nightly's `asm_experimental_arch`), so a ppc64 build needs a recent
//! compiler even though the workspace MSRV is older.
//!
//! Checked in CI without POWER hardware: `scripts/check-cross-arch.sh`
//! cross-builds shoal-core's tests for `powerpc64le-unknown-linux-gnu` and
//! runs the coherence tests under `qemu-ppc64le`, which executes `dcbf`,
//! `sync` and `isync` in problem state (so the privileged `dcbi` would die of
//! SIGILL there). qemu has no caches to observe; it has not run on POWER
//! hardware, and big-endian `powerpc64-unknown-linux-gnu` is not built.

use std::arch::asm;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::lines::for_each_line;

/// The POWER7-POWER10 data cache block size, used when the kernel does not say.
const DEFAULT_STRIDE: usize = 128;

/// The data cache block size, from the ELF auxiliary vector once; zero until
/// then. Some 64-bit PowerPC cores (e5500, e6500) have 64-byte blocks, and a
/// 128-byte stride would skip every other one there.
static STRIDE: AtomicUsize = AtomicUsize::new(0);

fn stride() -> usize {
    let cached = STRIDE.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    let line = kernel_block_size().unwrap_or(DEFAULT_STRIDE);
    STRIDE.store(line, Ordering::Relaxed);
    line
}

#[cfg(target_os = "linux")]
fn kernel_block_size() -> Option<usize> {
    // AT_DCACHEBSIZE, defined for powerpc in the kernel's asm/auxvec.h.
    const AT_DCACHEBSIZE: libc::c_ulong = 19;
    // SAFETY: getauxval only reads the process's auxiliary vector.
    let size = unsafe { libc::getauxval(AT_DCACHEBSIZE) } as usize;
    (size.is_power_of_two() && size >= 16).then_some(size)
}

#[cfg(not(target_os = "linux"))]
fn kernel_block_size() -> Option<usize> {
    None
}

pub(super) fn flush_instruction() -> &'static str {
    "dcbf"
}

pub(super) fn invalidate_instruction() -> &'static str {
    "dcbf"
}

/// # Safety
/// See [`super::flush_range`].
pub(super) unsafe fn flush_range(ptr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    hwsync();
    // SAFETY: the caller guarantees the range is mapped; every block address
    // is inside a page the range touches.
    for_each_line(ptr as usize, len, stride(), |line| unsafe { dcbf(line) });
    hwsync();
}

/// # Safety
/// See [`super::invalidate_range`].
pub(super) unsafe fn invalidate_range(ptr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: as in `flush_range`.
    for_each_line(ptr as usize, len, stride(), |line| unsafe { dcbf(line) });
    hwsync();
    // SAFETY: isync touches no memory and no registers.
    unsafe { asm!("isync", options(nostack, preserves_flags)) };
}

pub(super) fn fence() {
    hwsync();
}

// No `nomem`/`readonly` on the maintenance and barrier asm: the compiler must
// keep loads and stores on their side of it.

#[inline(always)]
unsafe fn dcbf(line: usize) {
    // RA = 0 means the literal 0, not r0, so the address is all in rB and any
    // register (r0 included) may hold it.
    // SAFETY: the caller guarantees `line` is mapped.
    unsafe { asm!("dcbf 0, {0}", in(reg) line, options(nostack, preserves_flags)) };
}

#[inline(always)]
fn hwsync() {
    // SAFETY: a barrier touches no memory and no registers.
    unsafe { asm!("sync", options(nostack, preserves_flags)) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coherence::LINE;

    /// The bytes one `dcbz` clears: an independent measure of the data cache
    /// block size, since `dcbz` zeroes exactly the block holding its address.
    fn block_dcbz_clears() -> usize {
        const PAGE: usize = 4096;
        let mut buf = vec![0xffu8; 2 * PAGE];
        let start = buf.as_ptr().align_offset(PAGE);
        let block = &mut buf[start..start + PAGE];
        // SAFETY: the address is inside `block`, page aligned, so the cleared
        // block (at most a page) lies inside `block`, which we own mutably.
        unsafe {
            asm!("dcbz 0, {0}", in(reg) block.as_mut_ptr(), options(nostack, preserves_flags));
        }
        block.iter().take_while(|&&b| b == 0).count()
    }

    #[test]
    fn stride_is_the_block_dcbz_clears() {
        assert_eq!(stride(), block_dcbz_clears());
    }

    #[test]
    fn stride_is_no_larger_than_the_object_line() {
        // Objects are padded to LINE so that no two share a block (protocol
        // step 1); a longer block breaks that.
        let stride = stride();
        assert!(
            stride.is_power_of_two() && stride <= LINE,
            "block {stride}, LINE {LINE}"
        );
    }
}

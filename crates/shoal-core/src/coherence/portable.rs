//! Every other architecture: no cache maintenance at all.
//!
//! Such targets are supported in [`CoherenceMode::Coherent`](super::CoherenceMode)
//! only. The functions still order memory (a compiler fence and a SeqCst
//! fence), so code written for the non-coherent protocol runs correctly on a
//! coherent machine of any architecture; but they do not write anything back
//! or drop any line, so a non-coherent fabric would show stale data. Check
//! [`super::HAS_CACHE_MAINTENANCE`] before accepting non-coherent mode.

use std::sync::atomic::{compiler_fence, fence as hw_fence, Ordering};

pub(super) fn flush_instruction() -> &'static str {
    "none"
}

pub(super) fn invalidate_instruction() -> &'static str {
    "none"
}

/// # Safety
/// See [`super::flush_range`]; nothing is dereferenced here.
pub(super) unsafe fn flush_range(_ptr: *const u8, len: usize) {
    if len != 0 {
        fence();
    }
}

/// # Safety
/// See [`super::invalidate_range`]; nothing is dereferenced here.
pub(super) unsafe fn invalidate_range(_ptr: *const u8, len: usize) {
    if len != 0 {
        fence();
    }
}

pub(super) fn fence() {
    compiler_fence(Ordering::SeqCst);
    hw_fence(Ordering::SeqCst);
}

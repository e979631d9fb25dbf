//! Software cache coherency for fabrics that do not keep caches coherent.
//!
//! On ThymesisFlow and some CXL sharing modes every node caches the shared
//! memory in its own CPU caches and no hardware keeps those caches in step:
//! a write sits in the writer's cache until it is written back, and a line a
//! reader cached earlier stays stale however often memory changes under it.
//! Shoal objects are immutable once sealed, so one write-back at seal and one
//! drop per reading node are enough. The protocol, whose every step is a
//! function here or an RPC elsewhere:
//!
//! 1. **Layout.** Objects are aligned and padded to [`LINE`] bytes, so no two
//!    objects share a line: flushing or dropping one object's lines never
//!    touches another's bytes.
//! 2. **Write, flush, seal.** The node that wrote the bytes calls
//!    [`flush_range`] on the object (it writes every dirty line back and
//!    fences) and only then sends the seal. The seal is a control message over
//!    RPC, never a flag in shared memory: a flag in shared memory would need
//!    the very coherence it announces.
//! 3. **Invalidate, read.** Each node that reads the object calls
//!    [`invalidate_range`] once, after it learns of the seal and before its
//!    first read. Its cache may hold lines of the range from earlier (a
//!    previous object there, a prefetch while the writer was writing); after
//!    the drop every read misses and loads the sealed bytes, and since nothing
//!    writes the object again the lines it caches from then on stay valid.
//! 4. **Readers never write.** Remote memory is mapped read-only, so a reader
//!    never holds a dirty line that a drop could lose or an eviction could
//!    write over a later object.
//! 5. **Free and reuse.** Free returns the range to the allocating node, which
//!    may hand it out again. Step 3 for the new object drops whatever a
//!    reading node kept of the old one. An object aborted before its seal must
//!    be flushed by its writer before its range is freed, or the writer's dirty
//!    lines could later be evicted over the next object at that range.
//!
//! `model/coherence.pml` is a Spin model of exactly these steps with caches
//! that evict, write back and prefetch at any moment; it verifies the protocol
//! and finds a counterexample when the flush, the invalidate or the flush on
//! abort is left out, or when the seal overtakes the flush. [`simulated`] is the same cache model in Rust, for
//! running the cluster tests on one host as if the fabric were non-coherent.
//!
//! Each function is a no-op for an empty range; for any other range it covers
//! every hardware line the range touches, including partial lines at both
//! ends, so callers need not align.

mod lines;
mod mode;
pub mod simulated;

pub use mode::CoherenceMode;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "powerpc64")]
mod powerpc64;
// Built in tests everywhere so the fallback is exercised on the CI host too.
#[cfg(any(
    test,
    not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "powerpc64"
    ))
))]
mod portable;
#[cfg(target_arch = "x86_64")]
mod x86_64;

#[cfg(target_arch = "aarch64")]
use aarch64 as arch;
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "powerpc64"
)))]
use portable as arch;
#[cfg(target_arch = "powerpc64")]
use powerpc64 as arch;
#[cfg(target_arch = "x86_64")]
use x86_64 as arch;

/// The line size objects are aligned and padded to on fabrics that are not
/// coherent.
///
/// 128 rather than x86's 64 because it is the largest unit any supported CPU
/// moves between cache and memory as one: POWER8-10 (the ThymesisFlow hosts)
/// have 128-byte lines and ThymesisFlow moves 128-byte packets, and x86 CPUs
/// with the adjacent-line prefetcher fetch 64-byte lines in aligned pairs. If
/// two objects shared such a unit, maintenance of one could write back or drop
/// bytes of the other.
pub const LINE: usize = 128;

/// True where [`flush_range`] and [`invalidate_range`] issue real cache
/// maintenance (x86_64, aarch64, powerpc64). Elsewhere they only fence, and
/// only [`CoherenceMode::Coherent`] is supported.
pub const HAS_CACHE_MAINTENANCE: bool = cfg!(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "powerpc64"
));

/// Writes back every line touching `[ptr, ptr + len)` (and, where the
/// instruction also evicts, drops it), then fences so the write-backs are
/// complete before any later store — in particular the one that sends the
/// seal.
///
/// The writer calls this after its last write to an object and before sealing
/// it (or, for an object it aborts, before freeing it). It never changes the
/// bytes anyone reads.
///
/// Instructions: x86_64 CLWB, else CLFLUSHOPT, else CLFLUSH (by CPUID, at
/// first use), each batch fenced; aarch64 `dc civac` + `dsb sy`; powerpc64
/// `dcbf` between `sync`s; elsewhere only a fence (see
/// [`HAS_CACHE_MAINTENANCE`]). [`instruction_in_use`] names the one chosen.
///
/// # Safety
/// Every byte of `[ptr, ptr + len)` must lie in memory mapped into this
/// process (readable; it need not be writable, and it need not be a Rust
/// allocation — shared memory other nodes write is the normal case), and
/// `ptr + len` must not overflow. The instructions fault on unmapped
/// addresses. Nothing is read or written through `ptr` in the Rust sense.
pub unsafe fn flush_range(ptr: *const u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { arch::flush_range(ptr, len) }
}

/// Makes this node's next read of every line touching `[ptr, ptr + len)` come
/// from memory: drops those lines from this CPU's caches, then fences so no
/// later load is served from before the drop.
///
/// A reading node calls this once per object, after it received the seal and
/// before its first read. No supported CPU lets user code drop a line
/// without writing it back (x86 has no such instruction; aarch64 `dc ivac` and
/// POWER `dcbi` are privileged), so this is clean-and-invalidate: x86_64
/// CLFLUSHOPT (or CLFLUSH) + MFENCE, aarch64 `dc civac` + `dsb sy` + `isb`,
/// powerpc64 `dcbf` + `sync` + `isync`. The write-back half is harmless because
/// readers never hold dirty lines of a sealed object (they map it read-only).
///
/// Reads after the call must go through pointers or slices made after the
/// seal: a `&[u8]` that was alive while another node wrote the memory was
/// already undefined behaviour, whatever the caches did.
///
/// # Safety
/// As for [`flush_range`].
pub unsafe fn invalidate_range(ptr: *const u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { arch::invalidate_range(ptr, len) }
}

/// [`flush_range`] over a slice; safe because a slice is always mapped.
pub fn flush_slice(bytes: &[u8]) {
    // SAFETY: a live slice lies in mapped memory and does not wrap.
    unsafe { flush_range(bytes.as_ptr(), bytes.len()) }
}

/// [`invalidate_range`] over a slice; safe because a slice is always mapped
/// and invalidation here never discards data (see [`invalidate_range`]).
pub fn invalidate_slice(bytes: &[u8]) {
    // SAFETY: a live slice lies in mapped memory and does not wrap.
    unsafe { invalidate_range(bytes.as_ptr(), bytes.len()) }
}

/// A full barrier for ordering cache maintenance against loads and stores:
/// x86_64 MFENCE, aarch64 `dsb sy`, powerpc64 `sync`, elsewhere a SeqCst
/// fence. [`flush_range`] and [`invalidate_range`] already end with the
/// barrier they need; this is for callers composing their own sequences.
pub fn fence() {
    arch::fence()
}

/// The instruction [`flush_range`] uses on this machine: `"clwb"`,
/// `"clflushopt"`, `"clflush"`, `"dc civac"`, `"dcbf"` or `"none"`. For logs and
/// benchmark reports.
pub fn instruction_in_use() -> &'static str {
    arch::flush_instruction()
}

/// The instruction [`invalidate_range`] uses; differs from
/// [`instruction_in_use`] only on x86_64 with CLWB, which may keep the line
/// and so cannot invalidate (CLFLUSHOPT is used instead).
pub fn invalidate_instruction_in_use() -> &'static str {
    arch::invalidate_instruction()
}

#[cfg(test)]
mod tests;

//! Copying object bytes into shared memory.
//!
//! Large objects are written once and read later, usually by another
//! process: caching them on the way in only evicts the writer's working set
//! and costs a read-for-ownership of every destination line. Above
//! [`STREAM_THRESHOLD`] the copy uses non-temporal (streaming) stores, which
//! write whole lines straight to memory. Measured here on 100 MB into a warm
//! shared mapping (bench/large_objects.py): glibc's memcpy 5.1–6.3 GiB/s,
//! SSE2 streaming stores 5.9–6.1 GiB/s; glibc only streams above 3/4 of the
//! last-level cache per thread, which this VM reports as 480 MiB. Below the
//! threshold memcpy is faster (10 MB: 14.0 against 13.3 GiB/s), the
//! destination staying in cache. Written by hand: no maintained crate offers
//! a streaming memcpy; the loop is a dozen intrinsics.

/// Copies of at least this many bytes use streaming stores.
pub const STREAM_THRESHOLD: usize = 32 << 20;

/// Copies `src` to `dst`, streaming when it is large (see the module).
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
pub unsafe fn copy_to_shared(dst: *mut u8, src: &[u8]) {
    if src.len() >= STREAM_THRESHOLD {
        // SAFETY: the caller's contract.
        unsafe { stream_copy(dst, src) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
    }
}

/// Copies with streaming stores whatever the size (the aligned middle; the
/// unaligned head and the tail with memcpy). Visible to other threads and
/// processes in order after it returns (it ends with a store fence).
///
/// # Safety
/// As [`copy_to_shared`].
#[cfg(target_arch = "x86_64")]
pub unsafe fn stream_copy(dst: *mut u8, src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    const BLOCK: usize = 64;
    let len = src.len();
    // Streaming stores need 16-byte aligned destinations: copy up to the
    // first aligned byte normally.
    let head = dst.align_offset(16).min(len);
    // SAFETY: inside both ranges (caller's contract); no overlap.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head) };
    let mut at = head;
    while at + BLOCK <= len {
        // SAFETY: `at + 64 <= len`: the loads read inside `src` (unaligned
        // loads allowed) and the stores write inside `dst` at 16-byte
        // aligned addresses (`dst + head` is aligned and `at - head` is a
        // multiple of 64). SSE2 is part of x86_64.
        unsafe {
            let s = src.as_ptr().add(at).cast::<__m128i>();
            let d = dst.add(at).cast::<__m128i>();
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        at += BLOCK;
    }
    // SAFETY: streaming stores are weakly ordered: the fence orders them
    // before anything this thread does next (a seal message included).
    unsafe { _mm_sfence() };
    // SAFETY: the tail, inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(at), dst.add(at), len - at) };
}

/// Other architectures: a plain copy.
///
/// # Safety
/// As [`copy_to_shared`].
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn stream_copy(dst: *mut u8, src: &[u8]) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn streaming_copies_every_byte_at_any_alignment_and_length() {
        let src = pattern(70_000);
        for dst_offset in [0, 1, 15, 16, 33] {
            for src_offset in [0, 3] {
                for len in [0, 1, 15, 63, 64, 65, 1000, 4096 + 17, 60_000] {
                    let mut dst = vec![0xEEu8; dst_offset + len + 8];
                    let from = &src[src_offset..src_offset + len];
                    // SAFETY: `dst` holds `dst_offset + len` bytes and more.
                    unsafe { stream_copy(dst.as_mut_ptr().add(dst_offset), from) };
                    assert_eq!(&dst[dst_offset..dst_offset + len], from);
                    assert!(dst[..dst_offset].iter().all(|&b| b == 0xEE), "before");
                    assert!(dst[dst_offset + len..].iter().all(|&b| b == 0xEE), "after");
                }
            }
        }
    }

    #[test]
    fn large_copies_stream_and_small_ones_do_not_differ_in_result() {
        let src = pattern(STREAM_THRESHOLD + 100);
        let mut dst = vec![0u8; src.len() + 1];
        // SAFETY: `dst` is one byte longer than `src`.
        unsafe { copy_to_shared(dst.as_mut_ptr().add(1), &src) };
        assert_eq!(&dst[1..], &src[..]);
        let mut small = vec![0u8; 100];
        // SAFETY: as long as the source.
        unsafe { copy_to_shared(small.as_mut_ptr(), &src[..100]) };
        assert_eq!(small, src[..100]);
    }
}

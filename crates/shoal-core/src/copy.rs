//! Copying object bytes into shared memory.
//!
//! Large objects are written once and read later, usually by another
//! process: caching them on the way in only evicts the writer's working set
//! and costs a read-for-ownership of every destination line. Two ways of
//! writing whole lines straight to memory exist, and which is faster depends
//! on the CPU, so the choice is made by what the CPU reports:
//! - With ERMS (enhanced `rep movsb`, Intel since Ivy Bridge, AMD since
//!   Zen 3), copies of at least [`REP_MOVSB_THRESHOLD`] use `rep movsb`,
//!   which the CPU runs with whole-line stores. Measured here (AMD EPYC,
//!   ERMS and FSRM; bench/c/copy_limit.c into a warm shared mapping, GiB/s):
//!   1 MB 65.7 against glibc memcpy's 50.4; 16 MB 43.6 / 25.4; 100 MB 27.5 /
//!   20.6, and SSE2 / AVX2 streaming stores 25.7 / 27.6; 1 GB 27.9, streaming
//!   23.7. glibc streams only above 3/4 of the last-level cache per thread
//!   and is slower than `rep movsb` between.
//! - Without ERMS, copies of at least [`STREAM_THRESHOLD`] use SSE2
//!   non-temporal stores (an earlier VM without ERMS: memcpy 5.1–6.3 GiB/s,
//!   streaming 5.9–6.1 on 100 MB; memcpy faster below 32 MB, the destination
//!   staying in cache).
//!
//! Written by hand: no maintained crate offers either copy; each is a few
//! lines of intrinsics or assembly.

/// With ERMS, copies of at least this many bytes use `rep movsb`.
pub const REP_MOVSB_THRESHOLD: usize = 1 << 20;

/// Without ERMS, copies of at least this many bytes use streaming stores.
pub const STREAM_THRESHOLD: usize = 32 << 20;

/// How [`copy_to_shared`] copies `len` bytes on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyMethod {
    /// glibc's memcpy (`copy_nonoverlapping`).
    Memcpy,
    /// `rep movsb` (CPUs with ERMS).
    RepMovsb,
    /// SSE2 non-temporal stores.
    Stream,
}

/// The method [`copy_to_shared`] uses for a copy of `len` bytes here.
pub fn method_for(len: usize) -> CopyMethod {
    #[cfg(target_arch = "x86_64")]
    {
        // Cached by std after the first call: an atomic load.
        if std::arch::is_x86_feature_detected!("ermsb") {
            if len >= REP_MOVSB_THRESHOLD {
                return CopyMethod::RepMovsb;
            }
        } else if len >= STREAM_THRESHOLD {
            return CopyMethod::Stream;
        }
    }
    let _ = len;
    CopyMethod::Memcpy
}

/// Copies `src` to `dst` by the fastest method for its size here (see the
/// module). Large copies end with a store fence: visible to other threads
/// and processes in order after it returns.
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
pub unsafe fn copy_to_shared(dst: *mut u8, src: &[u8]) {
    match method_for(src.len()) {
        // SAFETY: the caller's contract (`dst` valid for `src.len()` bytes,
        // no overlap), which each copy needs and no more.
        CopyMethod::RepMovsb => unsafe { rep_movsb_copy(dst, src) },
        // SAFETY: as above.
        CopyMethod::Stream => unsafe { stream_copy(dst, src) },
        // SAFETY: as above.
        CopyMethod::Memcpy => unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len())
        },
    }
}

/// Copies with `rep movsb` whatever the size, then fences: the string's
/// stores may be weakly ordered among themselves, and the seal that follows
/// must not be seen before them.
///
/// # Safety
/// As [`copy_to_shared`].
#[cfg(target_arch = "x86_64")]
pub unsafe fn rep_movsb_copy(dst: *mut u8, src: &[u8]) {
    // SAFETY: rcx bytes from rsi to rdi, forwards (the ABI keeps the
    // direction flag clear); both ranges valid and disjoint (the caller's
    // contract). The fence orders the stores before later ones.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") src.len() => _,
            inout("rdi") dst => _,
            inout("rsi") src.as_ptr() => _,
            options(nostack, preserves_flags)
        );
        std::arch::x86_64::_mm_sfence();
    }
}

/// Other architectures: a plain copy.
///
/// # Safety
/// As [`copy_to_shared`].
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn rep_movsb_copy(dst: *mut u8, src: &[u8]) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
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
    fn both_large_copies_copy_every_byte_at_any_alignment_and_length() {
        let src = pattern(70_000);
        type Copy = unsafe fn(*mut u8, &[u8]);
        let copies: [(&str, Copy); 2] = [("stream", stream_copy), ("rep movsb", rep_movsb_copy)];
        for (name, copy) in copies {
            for dst_offset in [0, 1, 15, 16, 33] {
                for src_offset in [0, 3] {
                    for len in [0, 1, 15, 63, 64, 65, 1000, 4096 + 17, 60_000] {
                        let mut dst = vec![0xEEu8; dst_offset + len + 8];
                        let from = &src[src_offset..src_offset + len];
                        // SAFETY: `dst` holds `dst_offset + len` bytes and more.
                        unsafe { copy(dst.as_mut_ptr().add(dst_offset), from) };
                        assert_eq!(&dst[dst_offset..dst_offset + len], from, "{name}");
                        assert!(
                            dst[..dst_offset].iter().all(|&b| b == 0xEE),
                            "{name} before"
                        );
                        assert!(
                            dst[dst_offset + len..].iter().all(|&b| b == 0xEE),
                            "{name} after"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn small_copies_use_memcpy_and_large_ones_a_whole_line_method() {
        assert_eq!(method_for(0), CopyMethod::Memcpy);
        assert_eq!(method_for(4096), CopyMethod::Memcpy);
        #[cfg(target_arch = "x86_64")]
        assert_ne!(method_for(STREAM_THRESHOLD), CopyMethod::Memcpy);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("ermsb") {
            assert_eq!(method_for(REP_MOVSB_THRESHOLD), CopyMethod::RepMovsb);
        } else {
            assert_eq!(method_for(REP_MOVSB_THRESHOLD), CopyMethod::Memcpy);
        }
    }

    #[test]
    fn large_and_small_copies_do_not_differ_in_result() {
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

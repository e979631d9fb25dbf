//! Bounce buffers for direct reads and writes: 2 MiB aligned, backed by
//! transparent huge pages where the kernel gives them, pooled between uses.
//!
//! Why huge pages: a direct read becomes one device request only if its
//! buffer fits the queue's segment limit. This machine's virtio disk takes
//! at most 254 segments per request, so a 1 MiB read into 4 KiB pages that
//! are not physically contiguous is split in two — and the device's
//! throughput follows the request size (dd's own 1 MiB reads: 1,010 KiB per
//! request at 2,237 MiB/s, 511 KiB per request at 1,521 MiB/s, a minute
//! apart; counted in /sys/block/vda/stat). A 2 MiB page is one segment, so
//! a read of up to 4 MiB (the queue's max_sectors_kb) goes down whole.
//! Why by hand: `Vec` gives no alignment control, and memmap2 neither aligns
//! a mapping to 2 MiB nor frees its head and tail.

use std::io;
use std::ptr::NonNull;
use std::sync::Mutex;

/// The huge page size on x86-64 and on aarch64 with 4 KiB base pages.
const HUGE: usize = 2 << 20;

/// Bytes of buffers kept for the next reads and writes (given back to the
/// kernel above that): the 16 large restores the daemon lets run at once, at
/// one or two huge pages each, or the image writes of a drain into two tiers
/// at once (four images per tier, two 4 MiB buffers each). At 48 MiB the
/// drain's buffers were unmapped and faulted in again (zeroed) all the time:
/// 3 % of the machine's CPU with eight writers on a FUSE mount (perf).
const POOL_BYTES: usize = 96 << 20;

static POOL: Pool = Pool::new(POOL_BYTES);

/// Buffers kept for reuse, at most `limit` bytes of them.
pub(super) struct Pool {
    kept: Mutex<Vec<HugeBuf>>,
    limit: usize,
}

/// An anonymous mapping of a whole number of huge pages, 2 MiB aligned,
/// zeroed when new.
pub(super) struct HugeBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone (no other pointer to it).
unsafe impl Send for HugeBuf {}

impl HugeBuf {
    fn new(len: usize) -> io::Result<Self> {
        let len = len.max(1).next_multiple_of(HUGE);
        // Map one huge page more than needed, then unmap the unaligned head
        // and the tail, which leaves exactly `len` bytes on a 2 MiB boundary.
        let span = len + HUGE;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE);
        let head = aligned - start;
        let tail = span - head - len;
        // SAFETY: both ranges lie inside the mapping made above and outside
        // the part kept; failure to unmap them would only leak address space.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            // Advice only: without THP (or with it off) the pages are small.
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        Ok(Self {
            ptr: NonNull::new(aligned as *mut u8).expect("mmap never returns null"),
            len,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped readable and writable, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HugeBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

impl Pool {
    const fn new(limit: usize) -> Self {
        Self {
            kept: Mutex::new(Vec::new()),
            limit,
        }
    }

    /// The smallest kept buffer of at least `len` bytes, or a new one.
    fn take(&'static self, len: usize) -> io::Result<Bounce> {
        let kept = {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            (0..kept.len())
                .filter(|&i| kept[i].len() >= len)
                .min_by_key(|&i| kept[i].len())
                .map(|i| kept.swap_remove(i))
        };
        let buf = match kept {
            Some(buf) => buf,
            None => HugeBuf::new(len)?,
        };
        Ok(Bounce {
            buf: Some(buf),
            pool: self,
        })
    }

    fn give_back(&self, buf: HugeBuf) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let bytes: usize = kept.iter().map(HugeBuf::len).sum();
        if bytes + buf.len() <= self.limit {
            kept.push(buf);
        }
    }
}

/// A pooled [`HugeBuf`] of at least the bytes asked for; back to its pool
/// when dropped (if the pool has room).
pub(super) struct Bounce {
    buf: Option<HugeBuf>,
    pool: &'static Pool,
}

impl Bounce {
    /// A buffer of at least `len` bytes from the process's pool.
    pub(super) fn take(len: usize) -> io::Result<Self> {
        POOL.take(len)
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        self.buf.as_ref().expect("present until dropped").as_slice()
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf
            .as_mut()
            .expect("present until dropped")
            .as_mut_slice()
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.give_back(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_huge_page_aligned_whole_pages_and_zeroed() {
        for len in [1, 4096, (1 << 20) + 8192, HUGE, HUGE + 1, (4 << 20) + 4096] {
            let mut buf = HugeBuf::new(len).unwrap();
            assert_eq!(buf.as_slice().as_ptr() as usize % HUGE, 0);
            assert!(buf.len() >= len && buf.len().is_multiple_of(HUGE));
            assert!(buf.as_slice().iter().all(|&b| b == 0));
            buf.as_mut_slice().fill(0xa5);
            assert!(buf.as_slice().iter().all(|&b| b == 0xa5));
        }
    }

    #[test]
    fn a_returned_buffer_serves_the_next_read_that_fits_and_the_pool_is_bounded() {
        static TEST_POOL: Pool = Pool::new(4 * HUGE);
        let first = TEST_POOL.take(HUGE + 1).unwrap();
        let address = first.as_slice().as_ptr();
        drop(first);
        // The smallest kept buffer that fits, the one just given back.
        let small = TEST_POOL.take(HUGE).unwrap();
        assert!(TEST_POOL.take(1).unwrap().as_slice().as_ptr() != small.as_slice().as_ptr());
        drop(small);
        let again = TEST_POOL.take(2 * HUGE).unwrap();
        assert_eq!(again.as_slice().as_ptr(), address);
        drop(again);
        // Kept now: one and two huge pages. A buffer that would take the pool
        // past its limit (four) is unmapped instead.
        let a = TEST_POOL.take(2 * HUGE).unwrap();
        let b = TEST_POOL.take(4 * HUGE).unwrap();
        drop(a);
        drop(b);
        let kept: usize = TEST_POOL
            .kept
            .lock()
            .unwrap()
            .iter()
            .map(HugeBuf::len)
            .sum();
        assert_eq!(kept, 3 * HUGE);
    }
}

//! Restores of large images with direct I/O (O_DIRECT), past the page cache.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::format::HEADER_LEN;

use super::io::{copy_checksummed, CHUNK, DIRECT_ALIGN};

/// `path` opened for direct I/O (O_DIRECT), or `None` where the file system
/// refuses it (tmpfs, some FUSE): the caller reads through the page cache.
pub(super) fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

/// Reads the payload of an image (`dst.len()` bytes at offset `HEADER_LEN`)
/// from `file`, opened with O_DIRECT, into `dst`; returns its CRC-32C.
///
/// Why: a buffered restore reads through the page cache (a copy, and
/// readahead windows that keep the device below its sequential limit); a
/// direct read of large aligned blocks runs at the device's limit. The
/// payload starts at byte 64, so blocks go to an aligned bounce buffer and
/// are copied out, which is cheap beside the device. One thread reads block
/// k + 1 while this one copies and checksums block k, so the copy and the
/// checksum hide behind the device.
pub(super) fn read_payload_direct(file: &File, dst: &mut [u8]) -> io::Result<u32> {
    use std::sync::mpsc;

    let end = HEADER_LEN as u64 + dst.len() as u64;
    let blocks = end.div_ceil(CHUNK as u64);
    let (full_tx, full_rx) = mpsc::sync_channel::<io::Result<(Bounce, usize, usize)>>(1);
    let (free_tx, free_rx) = mpsc::sync_channel::<Bounce>(2);
    for _ in 0..2 {
        free_tx.send(Bounce::take()).expect("the receiver is alive");
    }
    // `move`: this side's ends of the channels drop when it returns, so a
    // reader blocked on them stops and the scope's join cannot hang.
    std::thread::scope(move |scope| {
        scope.spawn(move || {
            for block in 0..blocks {
                let Ok(mut buf) = free_rx.recv() else { return };
                let start = buf.0.as_ptr().align_offset(DIRECT_ALIGN);
                let offset = block * CHUNK as u64;
                let want = (end - offset).min(CHUNK as u64) as usize;
                let read = read_direct(file, &mut buf.0[start..start + CHUNK], offset, want);
                let failed = read.is_err();
                if full_tx.send(read.map(|n| (buf, start, n))).is_err() || failed {
                    return;
                }
            }
        });
        let mut crc = 0u32;
        for block in 0..blocks {
            let (buf, start, got) = full_rx
                .recv()
                .map_err(|_| io::Error::other("the direct reader stopped"))??;
            let offset = block * CHUNK as u64;
            // The part of this block inside the payload.
            let from = (HEADER_LEN as u64).saturating_sub(offset) as usize;
            let to = ((end - offset) as usize).min(got);
            if to < ((end - offset) as usize).min(CHUNK) {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "image shorter than its header says",
                ));
            }
            let bytes = &buf.0[start + from..start + to];
            let at = (offset + from as u64 - HEADER_LEN as u64) as usize;
            crc = copy_checksummed(&mut dst[at..at + bytes.len()], bytes, crc);
            // The reader may have finished (last block): a closed channel is fine.
            let _ = free_tx.send(buf);
        }
        Ok(crc)
    })
}

/// A bounce buffer of a block reader: `CHUNK` bytes at an aligned offset.
/// Taken from a small pool and given back on drop (wherever the channels
/// leave it): a fresh one per restore cost a 4 MiB memset and its page
/// faults, a quarter of the CPU of restoring 16 MiB objects here.
struct Bounce(Vec<u8>);

/// Bounce buffers kept for the next restores: two per block reader, for
/// the four 16 MiB restores the daemon's restore budget lets run at once.
const BOUNCE_POOL: usize = 8;
static BOUNCES: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());

impl Bounce {
    fn take() -> Self {
        let kept = BOUNCES.lock().unwrap_or_else(|e| e.into_inner()).pop();
        Self(kept.unwrap_or_else(|| vec![0u8; CHUNK + DIRECT_ALIGN]))
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        let mut pool = BOUNCES.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < BOUNCE_POOL {
            pool.push(std::mem::take(&mut self.0));
        }
    }
}

/// One direct read of `buf` (aligned, a whole number of blocks) at `offset`,
/// retried on short reads until `want` bytes or the end of the file.
fn read_direct(file: &File, buf: &mut [u8], offset: u64, want: usize) -> io::Result<usize> {
    let mut got = 0;
    while got < want {
        // Direct reads must start on a block boundary: after a short read
        // that is not one, the file ended.
        if got % DIRECT_ALIGN != 0 {
            break;
        }
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// `file` opened again for direct I/O through `/proc/self/fd`: the same
/// inode even if its path was renamed or removed since (a segment being
/// compacted), without changing the flags of the shared descriptor (its
/// other readers read at unaligned offsets). `None` where that fails (no
/// /proc, a file system without O_DIRECT): read through the page cache.
pub(super) fn reopen_direct(file: &File) -> Option<File> {
    use std::os::fd::AsRawFd;
    open_direct(Path::new(&format!("/proc/self/fd/{}", file.as_raw_fd())))
}

/// Aligned buffers for [`read_range_direct`], shared by every thread and
/// kept between reads: a fresh one costs a page fault per 4 KiB of every
/// read. Why shared and not one per thread: a stage_in of many small images
/// leaves hundreds of idle blocking threads behind (517 after 8,192 64 KiB
/// restores here), and a buffer of up to 4 MiB kept by each of them would
/// hold up to 2 GiB of the daemon's heap. At most [`RANGE_POOL_BYTES`] kept.
static RANGE_BOUNCES: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());
const RANGE_POOL_BYTES: usize = 32 << 20;

/// A range bounce buffer of at least `len` bytes (plus alignment), from the
/// pool when one is big enough; given back on drop.
struct RangeBounce(Vec<u8>);

impl RangeBounce {
    fn take(len: usize) -> Self {
        let need = len + DIRECT_ALIGN;
        let mut pool = RANGE_BOUNCES.lock().unwrap_or_else(|e| e.into_inner());
        // The smallest kept buffer that fits, so 4 MiB ones stay for 4 MiB reads.
        let fit = (0..pool.len())
            .filter(|&i| pool[i].len() >= need)
            .min_by_key(|&i| pool[i].len());
        match fit {
            Some(i) => Self(pool.swap_remove(i)),
            None => {
                drop(pool);
                // Rounded up to 256 KiB so near sizes share buffers.
                Self(vec![0u8; need.next_multiple_of(256 << 10)])
            }
        }
    }
}

impl Drop for RangeBounce {
    fn drop(&mut self) {
        let mut pool = RANGE_BOUNCES.lock().unwrap_or_else(|e| e.into_inner());
        let kept: usize = pool.iter().map(Vec::len).sum();
        if kept + self.0.len() <= RANGE_POOL_BYTES {
            pool.push(std::mem::take(&mut self.0));
        }
    }
}

/// The largest range [`read_range_direct`] reads: packed images, and file
/// images below `CHUNK` (larger ones are read in `CHUNK` blocks).
pub(super) const RANGE_DIRECT_MAX: usize = CHUNK + HEADER_LEN;

/// Reads bytes `at..at + len` of `direct` (opened with O_DIRECT) in one
/// direct read of the aligned blocks around them, and hands them to `f`.
/// Fewer bytes than `len` (the file ends first) are an `UnexpectedEof`.
///
/// Why: restoring packed images of ~1 MiB through the page cache ran at
/// ~0.7× the device's direct-read limit here (readahead windows, a copy into
/// the cache and one out of it); one aligned direct read per image and one
/// copy out of the bounce buffer keeps up with the device.
pub(super) fn read_range_direct<R>(
    direct: &File,
    at: u64,
    len: usize,
    f: impl FnOnce(&[u8]) -> R,
) -> io::Result<R> {
    assert!(
        len <= RANGE_DIRECT_MAX,
        "direct range reads are for packed images"
    );
    let align = DIRECT_ALIGN as u64;
    let first = at / align * align;
    let end = (at + len as u64).div_ceil(align) * align;
    let span = (end - first) as usize;
    let mut bounce = RangeBounce::take(span);
    let start = bounce.0.as_ptr().align_offset(DIRECT_ALIGN);
    let buf = &mut bounce.0[start..start + span];
    let want = (at - first) as usize + len;
    let got = read_direct(direct, buf, first, want)?;
    if got < want {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the file ends inside the range",
        ));
    }
    let from = (at - first) as usize;
    Ok(f(&buf[from..from + len]))
}

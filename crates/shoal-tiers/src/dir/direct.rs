//! Restores of large images with direct I/O (O_DIRECT), past the page cache.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::format::HEADER_LEN;

use super::bounce::Bounce;
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
/// payload starts at byte 64, so blocks go to a bounce buffer (`bounce.rs`:
/// huge pages, so each block is one device request) and
/// are copied out, which is cheap beside the device. One thread reads block
/// k + 1 while this one copies and checksums block k, so the copy and the
/// checksum hide behind the device.
pub(super) fn read_payload_direct(file: &File, dst: &mut [u8]) -> io::Result<u32> {
    use std::sync::mpsc;

    let end = HEADER_LEN as u64 + dst.len() as u64;
    let blocks = end.div_ceil(CHUNK as u64);
    let (full_tx, full_rx) = mpsc::sync_channel::<io::Result<(Bounce, usize)>>(1);
    let (free_tx, free_rx) = mpsc::sync_channel::<Bounce>(2);
    for _ in 0..2 {
        free_tx
            .send(Bounce::take(CHUNK)?)
            .expect("the receiver is alive");
    }
    // `move`: this side's ends of the channels drop when it returns, so a
    // reader blocked on them stops and the scope's join cannot hang.
    std::thread::scope(move |scope| {
        scope.spawn(move || {
            for block in 0..blocks {
                let Ok(mut buf) = free_rx.recv() else { return };
                let offset = block * CHUNK as u64;
                let want = (end - offset).min(CHUNK as u64) as usize;
                let read = read_direct(file, &mut buf.as_mut_slice()[..CHUNK], offset, want);
                let failed = read.is_err();
                if full_tx.send(read.map(|n| (buf, n))).is_err() || failed {
                    return;
                }
            }
        });
        let mut crc = 0u32;
        for block in 0..blocks {
            let (buf, got) = full_rx
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
            let bytes = &buf.as_slice()[from..to];
            let at = (offset + from as u64 - HEADER_LEN as u64) as usize;
            crc = copy_checksummed(&mut dst[at..at + bytes.len()], bytes, crc);
            // The reader may have finished (last block): a closed channel is fine.
            let _ = free_tx.send(buf);
        }
        Ok(crc)
    })
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
    let mut bounce = Bounce::take(span)?;
    let buf = &mut bounce.as_mut_slice()[..span];
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

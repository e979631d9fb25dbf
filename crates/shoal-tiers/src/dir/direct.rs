//! Restores of large images with direct I/O (O_DIRECT), past the page cache.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::format::HEADER_LEN;

use super::io::{CHUNK, DIRECT_ALIGN};

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
    let (full_tx, full_rx) = mpsc::sync_channel::<io::Result<(Vec<u8>, usize, usize)>>(1);
    let (free_tx, free_rx) = mpsc::sync_channel::<Vec<u8>>(2);
    for _ in 0..2 {
        free_tx
            .send(vec![0u8; CHUNK + DIRECT_ALIGN])
            .expect("the receiver is alive");
    }
    // `move`: this side's ends of the channels drop when it returns, so a
    // reader blocked on them stops and the scope's join cannot hang.
    std::thread::scope(move |scope| {
        scope.spawn(move || {
            for block in 0..blocks {
                let Ok(mut buf) = free_rx.recv() else { return };
                let start = buf.as_ptr().align_offset(DIRECT_ALIGN);
                let offset = block * CHUNK as u64;
                let want = (end - offset).min(CHUNK as u64) as usize;
                let read = read_direct(file, &mut buf[start..start + CHUNK], offset, want);
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
            let bytes = &buf[start + from..start + to];
            let at = (offset + from as u64 - HEADER_LEN as u64) as usize;
            dst[at..at + bytes.len()].copy_from_slice(bytes);
            crc = crc32c::crc32c_append(crc, bytes);
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

//! Large images written and restored with direct I/O (O_DIRECT), past the
//! page cache.

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
    open_direct_as(path, false)
}

/// `path` opened for reading, or for writing if `write`, with O_DIRECT.
fn open_direct_as(path: &Path, write: bool) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

/// `file` (a new image being written) opened again for direct writes
/// through `/proc/self/fd`, or `None` where that fails: the caller writes
/// through the page cache.
pub(super) fn reopen_direct_for_write(file: &File) -> Option<File> {
    use std::os::fd::AsRawFd;
    open_direct_as(
        Path::new(&format!("/proc/self/fd/{}", file.as_raw_fd())),
        true,
    )
}

/// An aligned page for the first block of an image, written last.
#[repr(C, align(4096))]
struct FirstBlock([u8; DIRECT_ALIGN]);
const _: () = assert!(std::mem::align_of::<FirstBlock>() == DIRECT_ALIGN);

/// Writes the image of `payload` to `file` (new, empty, opened with
/// O_DIRECT): `header(crc)` in front, where `crc` is the payload's CRC-32C,
/// which is returned. The file is left a whole number of `DIRECT_ALIGN`
/// blocks long (zeros past the image); the caller truncates it to
/// `HEADER_LEN + payload.len()`. An `InvalidInput` error means the file
/// system refused direct writes here: the caller writes through the page
/// cache instead.
///
/// Why: a buffered write copies every byte into the page cache, whose pages
/// the kernel then allocates, writes back and reclaims. With eight writers
/// on a FUSE mount that copy was 47 % of the daemon's CPU (perf, NOTES.md),
/// and a drained image is never read back through the cache (restores are
/// direct too). Here each block is copied once into a huge-page bounce
/// buffer (`bounce.rs`), checksummed while in cache, and handed to the
/// device. Why a bounce and not the store's memory itself: the payload
/// sits 64 bytes into the image, so its blocks never line up with the
/// file's. One thread writes block k while this one fills block k + 1.
/// The header (which holds the checksum) goes down last, in the first block.
pub(super) fn write_image_direct(
    file: &File,
    payload: &[u8],
    header: impl FnOnce(u32) -> [u8; HEADER_LEN],
) -> io::Result<u32> {
    use std::sync::mpsc;

    let end = (HEADER_LEN + payload.len()) as u64;
    let blocks = end.div_ceil(CHUNK as u64);
    // Every block's aligned length is at least one page, so the first
    // block's first page is written last, whole.
    let mut first_block = Box::new(FirstBlock([0u8; DIRECT_ALIGN]));
    let first = &mut *first_block;
    // Filled buffers with the file range to write from them, and the
    // buffers given back (or the writer's error).
    let (full_tx, full_rx) = mpsc::sync_channel::<(Bounce, u64, usize, usize)>(1);
    let (free_tx, free_rx) = mpsc::sync_channel::<io::Result<Bounce>>(2);
    for _ in 0..2 {
        free_tx
            .send(Bounce::take(CHUNK))
            .expect("the receiver is alive");
    }
    let crc = std::thread::scope(move |scope| {
        scope.spawn(move || {
            for (buf, offset, from, to) in full_rx {
                let written = file.write_all_at(&buf.as_slice()[from..to], offset + from as u64);
                let failed = written.is_err();
                if free_tx.send(written.map(|()| buf)).is_err() || failed {
                    return;
                }
            }
        });
        let mut crc = 0u32;
        for block in 0..blocks {
            let mut buf = free_rx
                .recv()
                .map_err(|_| io::Error::other("the direct writer stopped"))??;
            let offset = block * CHUNK as u64;
            let len = (end - offset).min(CHUNK as u64) as usize;
            let aligned = len.next_multiple_of(DIRECT_ALIGN);
            let bytes = &mut buf.as_mut_slice()[..aligned];
            // The header's place in the first block stays zero until the end.
            let from = (HEADER_LEN as u64).saturating_sub(offset) as usize;
            bytes[..from].fill(0);
            let at = (offset + from as u64 - HEADER_LEN as u64) as usize;
            crc = copy_checksummed(&mut bytes[from..len], &payload[at..at + len - from], crc);
            bytes[len..].fill(0);
            let mut start = 0;
            if block == 0 {
                first.0.copy_from_slice(&bytes[..DIRECT_ALIGN]);
                start = DIRECT_ALIGN;
            }
            if start < aligned && full_tx.send((buf, offset, start, aligned)).is_err() {
                // The writer stopped on an error: it is waiting in the free
                // channel.
                break;
            }
        }
        drop(full_tx);
        // Every write's outcome: the writer hands each buffer back.
        while let Ok(back) = free_rx.recv() {
            back?;
        }
        Ok::<u32, io::Error>(crc)
    })?;
    first_block.0[..HEADER_LEN].copy_from_slice(&header(crc));
    file.write_all_at(&first_block.0, 0)?;
    Ok(crc)
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

/// Payloads at least this large are restored with direct I/O and a reader
/// thread (below: one direct read of the whole image is cheaper).
pub(super) const DIRECT_MIN: u64 = CHUNK as u64;
/// Images (packed or not) at least this large are restored with direct
/// I/O where the file system has it (below: buffered reads, whose readahead
/// also brings the next small images of a segment in).
pub(super) const PACKED_DIRECT_MIN: u64 = 256 << 10;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{ObjectHeader, HEADER_LEN};
    use shoal_core::ids::ObjectId;

    /// Images of sizes around every boundary the direct writer cuts at (the
    /// first page, which holds the header; whole chunks), written and read
    /// back through the page cache: the bytes, the header and the length are
    /// those of a buffered write.
    #[test]
    fn direct_images_read_back_exactly_at_every_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let page = DIRECT_ALIGN - HEADER_LEN;
        for len in [
            1,
            page - 1,
            page,
            page + 1,
            CHUNK - HEADER_LEN,
            CHUNK - HEADER_LEN + 1,
            CHUNK,
            2 * CHUNK + 4097,
        ] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let path = dir.path().join(format!("image-{len}"));
            let plain = File::create_new(&path).unwrap();
            let Some(direct) = reopen_direct_for_write(&plain) else {
                eprintln!(
                    "{}: no O_DIRECT here, nothing to test",
                    dir.path().display()
                );
                return;
            };
            let id = ObjectId::from_slice(&[len as u8; 20]).unwrap();
            let header = |checksum| ObjectHeader {
                id,
                data_size: len as u64 - 1,
                meta_size: 1,
                checksum,
            };
            let crc = write_image_direct(&direct, &payload, |crc| header(crc).encode()).unwrap();
            assert_eq!(crc, crc32c::crc32c(&payload));
            direct.set_len((HEADER_LEN + len) as u64).unwrap();
            let image = std::fs::read(&path).unwrap();
            assert_eq!(
                image.len(),
                HEADER_LEN + len,
                "length of a {len}-byte image"
            );
            assert_eq!(
                ObjectHeader::decode(&image, "test").unwrap(),
                header(crc),
                "header of a {len}-byte image"
            );
            assert!(image[HEADER_LEN..] == payload[..], "payload of {len} bytes");
        }
    }

    /// A write the device refuses is the caller's error, not a short image
    /// taken for whole: a read-only descriptor fails every write.
    #[test]
    fn a_failed_direct_write_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        File::create_new(&path).unwrap();
        let Some(read_only) = open_direct(&path) else {
            eprintln!(
                "{}: no O_DIRECT here, nothing to test",
                dir.path().display()
            );
            return;
        };
        let payload = vec![1u8; 3 * CHUNK];
        let err = write_image_direct(&read_only, &payload, |_| [0; HEADER_LEN]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{err}");
    }
}

//! File-system helpers of a directory tier: error mapping, directory
//! fsyncs, fsyncs in parallel, and small files written durably.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use shoal_core::error::{ErrorKind, Result, ShoalError};

/// Bytes checksummed and written per system call: large enough for
/// sequential-write speed, small enough that the checksum pass reads bytes
/// still in cache.
pub(super) const CHUNK: usize = 4 << 20;
/// Bytes read and then checksummed at a time by buffered restores: the
/// checksum finds them still in the core's cache.
pub(super) const READ_SLICE: usize = 256 << 10;
/// Alignment of direct I/O offsets, lengths and buffers: the largest logical
/// block size of the devices we run on.
pub(super) const DIRECT_ALIGN: usize = 4096;
/// Threads that fsync a batch's files (and directories) at once.
const SYNC_THREADS: usize = 16;

/// Runs `f` on every item, from up to `SYNC_THREADS` threads at once, and
/// returns the outcomes in order. For fsyncs: the file system's journal
/// commits one transaction (and flushes the device cache once) for all the
/// fsyncs waiting on it, where one at a time would commit and flush each.
pub(super) fn in_parallel<T: Sync>(
    items: &[T],
    f: impl Fn(&T) -> io::Result<()> + Sync,
) -> Vec<io::Result<()>> {
    if items.len() <= 1 {
        return items.iter().map(&f).collect();
    }
    let threads = items.len().min(SYNC_THREADS);
    let mut out: Vec<Option<io::Result<()>>> = (0..items.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let f = &f;
        let workers: Vec<_> = (0..threads)
            .map(|first| {
                scope.spawn(move || {
                    (first..items.len())
                        .step_by(threads)
                        .map(|i| (i, f(&items[i])))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for worker in workers {
            let done = worker
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            for (i, outcome) in done {
                out[i] = Some(outcome);
            }
        }
    });
    out.into_iter()
        .map(|o| o.expect("every item ran"))
        .collect()
}

/// An I/O error with its context; a full medium is `StoreFull` (the caller
/// must not retry it as a transient fault).
pub(crate) fn io_error(context: &str, err: io::Error) -> ShoalError {
    match err.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
            ShoalError::new(ErrorKind::StoreFull, format!("{context}: {err}"))
        }
        _ => ShoalError::io(context, err),
    }
}

/// Makes the directory entries of `dir` (renames, creates, removals) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(&format!("fsync directory {}", dir.display()), e))
}

/// Writes `dir/name` whole or not at all: temp file, fsync, rename, dir fsync.
pub(crate) fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let path = dir.join(name);
    let result = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, &path)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(io_error(&format!("write {}", path.display()), e));
    }
    sync_dir(dir)
}

/// Bytes copied and then checksummed at a time by [`copy_checksummed`]:
/// small enough to be still in the core's cache for the checksum.
const COPY_SLICE: usize = 64 << 10;

/// Copies `src` into `dst` (same length) and returns `crc` extended over
/// the bytes. Why in slices: checksumming each slice right after copying it
/// reads it from cache; a checksum pass after a whole copy of a large image
/// reads it from memory a second time (a third of the restore's CPU here).
pub(super) fn copy_checksummed(dst: &mut [u8], src: &[u8], mut crc: u32) -> u32 {
    for (to, from) in dst.chunks_mut(COPY_SLICE).zip(src.chunks(COPY_SLICE)) {
        to.copy_from_slice(from);
        crc = crc32c::crc32c_append(crc, from);
    }
    crc
}

//! `DirTier`: a tier in a local or shared directory (the burst buffer on
//! NVMe, or a backing store on a parallel file system).
//!
//! ```text
//! <root>/shoal-tier.id        owner marker (identity.rs), written once
//! <root>/objects/<xx>/<id>    one image per object (format.rs); xx = the id's
//!                             first byte in hex, so no directory holds more
//!                             than 1/256 of the objects
//! <root>/tmp/<id>.<nonce>     images being written; garbage after a crash
//! ```
//!
//! Write order of a `put`: write the image to `tmp/`, fsync it, rename it to
//! `objects/xx/<id>`, fsync `objects/xx`. A crash before the rename leaves
//! only garbage in `tmp/` (swept at start); after the directory fsync the
//! image survives. Blocking file I/O runs on tokio's blocking pool.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use async_trait::async_trait;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ObjectId;

use crate::format::{checksum_mismatch, ObjectHeader, ObjectSizes, HEADER_LEN};
use crate::identity::TierIdentity;
use crate::range::{DestRange, SourceRange};
use crate::tier::{Tier, TierUsage};

const MARKER: &str = "shoal-tier.id";
const OBJECTS: &str = "objects";
const TMP: &str = "tmp";
/// Bytes checksummed and written per system call: large enough for
/// sequential-write speed, small enough that the checksum pass reads bytes
/// still in cache.
const CHUNK: usize = 4 << 20;
/// Payloads at least this large are restored with direct I/O (below: one
/// buffered read is cheaper than a reader thread).
const DIRECT_MIN: u64 = CHUNK as u64;
/// Alignment of direct I/O offsets, lengths and buffers: the largest logical
/// block size of the devices we run on.
const DIRECT_ALIGN: usize = 4096;

/// A directory tier. Cheap to clone (shared state).
#[derive(Clone)]
pub struct DirTier {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    capacity: u64,
    used: AtomicU64,
    objects: AtomicU64,
    /// True once the sizes of the images found at open are in `used`. The
    /// count runs in the background (a stat per file: seconds for a million
    /// objects, which must not delay a restart); writes and deletes wait for
    /// it so their own accounting never mixes with a half-done count.
    counted: (Mutex<bool>, Condvar),
}

impl std::fmt::Debug for DirTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DirTier({})", self.inner.root.display())
    }
}

impl DirTier {
    /// Opens (or initialises) the tier at `root` for `owner`, with room for
    /// `capacity` bytes of images. Blocking: walks the directory to count what
    /// it holds. Refuses a directory whose marker names another node or
    /// cluster, and a non-empty directory without a marker (recovery deletes
    /// files it cannot account for: it must never run on someone's data).
    pub fn open(root: &Path, owner: &TierIdentity, capacity: u64) -> Result<Self> {
        let what = root.display().to_string();
        fs::create_dir_all(root)
            .map_err(|e| io_error(&format!("create tier directory {what}"), e))?;
        let marker = root.join(MARKER);
        match fs::read_to_string(&marker) {
            Ok(text) => owner.check(
                &TierIdentity::decode(&text, &marker.display().to_string())?,
                &what,
            )?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut entries =
                    fs::read_dir(root).map_err(|e| io_error(&format!("read {what}"), e))?;
                if let Some(entry) = entries.next() {
                    let name = entry.map(|e| e.file_name()).unwrap_or_default();
                    return Err(ShoalError::invalid(format!(
                        "tier directory {what} is not empty ({name:?}) and has no {MARKER}: \
                         refusing to use a directory shoal did not make"
                    )));
                }
                write_durably(root, MARKER, owner.encode()?.as_bytes())?;
            }
            Err(e) => return Err(io_error(&format!("read {}", marker.display()), e)),
        }
        for dir in [root.join(TMP), root.join(OBJECTS)] {
            fs::create_dir_all(&dir)
                .map_err(|e| io_error(&format!("create {}", dir.display()), e))?;
        }
        for fan in 0..=255u8 {
            let dir = root.join(OBJECTS).join(format!("{fan:02x}"));
            fs::create_dir_all(&dir)
                .map_err(|e| io_error(&format!("create {}", dir.display()), e))?;
        }
        sync_dir(root)?;
        let tier = Self {
            inner: Arc::new(Inner {
                root: root.to_path_buf(),
                capacity,
                used: AtomicU64::new(0),
                objects: AtomicU64::new(0),
                counted: (Mutex::new(false), Condvar::new()),
            }),
        };
        // Listing errors surface here; the sizes are summed in the background.
        let found = tier.inner.walk()?;
        let inner = tier.inner.clone();
        let count = move || {
            let (mut used, mut objects) = (0u64, 0u64);
            for (_, path) in found {
                if let Ok(meta) = fs::metadata(&path) {
                    used += meta.len();
                    objects += 1;
                }
            }
            inner.used.fetch_add(used, Ordering::AcqRel);
            inner.objects.fetch_add(objects, Ordering::Relaxed);
            let (done, changed) = &inner.counted;
            *done.lock().unwrap_or_else(|e| e.into_inner()) = true;
            changed.notify_all();
        };
        if let Err(e) = std::thread::Builder::new()
            .name("shoal-tier-count".into())
            .spawn(count)
        {
            return Err(io_error(&format!("start counting {what}"), e));
        }
        Ok(tier)
    }

    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Blocks until `usage` counts every image that was there at open (it is
    /// summed in the background; until then `usage` may be short).
    pub fn wait_counted(&self) {
        self.inner.wait_counted();
    }

    /// Where the image of `id` lives (for tests that damage files on purpose).
    pub fn object_path(&self, id: &ObjectId) -> PathBuf {
        self.inner.path_of(id)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| ShoalError::io("tier I/O task", e))?
    }
}

impl Inner {
    fn path_of(&self, id: &ObjectId) -> PathBuf {
        let hex = id.to_hex();
        self.root.join(OBJECTS).join(&hex[..2]).join(hex)
    }

    /// Every (id, path) under `objects/` whose name is an id.
    fn walk(&self) -> Result<Vec<(ObjectId, PathBuf)>> {
        let mut out = Vec::new();
        for fan in 0..=255u8 {
            let dir = self.root.join(OBJECTS).join(format!("{fan:02x}"));
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error(&format!("list {}", dir.display()), e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io_error(&format!("list {}", dir.display()), e))?;
                if let Some(id) = id_in_fan(&entry.file_name(), fan) {
                    out.push((id, entry.path()));
                }
            }
        }
        Ok(out)
    }

    /// Blocks until the count of the images found at open is done.
    fn wait_counted(&self) {
        let (done, changed) = &self.counted;
        let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            done = changed.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Takes `bytes` of the capacity, or fails with `StoreFull`.
    fn reserve(&self, bytes: u64) -> Result<()> {
        self.wait_counted();
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes)
                    .filter(|&total| total <= self.capacity)
            })
            .map(drop)
            .map_err(|used| {
                ShoalError::new(
                    ErrorKind::StoreFull,
                    format!(
                        "tier {}: {bytes} bytes do not fit ({used} of {} used)",
                        self.root.display(),
                        self.capacity
                    ),
                )
            })
    }

    fn unreserve(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    fn put(&self, id: ObjectId, sizes: ObjectSizes, src: SourceRange) -> Result<ObjectHeader> {
        if src.len() as u64 != sizes.payload_len() {
            return Err(ShoalError::invalid(format!(
                "object {id}: source range of {} bytes for {} + {} bytes",
                src.len(),
                sizes.data_size,
                sizes.meta_size
            )));
        }
        let stored = HEADER_LEN as u64 + sizes.payload_len();
        self.reserve(stored)?;
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| ShoalError::io("random temp name", e))?;
        let tmp = self.root.join(TMP).join(format!(
            "{}.{:016x}",
            id.to_hex(),
            u64::from_le_bytes(nonce)
        ));
        let result = self.write_image(id, sizes, &src, &tmp);
        drop(src); // the caller may reuse its memory from here on
        match result {
            Ok((header, replaced)) => {
                if let Some(old) = replaced {
                    self.unreserve(old);
                } else {
                    self.objects.fetch_add(1, Ordering::Relaxed);
                }
                Ok(header)
            }
            Err(err) => {
                let _ = fs::remove_file(&tmp);
                self.unreserve(stored);
                Err(err)
            }
        }
    }

    /// Data fsync, rename, directory fsync. Returns the header and the size of
    /// the image it replaced, if any.
    fn write_image(
        &self,
        id: ObjectId,
        sizes: ObjectSizes,
        src: &SourceRange,
        tmp: &Path,
    ) -> Result<(ObjectHeader, Option<u64>)> {
        let context = || format!("write {}", tmp.display());
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp)
            .map_err(|e| io_error(&context(), e))?;
        // One pass over the source: checksum a chunk while it is in cache, write
        // it, and put the header (which holds the checksum) in front at the end.
        let mut crc = 0u32;
        let mut offset = HEADER_LEN as u64;
        for chunk in src.as_slice().chunks(CHUNK) {
            crc = crc32c::crc32c_append(crc, chunk);
            file.write_all_at(chunk, offset)
                .map_err(|e| io_error(&context(), e))?;
            offset += chunk.len() as u64;
        }
        let header = ObjectHeader {
            id,
            data_size: sizes.data_size,
            meta_size: sizes.meta_size,
            checksum: crc,
        };
        file.write_all_at(&header.encode(), 0)
            .map_err(|e| io_error(&context(), e))?;
        file.flush().map_err(|e| io_error(&context(), e))?;
        file.sync_all()
            .map_err(|e| io_error(&format!("fsync {}", tmp.display()), e))?;
        drop(file);
        let path = self.path_of(&id);
        let replaced = fs::metadata(&path).ok().map(|m| m.len());
        fs::rename(tmp, &path)
            .map_err(|e| io_error(&format!("rename to {}", path.display()), e))?;
        sync_dir(path.parent().expect("object paths have a parent"))?;
        Ok((header, replaced))
    }

    /// Opens `id`'s image and checks its header against `id` (and its length
    /// against the file's), returning the file positioned at the payload.
    fn open_image(&self, id: &ObjectId) -> Result<(File, ObjectHeader, String)> {
        let path = self.path_of(id);
        let what = path.display().to_string();
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ShoalError::new(
                    ErrorKind::ObjectNotFound,
                    format!("object {id} is not on tier {}", self.root.display()),
                ))
            }
            Err(e) => return Err(io_error(&format!("open {what}"), e)),
        };
        let mut head = [0u8; HEADER_LEN];
        let got =
            read_full(&mut file, &mut head).map_err(|e| io_error(&format!("read {what}"), e))?;
        let header = ObjectHeader::decode(&head[..got], &what)?;
        if header.id != *id {
            return Err(ShoalError::new(
                ErrorKind::ObjectCorrupt,
                format!("{what}: holds object {} instead", header.id),
            ));
        }
        let len = file
            .metadata()
            .map_err(|e| io_error(&format!("stat {what}"), e))?
            .len();
        if len != header.stored_len() {
            return Err(ShoalError::new(
                ErrorKind::ObjectCorrupt,
                format!(
                    "{what}: {len} bytes, the header says {}",
                    header.stored_len()
                ),
            ));
        }
        Ok((file, header, what))
    }

    fn get(&self, id: ObjectId, dst: &mut DestRange) -> Result<ObjectHeader> {
        let (mut file, header, what) = self.open_image(&id)?;
        if header.payload_len() != dst.len() as u64 {
            return Err(ShoalError::invalid(format!(
                "object {id}: destination of {} bytes for a {}-byte object",
                dst.len(),
                header.payload_len()
            )));
        }
        let direct = if header.payload_len() >= DIRECT_MIN {
            open_direct(&self.path_of(&id))
        } else {
            None
        };
        let crc = match direct {
            Some(direct) => read_payload_direct(&direct, dst.as_mut_slice())
                .map_err(|e| io_error(&format!("read {what}"), e))?,
            None => {
                let mut crc = 0u32;
                for chunk in dst.as_mut_slice().chunks_mut(CHUNK) {
                    file.read_exact(chunk)
                        .map_err(|e| io_error(&format!("read {what}"), e))?;
                    crc = crc32c::crc32c_append(crc, chunk);
                }
                crc
            }
        };
        if crc != header.checksum {
            return Err(checksum_mismatch(&what, header.checksum, crc));
        }
        Ok(header)
    }

    fn verify(&self, id: ObjectId) -> Result<ObjectHeader> {
        let (mut file, header, what) = self.open_image(&id)?;
        let mut buf = vec![0u8; CHUNK.min(header.payload_len() as usize)];
        let (mut left, mut crc) = (header.payload_len(), 0u32);
        while left > 0 {
            let n = (left as usize).min(buf.len());
            file.read_exact(&mut buf[..n])
                .map_err(|e| io_error(&format!("read {what}"), e))?;
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            left -= n as u64;
        }
        if crc != header.checksum {
            return Err(checksum_mismatch(&what, header.checksum, crc));
        }
        Ok(header)
    }

    fn delete(&self, id: ObjectId) -> Result<bool> {
        self.wait_counted();
        let path = self.path_of(&id);
        let len = match fs::metadata(&path) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_error(&format!("stat {}", path.display()), e)),
        };
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_error(&format!("remove {}", path.display()), e)),
        }
        sync_dir(path.parent().expect("object paths have a parent"))?;
        self.unreserve(len);
        self.objects.fetch_sub(1, Ordering::Relaxed);
        Ok(true)
    }

    fn sweep(&self) -> Result<u64> {
        let mut removed = 0;
        let tmp = self.root.join(TMP);
        for entry in
            fs::read_dir(&tmp).map_err(|e| io_error(&format!("list {}", tmp.display()), e))?
        {
            let entry = entry.map_err(|e| io_error(&format!("list {}", tmp.display()), e))?;
            remove_any(&entry.path())?;
            removed += 1;
        }
        // Names under objects/ that are not ids are nobody's objects.
        for fan in 0..=255u8 {
            let dir = self.root.join(OBJECTS).join(format!("{fan:02x}"));
            for entry in
                fs::read_dir(&dir).map_err(|e| io_error(&format!("list {}", dir.display()), e))?
            {
                let entry = entry.map_err(|e| io_error(&format!("list {}", dir.display()), e))?;
                if id_in_fan(&entry.file_name(), fan).is_none() {
                    remove_any(&entry.path())?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

#[async_trait]
impl Tier for DirTier {
    fn describe(&self) -> String {
        self.inner.root.display().to_string()
    }

    fn usage(&self) -> TierUsage {
        TierUsage {
            capacity: self.inner.capacity,
            used: self.inner.used.load(Ordering::Acquire),
            objects: self.inner.objects.load(Ordering::Relaxed),
        }
    }

    async fn put(
        &self,
        id: ObjectId,
        sizes: ObjectSizes,
        src: SourceRange,
    ) -> Result<ObjectHeader> {
        self.blocking(move |inner| inner.put(id, sizes, src)).await
    }

    async fn get(&self, id: ObjectId, dst: DestRange) -> (DestRange, Result<ObjectHeader>) {
        let inner = self.inner.clone();
        let task = tokio::task::spawn_blocking(move || {
            let mut dst = dst;
            let got = inner.get(id, &mut dst);
            (dst, got)
        });
        match task.await {
            Ok(done) => done,
            // The task panicked and took the range with it: nothing to hand back.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    async fn verify(&self, id: ObjectId) -> Result<ObjectHeader> {
        self.blocking(move |inner| inner.verify(id)).await
    }

    async fn delete(&self, id: ObjectId) -> Result<bool> {
        self.blocking(move |inner| inner.delete(id)).await
    }

    async fn list(&self) -> Result<Vec<ObjectId>> {
        self.blocking(|inner| Ok(inner.walk()?.into_iter().map(|(id, _)| id).collect()))
            .await
    }

    async fn sweep(&self) -> Result<u64> {
        self.blocking(|inner| inner.sweep()).await
    }
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

/// The id named by a file in fan-out directory `fan`, if the name is one.
fn id_in_fan(name: &std::ffi::OsStr, fan: u8) -> Option<ObjectId> {
    name.to_str()
        .and_then(ObjectId::from_hex)
        .filter(|id| id.as_bytes()[0] == fan)
}

/// `path` opened for direct I/O (O_DIRECT), or `None` where the file system
/// refuses it (tmpfs, some FUSE): the caller reads through the page cache.
fn open_direct(path: &Path) -> Option<File> {
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
fn read_payload_direct(file: &File, dst: &mut [u8]) -> io::Result<u32> {
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

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
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

fn remove_any(path: &Path) -> Result<()> {
    let result = if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    match result {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(io_error(&format!("remove {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

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
use futures_util::StreamExt;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ObjectId;

use crate::format::{checksum_mismatch, ObjectHeader, ObjectSizes, HEADER_LEN};
use crate::identity::TierIdentity;
use crate::range::{DestRange, SourceRange};
use crate::tier::{PutItem, Tier, TierUsage};

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
/// Images of a batch staged at once (each on a blocking thread).
const STAGE_PARALLEL: usize = 4;
/// Threads that fsync a batch's files (and directories) at once.
const SYNC_THREADS: usize = 16;

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
    /// What the walk at open found, kept for recovery's first `sweep` and
    /// `list` (a restart would otherwise list a million files three times).
    found: (Mutex<Found>, Condvar),
}

/// The walk at open, in the background, and what it found.
#[derive(Default)]
struct Found {
    /// `None` while the walk runs; its error, if it failed.
    walked: Option<Result<()>>,
    /// Ids of the images found, until the first `list` takes them.
    ids: Option<Vec<ObjectId>>,
    /// Names under `objects/` that are not ids, until the first `sweep`.
    strays: Option<Vec<PathBuf>>,
    /// Images placed (`true`) or removed since the walk began, in order,
    /// while `ids` is kept: the first `list` applies them.
    since: Vec<(ObjectId, bool)>,
}

/// Threads that walk the fan-out directories at open.
const WALKERS: usize = 4;

/// An image written to `tmp/` and not yet published (see `Inner::stage`).
struct Staged {
    id: ObjectId,
    tmp: PathBuf,
    file: File,
    header: ObjectHeader,
    /// Capacity it took.
    stored: u64,
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
                found: (Mutex::new(Found::default()), Condvar::new()),
            }),
        };
        // The walk (and then the count of sizes) runs in the background,
        // while recovery reads the manifest.
        let inner = tier.inner.clone();
        let walk = move || {
            let walked = inner.walk();
            let ids: Vec<ObjectId> = match walked {
                Ok((ids, strays)) => {
                    let mut found = inner.found.0.lock().unwrap_or_else(|e| e.into_inner());
                    found.ids = Some(ids.clone());
                    found.strays = Some(strays);
                    found.walked = Some(Ok(()));
                    ids
                }
                Err(err) => {
                    inner
                        .found
                        .0
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .walked = Some(Err(err));
                    Vec::new()
                }
            };
            inner.found.1.notify_all();
            // The count is a stat per image: let a starting daemon's own
            // work go first (this thread's priority only; it ends here).
            // SAFETY: plain system calls on this thread's own id.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
            }
            let (mut used, mut objects) = (0u64, 0u64);
            for id in &ids {
                if let Ok(meta) = fs::metadata(inner.path_of(id)) {
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
            .name("shoal-tier-walk".into())
            .spawn(walk)
        {
            return Err(io_error(&format!("start walking {what}"), e));
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

    /// The ids of the images under `objects/`, and the paths there that are
    /// no object's. The 256 fan-out directories are listed by a few threads.
    fn walk(&self) -> Result<(Vec<ObjectId>, Vec<PathBuf>)> {
        let parts: Vec<Result<(Vec<ObjectId>, Vec<PathBuf>)>> = std::thread::scope(|scope| {
            let walkers: Vec<_> = (0..WALKERS)
                .map(|first| {
                    scope.spawn(move || {
                        let (mut ids, mut strays) = (Vec::new(), Vec::new());
                        for fan in (first..256).step_by(WALKERS) {
                            self.walk_fan(fan as u8, &mut ids, &mut strays)?;
                        }
                        Ok((ids, strays))
                    })
                })
                .collect();
            walkers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let (mut ids, mut strays) = (Vec::new(), Vec::new());
        for part in parts {
            let (i, s) = part?;
            ids.extend(i);
            strays.extend(s);
        }
        Ok((ids, strays))
    }

    fn walk_fan(&self, fan: u8, ids: &mut Vec<ObjectId>, strays: &mut Vec<PathBuf>) -> Result<()> {
        let dir = self.root.join(OBJECTS).join(format!("{fan:02x}"));
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error(&format!("list {}", dir.display()), e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| io_error(&format!("list {}", dir.display()), e))?;
            match id_in_fan(&entry.file_name(), fan) {
                Some(id) => ids.push(id),
                None => strays.push(entry.path()),
            }
        }
        Ok(())
    }

    /// Waits for the walk at open; `Err` if it failed.
    fn walked(&self) -> Result<std::sync::MutexGuard<'_, Found>> {
        let (found, done) = &self.found;
        let mut found = found.lock().unwrap_or_else(|e| e.into_inner());
        while found.walked.is_none() {
            found = done.wait(found).unwrap_or_else(|e| e.into_inner());
        }
        match &found.walked {
            Some(Err(err)) => Err(err.clone()),
            _ => Ok(found),
        }
    }

    /// Notes an image placed or removed, for a `list` that has not run yet.
    fn changed(&self, id: ObjectId, placed: bool) {
        let mut found = self.found.0.lock().unwrap_or_else(|e| e.into_inner());
        if found.walked.is_none() || found.ids.is_some() {
            found.since.push((id, placed));
        }
    }

    /// The ids of every image: the walk at open's (plus what changed since)
    /// the first time, a new walk after.
    fn list(&self) -> Result<Vec<ObjectId>> {
        let kept = {
            let mut found = self.walked()?;
            found
                .ids
                .take()
                .map(|ids| (ids, std::mem::take(&mut found.since)))
        };
        let Some((ids, since)) = kept else {
            return Ok(self.walk()?.0);
        };
        if since.is_empty() {
            return Ok(ids);
        }
        let mut set: std::collections::HashSet<ObjectId> = ids.into_iter().collect();
        for (id, placed) in since {
            if placed {
                set.insert(id);
            } else {
                set.remove(&id);
            }
        }
        Ok(set.into_iter().collect())
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
        let staged = self.stage(id, sizes, src)?;
        self.publish(vec![staged])
            .pop()
            .expect("one outcome per staged image")
    }

    /// First half of a put: takes the capacity and writes the image under
    /// `tmp/`, checksumming as it goes, and starts its write-back. Nothing
    /// is durable or visible yet; [`publish`](Self::publish) finishes it. On
    /// error nothing is left (no temp file, no capacity taken).
    fn stage(&self, id: ObjectId, sizes: ObjectSizes, src: SourceRange) -> Result<Staged> {
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
        if let Err(e) = getrandom::fill(&mut nonce) {
            self.unreserve(stored);
            return Err(ShoalError::io("random temp name", e));
        }
        let tmp = self.root.join(TMP).join(format!(
            "{}.{:016x}",
            id.to_hex(),
            u64::from_le_bytes(nonce)
        ));
        let written = write_image(id, sizes, &src, &tmp);
        drop(src); // the caller may reuse its memory from here on
        match written {
            Ok((file, header)) => Ok(Staged {
                id,
                tmp,
                file,
                header,
                stored,
            }),
            Err(err) => {
                let _ = fs::remove_file(&tmp);
                self.unreserve(stored);
                Err(err)
            }
        }
    }

    /// Second half of a put, for a whole batch at once: fsync every image,
    /// then rename each to its final name, then fsync each directory touched
    /// once. Each image is still durable before its name is (the crash rule
    /// of a single put), but a batch pays one wave of syncs instead of two
    /// journal commits per image. Outcomes in the order given.
    fn publish(&self, staged: Vec<Staged>) -> Vec<Result<ObjectHeader>> {
        // The data of every image, on the device. Their write-back started
        // when they were staged, so these mostly wait for I/O in flight.
        let synced: Vec<Result<Staged>> = staged
            .into_iter()
            .map(|image| match image.file.sync_all() {
                Ok(()) => Ok(image),
                Err(e) => Err(self.discard(
                    &image,
                    io_error(&format!("fsync {}", image.tmp.display()), e),
                )),
            })
            .collect();
        // Names: a rename replaces an older image of the same id atomically.
        let mut dirs: Vec<PathBuf> = Vec::new();
        let renamed: Vec<Result<(ObjectHeader, PathBuf)>> = synced
            .into_iter()
            .map(|image| {
                let image = image?;
                let path = self.path_of(&image.id);
                let replaced = fs::metadata(&path).ok().map(|m| m.len());
                if let Err(e) = fs::rename(&image.tmp, &path) {
                    return Err(self.discard(
                        &image,
                        io_error(&format!("rename to {}", path.display()), e),
                    ));
                }
                // From here the image is in place: account for it whatever
                // the directory sync below says.
                self.changed(image.id, true);
                match replaced {
                    Some(old) => self.unreserve(old),
                    None => {
                        self.objects.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let dir = path
                    .parent()
                    .expect("object paths have a parent")
                    .to_path_buf();
                if !dirs.contains(&dir) {
                    dirs.push(dir.clone());
                }
                Ok((image.header, dir))
            })
            .collect();
        // The renames, durable: one fsync per directory (the first commits
        // the file system's journal for all of them; the rest find it done).
        let outcomes = in_parallel(&dirs, |dir| File::open(dir).and_then(|d| d.sync_all()));
        let failed: Vec<(PathBuf, ShoalError)> = dirs
            .into_iter()
            .zip(outcomes)
            .filter_map(|(dir, synced)| {
                synced.err().map(|e| {
                    let err = io_error(&format!("fsync directory {}", dir.display()), e);
                    (dir, err)
                })
            })
            .collect();
        renamed
            .into_iter()
            .map(|outcome| {
                let (header, dir) = outcome?;
                match failed.iter().find(|(d, _)| *d == dir) {
                    // In place but maybe not durable: the caller must not
                    // count on it (recovery adopts it, or a retry replaces it).
                    Some((_, err)) => Err(err.clone()),
                    None => Ok(header),
                }
            })
            .collect()
    }

    /// Drops a staged image that will not be published; returns `err`.
    fn discard(&self, image: &Staged, err: ShoalError) -> ShoalError {
        let _ = fs::remove_file(&image.tmp);
        self.unreserve(image.stored);
        err
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
        // Gone from the directory: accounted for whatever the sync says.
        self.changed(id, false);
        self.unreserve(len);
        self.objects.fetch_sub(1, Ordering::Relaxed);
        sync_dir(path.parent().expect("object paths have a parent"))?;
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
        let strays = match self.walked()?.strays.take() {
            Some(strays) => strays,
            None => self.walk()?.1,
        };
        for path in strays {
            remove_any(&path)?;
            removed += 1;
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

    /// Images are staged a few at a time (checksum and copy into the page
    /// cache are CPU work), then published together: one fsync wave, one
    /// fsync per directory touched.
    async fn put_batch(&self, items: Vec<PutItem>) -> Vec<Result<ObjectHeader>> {
        let staged: Vec<Result<Staged>> = futures_util::stream::iter(items)
            .map(|item| self.blocking(move |inner| inner.stage(item.id, item.sizes, item.src)))
            .buffered(STAGE_PARALLEL)
            .collect()
            .await;
        let (mut out, ready): (Vec<Option<Result<ObjectHeader>>>, Vec<Staged>) = {
            let mut out = Vec::with_capacity(staged.len());
            let mut ready = Vec::new();
            for image in staged {
                match image {
                    Ok(image) => {
                        out.push(None);
                        ready.push(image);
                    }
                    Err(err) => out.push(Some(Err(err))),
                }
            }
            (out, ready)
        };
        let published = match self.blocking(move |inner| Ok(inner.publish(ready))).await {
            Ok(published) => published,
            // The publishing task died (a panic): report it for each image.
            Err(err) => vec![Err(err); out.iter().filter(|o| o.is_none()).count()],
        };
        let mut published = published.into_iter();
        out.iter_mut()
            .map(|slot| match slot.take() {
                Some(done) => done,
                None => published.next().expect("one outcome per staged image"),
            })
            .collect()
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
        self.blocking(|inner| inner.list()).await
    }

    async fn sweep(&self) -> Result<u64> {
        self.blocking(|inner| inner.sweep()).await
    }
}

/// Runs `f` on every item, from up to `SYNC_THREADS` threads at once, and
/// returns the outcomes in order. For fsyncs: the file system's journal
/// commits one transaction (and flushes the device cache once) for all the
/// fsyncs waiting on it, where one at a time would commit and flush each.
fn in_parallel<T: Sync>(
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

/// Writes the image of `id` to `tmp` (a new file) in one pass over the
/// source: checksum a chunk while it is in cache, write it, and put the
/// header (which holds the checksum) in front at the end. Then starts the
/// write-back of the whole file without waiting for it, so a batch's fsyncs
/// find their data already on its way.
fn write_image(
    id: ObjectId,
    sizes: ObjectSizes,
    src: &SourceRange,
    tmp: &Path,
) -> Result<(File, ObjectHeader)> {
    use std::os::fd::AsRawFd;

    let context = || format!("write {}", tmp.display());
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| io_error(&context(), e))?;
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
    // Neither nix nor rustix wraps sync_file_range. It only starts the
    // write-back (a hint): the fsync in `publish` is what makes it durable,
    // so a failure here changes nothing and is ignored.
    // SAFETY: a plain system call on a file descriptor we own.
    let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    Ok((file, header))
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

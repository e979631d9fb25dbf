//! `DirTier` itself: the tier's state, file images, the walk at open, and
//! the `Tier` implementation (mod.rs has the layout).

use std::collections::{BTreeMap, HashMap};
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
use tracing::{info, warn};

use crate::format::{check_destination, checksum_mismatch, ObjectHeader, ObjectSizes, HEADER_LEN};
use crate::identity::TierIdentity;
use crate::range::{DestRange, SourceRange};
use crate::tier::{PutItem, Tier, TierUsage};

use super::direct::{
    read_payload_direct, read_range_direct, reopen_direct, reopen_direct_for_write,
    write_image_direct, RANGE_DIRECT_MAX,
};
use super::io::{copy_checksummed, in_parallel, io_error, sync_dir, CHUNK, READ_SLICE};
use super::segments::{
    check_header, copy_segment, read_header, read_payload, write_segment, Segment, Segments, Slot,
    StagedSegment, State, PACK_MAX, SEGMENTS,
};

const MARKER: &str = "shoal-tier.id";
const OBJECTS: &str = "objects";
const TMP: &str = "tmp";
/// Payloads at least this large are restored with direct I/O and a reader
/// thread (below: one direct read of the whole image is cheaper).
const DIRECT_MIN: u64 = CHUNK as u64;
/// Images (packed or not) at least this large are restored with direct
/// I/O where the file system has it (below: buffered reads, whose readahead
/// also brings the next small images of a segment in).
const PACKED_DIRECT_MIN: u64 = 256 << 10;
/// Images of a batch staged at once (each on a blocking thread).
const STAGE_PARALLEL: usize = 4;

/// A directory tier. Cheap to clone (shared state).
#[derive(Clone)]
pub struct DirTier {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    root: PathBuf,
    capacity: u64,
    pub(super) used: AtomicU64,
    pub(super) objects: AtomicU64,
    /// True once the sizes of the images found at open are in `used`. The
    /// count runs in the background (a stat per file: seconds for a million
    /// objects, which must not delay a restart); writes and deletes wait for
    /// it so their own accounting never mixes with a half-done count.
    counted: (Mutex<bool>, Condvar),
    /// What the walk at open found, kept for recovery's first `sweep` and
    /// `list` (a restart would otherwise list a million files three times).
    found: (Mutex<Found>, Condvar),
    /// The packed images (loaded by the walk at open).
    pub(super) segments: Segments,
}

/// The walk at open, in the background, and what it found.
#[derive(Default)]
struct Found {
    /// `None` while the walk runs; its error, if it failed.
    walked: Option<Result<()>>,
    /// Ids of the images found, until the first `list` takes them.
    ids: Option<Vec<ObjectId>>,
    /// Names under `objects/` that are not ids, and segment files to remove,
    /// until the first `sweep`.
    strays: Option<Vec<PathBuf>>,
    /// Packed copies that newer ones supersede, to mark dead at the sweep.
    superseded: Vec<(u64, ObjectId)>,
    /// Images placed (`true`) or removed since the walk began, in order,
    /// while `ids` is kept: the first `list` applies them.
    since: Vec<(ObjectId, bool)>,
}

/// Threads that walk the fan-out directories at open.
const WALKERS: usize = 4;

/// A segment staged: outcomes of the items it refused, and the segment.
type SegmentStage = (Vec<Option<ShoalError>>, Option<StagedSegment>);

/// A file or directory to fsync in a publish wave.
enum Syncable<'a> {
    File(&'a File),
    Dir(&'a Path),
}

impl Syncable<'_> {
    fn sync(&self) -> io::Result<()> {
        match self {
            Self::File(file) => file.sync_all(),
            Self::Dir(dir) => File::open(dir).and_then(|d| d.sync_all()),
        }
    }
}

/// What the walk at open found.
struct AtOpen {
    /// Ids of the file images.
    files: Vec<ObjectId>,
    /// Ids of the live packed images.
    packed_ids: Vec<ObjectId>,
    /// Bytes of the segment files, and the packed images.
    packed: (u64, u64),
    strays: Vec<PathBuf>,
    superseded: Vec<(u64, ObjectId)>,
}

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
        for dir in [root.join(TMP), root.join(OBJECTS), root.join(SEGMENTS)] {
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
                segments: Segments::new(root),
            }),
        };
        // The walk (and then the count of sizes) runs in the background,
        // while recovery reads the manifest.
        let inner = tier.inner.clone();
        let walk = move || {
            let walked = inner.walk_at_open();
            let (ids, packed) = match walked {
                Ok(AtOpen {
                    files,
                    packed_ids,
                    packed,
                    strays,
                    superseded,
                }) => {
                    let mut found = inner.found.0.lock().unwrap_or_else(|e| e.into_inner());
                    let mut all = files.clone();
                    all.extend(packed_ids);
                    found.ids = Some(all);
                    found.strays = Some(strays);
                    found.superseded = superseded;
                    found.walked = Some(Ok(()));
                    (files, packed)
                }
                Err(err) => {
                    inner
                        .found
                        .0
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .walked = Some(Err(err));
                    (Vec::new(), (0, 0))
                }
            };
            inner.found.1.notify_all();
            // The count is a stat per image: let a starting daemon's own
            // work go first (this thread's priority only; it ends here).
            // SAFETY: plain system calls on this thread's own id.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
            }
            let (mut used, mut objects) = packed;
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

    /// Where the image of `id` lives: the file, the offset of the image in
    /// it, and its length (for tests that damage images on purpose).
    pub fn image_location(&self, id: &ObjectId) -> Option<(PathBuf, u64, u64)> {
        if self.inner.walked().is_err() {
            return None;
        }
        if let Some((_, slot, path)) = self.inner.segments.find(id) {
            return Some((path, slot.offset, slot.stored));
        }
        let path = self.inner.path_of(id);
        let len = fs::metadata(&path).ok()?.len();
        Some((path, 0, len))
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
    pub(super) fn path_of(&self, id: &ObjectId) -> PathBuf {
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

    /// The walk at open: the file images, then the segments (a file image
    /// wins over packed copies of the same id).
    fn walk_at_open(&self) -> Result<AtOpen> {
        let (files, mut strays) = self.walk()?;
        let loaded = self.segments.load()?;
        strays.extend(loaded.strays);
        let mut superseded = loaded.superseded;
        for id in &files {
            if let Some(slot) = self.segments.supersede(id) {
                superseded.push((slot.seq, *id));
            }
        }
        let packed_ids = self.segments.ids();
        let packed = (loaded.bytes, packed_ids.len() as u64);
        Ok(AtOpen {
            files,
            packed_ids,
            packed,
            strays,
            superseded,
        })
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
    pub(super) fn changed(&self, id: ObjectId, placed: bool) {
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
            let mut ids = self.walk()?.0;
            ids.extend(self.segments.ids());
            return Ok(ids);
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
    pub(super) fn wait_counted(&self) {
        let (done, changed) = &self.counted;
        let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            done = changed.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Takes `bytes` of the capacity, or fails with `StoreFull`.
    pub(super) fn reserve(&self, bytes: u64) -> Result<()> {
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

    pub(super) fn unreserve(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
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

    /// Second half of a put, for a whole batch at once: one wave of fsyncs
    /// (from several threads, so the file system commits its journal once
    /// for all) makes every file image and every segment durable, and the
    /// segments' directory entries with them; then the file images are
    /// renamed to their final names and each directory touched fsync'ed
    /// once. Each file image is still durable before its name is (the crash
    /// rule of a single put). Outcomes in the order given.
    fn publish(
        &self,
        files: Vec<Staged>,
        segments: Vec<StagedSegment>,
    ) -> (Vec<Result<ObjectHeader>>, Vec<Vec<Result<ObjectHeader>>>) {
        // Their write-back started when they were staged, so these mostly
        // wait for I/O in flight.
        let segments_dir = self.segments.dir().to_path_buf();
        let mut targets: Vec<Syncable<'_>> =
            files.iter().map(|f| Syncable::File(&f.file)).collect();
        targets.extend(segments.iter().map(|s| Syncable::File(s.file())));
        if !segments.is_empty() {
            targets.push(Syncable::Dir(&segments_dir));
        }
        let mut outcomes = in_parallel(&targets, Syncable::sync).into_iter();
        drop(targets);
        let synced: Vec<Result<Staged>> = files
            .into_iter()
            .zip(outcomes.by_ref())
            .map(|(image, synced)| match synced {
                Ok(()) => Ok(image),
                Err(e) => Err(self.discard(
                    &image,
                    io_error(&format!("fsync {}", image.tmp.display()), e),
                )),
            })
            .collect();
        let segment_syncs: Vec<io::Result<()>> = outcomes.by_ref().take(segments.len()).collect();
        let dir_synced = match outcomes.next() {
            Some(Err(e)) => Err(io_error(
                &format!("fsync directory {}", segments_dir.display()),
                e,
            )),
            _ => Ok(()),
        };
        let installed = segments
            .into_iter()
            .zip(segment_syncs)
            .map(|(segment, synced)| {
                let synced = synced
                    .map_err(|e| io_error("fsync a segment", e))
                    .and(dir_synced.clone());
                self.install_segment(segment, synced)
            })
            .collect();
        (self.name(synced), installed)
    }

    /// Renames synced file images to their final names and fsyncs each
    /// directory touched once.
    fn name(&self, synced: Vec<Result<Staged>>) -> Vec<Result<ObjectHeader>> {
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
                    None => self.drop_packed_copy(&header.id).map(|()| header),
                }
            })
            .collect()
    }

    /// A file image of `id` is in place: a packed copy of it (written by a
    /// build with another threshold) is replaced, i.e. marked dead.
    fn drop_packed_copy(&self, id: &ObjectId) -> Result<()> {
        if self.delete_packed(id)?.is_some() {
            // `delete_packed` counted the object gone; the file image is it.
            self.changed(*id, true);
            self.objects.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
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
        drop(self.walked()?);
        if let Some(header) = self.get_packed(&id, dst.as_mut_slice())? {
            return Ok(header);
        }
        let (mut file, header, what) = self.open_image(&id)?;
        check_destination(&id, dst.len() as u64, header.payload_len())?;
        let len = header.payload_len();
        // Large images: direct reads of 4 MiB blocks with a reader thread;
        // medium ones: one direct read; small ones (or no O_DIRECT here):
        // buffered reads.
        let direct = (len >= PACKED_DIRECT_MIN)
            .then(|| reopen_direct(&file))
            .flatten();
        let crc = match direct {
            Some(direct) if len >= DIRECT_MIN => {
                read_payload_direct(&direct, dst.as_mut_slice())
                    .map_err(|e| io_error(&format!("read {what}"), e))?
            }
            Some(direct) => read_range_direct(&direct, HEADER_LEN as u64, len as usize, |src| {
                copy_checksummed(dst.as_mut_slice(), src, 0)
            })
            .map_err(|e| io_error(&format!("read {what}"), e))?,
            None => {
                let mut crc = 0u32;
                for chunk in dst.as_mut_slice().chunks_mut(READ_SLICE) {
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
        drop(self.walked()?);
        if let Some(header) = self.verify_packed(&id)? {
            return Ok(header);
        }
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
        let packed = self.delete_packed(&id)?.is_some();
        let path = self.path_of(&id);
        let len = match fs::metadata(&path) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(packed),
            Err(e) => return Err(io_error(&format!("stat {}", path.display()), e)),
        };
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(packed),
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
        // Names under objects/ that are not ids are nobody's objects;
        // unfinished or emptied segments are nobody's either.
        let (strays, superseded) = {
            let mut found = self.walked()?;
            let superseded = std::mem::take(&mut found.superseded);
            (found.strays.take(), superseded)
        };
        let strays = match strays {
            Some(strays) => strays,
            None => self.walk()?.1,
        };
        // A `.dead` file goes only once the removal of its segment is
        // durable: a dead record must never outlive the segment it kills.
        let (deads, others): (Vec<PathBuf>, Vec<PathBuf>) = strays
            .into_iter()
            .partition(|p| p.extension().is_some_and(|e| e == "dead"));
        for path in others {
            remove_any(&path)?;
            removed += 1;
        }
        if !deads.is_empty() {
            sync_dir(self.segments.dir())?;
        }
        for path in deads {
            remove_any(&path)?;
            removed += 1;
        }
        removed += self.bury_superseded(superseded)?;
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
        self.put_batch(vec![PutItem { id, sizes, src }])
            .await
            .pop()
            .expect("one outcome per item")
    }

    /// Small images are packed into segments, large ones staged as files,
    /// a few at a time (checksum and copy are CPU work);
    /// then all are published together: one fsync wave, one fsync per
    /// directory touched.
    async fn put_batch(&self, items: Vec<PutItem>) -> Vec<Result<ObjectHeader>> {
        let n = items.len();
        let (packed, files): (Vec<_>, Vec<_>) = items
            .into_iter()
            .enumerate()
            .partition(|(_, item)| item.sizes.payload_len() <= PACK_MAX);
        let mut out: Vec<Option<Result<ObjectHeader>>> = (0..n).map(|_| None).collect();
        let file_slots: Vec<usize> = files.iter().map(|(i, _)| *i).collect();
        let staged_files: Vec<Result<Staged>> = futures_util::stream::iter(files)
            .map(|(_, item)| self.blocking(move |inner| inner.stage(item.id, item.sizes, item.src)))
            .buffered(STAGE_PARALLEL)
            .collect()
            .await;
        let staged_segments: Vec<(Vec<usize>, Result<SegmentStage>)> =
            futures_util::stream::iter(super::segments::plan(packed))
                .map(|group| {
                    let (slots, items): (Vec<usize>, Vec<PutItem>) = group.into_iter().unzip();
                    let staged = self.blocking(move |inner| Ok(inner.stage_segment(items)));
                    async move { (slots, staged.await) }
                })
                .buffered(STAGE_PARALLEL)
                .collect()
                .await;
        // What goes on to be published, and where its outcomes go.
        let mut ready_files = Vec::new();
        let mut ready_file_slots = Vec::new();
        for (slot, staged) in file_slots.into_iter().zip(staged_files) {
            match staged {
                Ok(image) => {
                    ready_files.push(image);
                    ready_file_slots.push(slot);
                }
                Err(err) => out[slot] = Some(Err(err)),
            }
        }
        let mut ready_segments = Vec::new();
        let mut ready_segment_slots = Vec::new();
        for (slots, staged) in staged_segments {
            match staged {
                Ok((refused, segment)) => {
                    let mut kept = Vec::new();
                    for (slot, refused) in slots.into_iter().zip(refused) {
                        match refused {
                            Some(err) => out[slot] = Some(Err(err)),
                            None => kept.push(slot),
                        }
                    }
                    if let Some(segment) = segment {
                        ready_segments.push(segment);
                        ready_segment_slots.push(kept);
                    }
                }
                Err(err) => {
                    for slot in slots {
                        out[slot] = Some(Err(err.clone()));
                    }
                }
            }
        }
        let published = self
            .blocking(move |inner| Ok(inner.publish(ready_files, ready_segments)))
            .await;
        match published {
            Ok((files, segments)) => {
                for (slot, outcome) in ready_file_slots.into_iter().zip(files) {
                    out[slot] = Some(outcome);
                }
                for (slots, outcomes) in ready_segment_slots.into_iter().zip(segments) {
                    for (slot, outcome) in slots.into_iter().zip(outcomes) {
                        out[slot] = Some(outcome);
                    }
                }
            }
            // The publishing task died (a panic): report it for each image.
            Err(err) => {
                for slot in out.iter_mut().filter(|o| o.is_none()) {
                    *slot = Some(Err(err.clone()));
                }
            }
        }
        out.into_iter()
            .map(|o| o.expect("one outcome per item"))
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

/// Writes the image of `id` to `tmp` (a new file) in one pass over the
/// source: checksum a chunk while it is in cache, write it, and put the
/// header (which holds the checksum) in front at the end. Direct writes
/// (`direct.rs`) where the file system takes them; through the page cache
/// otherwise, and then starts the write-back of the whole file without
/// waiting for it, so a batch's fsyncs find their data already on its way.
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
    let header = |checksum| ObjectHeader {
        id,
        data_size: sizes.data_size,
        meta_size: sizes.meta_size,
        checksum,
    };
    if let Some(direct) = reopen_direct_for_write(&file) {
        let end = HEADER_LEN as u64 + src.len() as u64;
        match write_image_direct(&direct, src.as_slice(), |crc| header(crc).encode())
            .and_then(|crc| direct.set_len(end).map(|()| crc))
        {
            Ok(crc) => return Ok((file, header(crc))),
            // Direct writes refused here: start again through the cache.
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                file.set_len(0).map_err(|e| io_error(&context(), e))?
            }
            Err(e) => return Err(io_error(&context(), e)),
        }
    }
    let mut crc = 0u32;
    let mut offset = HEADER_LEN as u64;
    for chunk in src.as_slice().chunks(CHUNK) {
        crc = crc32c::crc32c_append(crc, chunk);
        file.write_all_at(chunk, offset)
            .map_err(|e| io_error(&context(), e))?;
        offset += chunk.len() as u64;
    }
    let header = header(crc);
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

/// The id named by a file in fan-out directory `fan`, if the name is one.
fn id_in_fan(name: &std::ffi::OsStr, fan: u8) -> Option<ObjectId> {
    name.to_str()
        .and_then(ObjectId::from_hex)
        .filter(|id| id.as_bytes()[0] == fan)
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

// -- packed images (segments.rs has their layout and state) ----------------

impl Inner {
    /// Writes a segment of `items` under its final name, checksumming as it
    /// goes, and starts its write-back; nothing of it counts until it is
    /// published. Items whose capacity is refused or whose source is the
    /// wrong length fail alone; an I/O error fails them all. Outcomes per
    /// item: `None` for the ones in the segment.
    pub(super) fn stage_segment(
        &self,
        items: Vec<PutItem>,
    ) -> (Vec<Option<ShoalError>>, Option<StagedSegment>) {
        let mut outcomes: Vec<Option<ShoalError>> = Vec::with_capacity(items.len());
        let mut kept = Vec::with_capacity(items.len());
        let mut reserved = 0u64;
        for item in items {
            let stored = item.sizes.stored_len();
            let refused = if item.src.len() as u64 != item.sizes.payload_len() {
                Some(ShoalError::invalid(format!(
                    "object {}: source range of {} bytes for {} + {} bytes",
                    item.id,
                    item.src.len(),
                    item.sizes.data_size,
                    item.sizes.meta_size
                )))
            } else {
                self.reserve(stored).err()
            };
            if refused.is_none() {
                reserved += stored;
                kept.push(item);
            }
            outcomes.push(refused);
        }
        if kept.is_empty() {
            return (outcomes, None);
        }
        let fail_all = |outcomes: &mut Vec<Option<ShoalError>>, err: ShoalError| {
            for slot in outcomes.iter_mut().filter(|o| o.is_none()) {
                *slot = Some(err.clone());
            }
        };
        let seq = self.segments.take_seq();
        let path = self.segments.path(seq, "seg");
        match write_segment(&path, &kept) {
            Ok((file, images)) => {
                drop(kept); // the caller may reuse the sources' memory from here on
                let staged = StagedSegment {
                    seq,
                    file,
                    len: reserved,
                    images: images
                        .into_iter()
                        .map(|(header, slot)| (header, Slot { seq, ..slot }))
                        .collect(),
                };
                debug_assert_eq!(
                    staged.len,
                    staged.images.iter().map(|(_, s)| s.stored).sum::<u64>()
                );
                (outcomes, Some(staged))
            }
            Err(err) => {
                let _ = fs::remove_file(&path);
                self.unreserve(reserved);
                fail_all(&mut outcomes, err);
                (outcomes, None)
            }
        }
    }

    /// Makes a staged segment count, after its file and the segments
    /// directory were synced (`synced` says how that went): its images go
    /// into the index, and copies they replace are marked dead. Outcomes in
    /// the segment's order.
    pub(super) fn install_segment(
        &self,
        staged: StagedSegment,
        synced: Result<()>,
    ) -> Vec<Result<ObjectHeader>> {
        let n = staged.images.len();
        if let Err(err) = synced {
            let _ = fs::remove_file(self.segments.path(staged.seq, "seg"));
            self.unreserve(staged.len);
            return vec![Err(err); n];
        }
        let mut replaced: BTreeMap<u64, Vec<(ObjectId, Slot)>> = BTreeMap::new();
        let mut files = Vec::new();
        {
            let mut state = self.segments.lock();
            // Replacing an image of a segment being compacted waits for it.
            while staged.images.iter().any(|(h, _)| {
                state
                    .index
                    .get(&h.id)
                    .and_then(|old| state.segments.get(&old.seq))
                    .is_some_and(|seg| seg.compacting)
            }) {
                state = self
                    .segments
                    .settled
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner());
            }
            state.segments.insert(
                staged.seq,
                Segment {
                    file: Arc::new(staged.file),
                    len: staged.len,
                    members: staged.images.iter().map(|(h, _)| h.id).collect(),
                    images: n as u64,
                    live: staged.images.iter().map(|(_, s)| s.stored).sum(),
                    busy: 0,
                    compacting: false,
                    dead: None,
                },
            );
            for (header, slot) in &staged.images {
                match state.index.insert(header.id, *slot) {
                    Some(old) => {
                        if let Some(seg) = state.segments.get_mut(&old.seq) {
                            if !replaced.contains_key(&old.seq) {
                                seg.busy += 1;
                            }
                            replaced.entry(old.seq).or_default().push((header.id, old));
                        }
                    }
                    None => {
                        self.objects.fetch_add(1, Ordering::Relaxed);
                        files.push(header.id);
                    }
                }
                self.changed(header.id, true);
            }
        }
        let mut failed: HashMap<ObjectId, ShoalError> = HashMap::new();
        for (seq, ids) in replaced {
            if let Err(err) = self.retire(seq, &ids, false) {
                for (id, _) in ids {
                    failed.insert(id, err.clone());
                }
            }
        }
        // A file image of the same id (written before packing, or by a
        // build with another threshold) is replaced too.
        for id in files {
            let path = self.path_of(&id);
            if let Ok(meta) = fs::metadata(&path) {
                let removed = fs::remove_file(&path)
                    .map_err(|e| io_error(&format!("remove {}", path.display()), e))
                    .and_then(|()| sync_dir(path.parent().expect("a parent")));
                match removed {
                    Ok(()) => {
                        self.unreserve(meta.len());
                        self.objects.fetch_sub(1, Ordering::Relaxed);
                    }
                    Err(err) => {
                        failed.insert(id, err);
                    }
                }
            }
        }
        staged
            .images
            .into_iter()
            .map(|(header, _)| match failed.remove(&header.id) {
                Some(err) => Err(err),
                None => Ok(header),
            })
            .collect()
    }

    /// Marks copies in segment `seq` dead durably (they are out of the index
    /// already, and the caller counted the segment `busy` once), then
    /// accounts for them: an emptied segment is removed, a thinned one
    /// compacted. If the mark fails and `reinstate`, the copies go back into
    /// the index (they are still live on disk).
    fn retire(&self, seq: u64, ids: &[(ObjectId, Slot)], reinstate: bool) -> Result<()> {
        let file = {
            let mut state = self.segments.lock();
            self.segments.dead_file(&mut state, seq)
        };
        let names: Vec<ObjectId> = ids.iter().map(|(id, _)| *id).collect();
        let written = file.and_then(|file| self.segments.write_dead(seq, &file, &names));
        let mut state = self.segments.lock();
        let seg = state
            .segments
            .get_mut(&seq)
            .expect("a busy segment is kept");
        seg.busy -= 1;
        if let Err(err) = written {
            if reinstate {
                for (id, slot) in ids {
                    state.index.insert(*id, *slot);
                }
            }
            return Err(err);
        }
        seg.images -= ids.len() as u64;
        seg.live -= ids.iter().map(|(_, slot)| slot.stored).sum::<u64>();
        let next = self.after_change(&mut state, seq);
        drop(state);
        self.tidy(next);
        Ok(())
    }

    /// What a segment needs after its live images changed, with the state
    /// locked: nothing, removal (no live image), or compaction (live bytes
    /// under half its length, and nothing else in flight on it).
    fn after_change(&self, state: &mut State, seq: u64) -> Tidy {
        let Some(seg) = state.segments.get_mut(&seq) else {
            return Tidy::Nothing;
        };
        if seg.busy > 0 || seg.compacting {
            return Tidy::Nothing;
        }
        if seg.images == 0 {
            let seg = state.segments.remove(&seq).expect("just found");
            return Tidy::Remove(seq, seg.len);
        }
        if seg.live * 2 < seg.len {
            seg.compacting = true;
            let live: Vec<(ObjectId, Slot)> = seg
                .members
                .iter()
                .filter_map(|id| {
                    state
                        .index
                        .get(id)
                        .filter(|slot| slot.seq == seq)
                        .map(|slot| (*id, *slot))
                })
                .collect();
            let file = state.segments[&seq].file.clone();
            return Tidy::Compact(seq, file, live);
        }
        Tidy::Nothing
    }

    fn tidy(&self, tidy: Tidy) {
        match tidy {
            Tidy::Nothing => {}
            Tidy::Remove(seq, len) => {
                if let Err(err) = self.remove_segment(seq) {
                    warn!("segment {seq:016x}: not removed: {err}");
                }
                self.unreserve(len);
            }
            Tidy::Compact(seq, file, live) => {
                if let Err(err) = self.compact(seq, &file, live) {
                    warn!("segment {seq:016x}: not compacted: {err}");
                    let mut state = self.segments.lock();
                    if let Some(seg) = state.segments.get_mut(&seq) {
                        seg.compacting = false;
                    }
                    drop(state);
                    self.segments.settled.notify_all();
                }
            }
        }
    }

    /// Removes a segment's files: `.seg` first, made durable, then `.dead`.
    fn remove_segment(&self, seq: u64) -> Result<()> {
        let seg = self.segments.path(seq, "seg");
        match fs::remove_file(&seg) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(io_error(&format!("remove {}", seg.display()), e))
            }
            _ => {}
        }
        sync_dir(self.segments.dir())?;
        let dead = self.segments.path(seq, "dead");
        match fs::remove_file(&dead) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(io_error(&format!("remove {}", dead.display()), e))
            }
            _ => Ok(()),
        }
    }

    /// Copies the live images of segment `seq` into a new segment, points
    /// the index at it and removes the old one. Deletes and replaces of
    /// those images wait meanwhile (`compacting`).
    fn compact(&self, seq: u64, old: &File, live: Vec<(ObjectId, Slot)>) -> Result<()> {
        // Not refused when the tier is full: a compaction is what gives room
        // back. It overshoots by less than half the old segment, briefly.
        let bytes: u64 = live.iter().map(|(_, s)| s.stored).sum();
        self.wait_counted();
        self.used.fetch_add(bytes, Ordering::AcqRel);
        let new = self.segments.take_seq();
        let path = self.segments.path(new, "seg");
        let written = copy_segment(old, &path, &live).and_then(|file| {
            let outcomes = in_parallel(&[0, 1], |which| match which {
                0 => file.sync_all(),
                _ => File::open(self.segments.dir()).and_then(|d| d.sync_all()),
            });
            outcomes
                .into_iter()
                .collect::<io::Result<Vec<()>>>()
                .map_err(|e| io_error(&format!("fsync {}", path.display()), e))
                .map(|_| file)
        });
        let file = match written {
            Ok(file) => file,
            Err(err) => {
                let _ = fs::remove_file(&path);
                self.unreserve(bytes);
                return Err(err);
            }
        };
        let old_len = {
            let mut state = self.segments.lock();
            let mut offset = 0;
            let mut members = Vec::with_capacity(live.len());
            let mut live_bytes = 0;
            for (id, slot) in &live {
                let moved = Slot {
                    seq: new,
                    offset,
                    stored: slot.stored,
                };
                let previous = state.index.insert(*id, moved);
                debug_assert_eq!(previous, Some(*slot), "compacted images do not change");
                offset += slot.stored;
                live_bytes += slot.stored;
                members.push(*id);
            }
            state.segments.insert(
                new,
                Segment {
                    file: Arc::new(file),
                    len: bytes,
                    members,
                    images: live.len() as u64,
                    live: live_bytes,
                    busy: 0,
                    compacting: false,
                    dead: None,
                },
            );
            state.segments.remove(&seq).map_or(0, |s| s.len)
        };
        self.segments.settled.notify_all();
        self.unreserve(old_len);
        info!(
            "segment {seq:016x}: {} live images ({} bytes) compacted into {new:016x}, {} bytes back",
            live.len(),
            bytes,
            old_len.saturating_sub(bytes)
        );
        self.remove_segment(seq)
    }

    /// Reads `id`'s packed image into `dst` (payload only), checking header
    /// and checksum. `Ok(None)`: not packed here.
    pub(super) fn get_packed(&self, id: &ObjectId, dst: &mut [u8]) -> Result<Option<ObjectHeader>> {
        let Some((file, slot, path)) = self.segments.find(id) else {
            return Ok(None);
        };
        let what = format!("{} at {}", path.display(), slot.offset);
        // A slot larger than any packed image (a damaged index) takes the
        // buffered path, whose header check reports it.
        if (PACKED_DIRECT_MIN..=RANGE_DIRECT_MAX as u64).contains(&slot.stored) {
            if let Some(direct) = reopen_direct(&file) {
                return get_packed_direct(&direct, slot, id, dst, &what).map(Some);
            }
        }
        let header = read_header(&file, slot, id, &what)?;
        check_destination(id, dst.len() as u64, header.payload_len())?;
        let mut crc = 0u32;
        let mut at = slot.offset + HEADER_LEN as u64;
        for chunk in dst.chunks_mut(READ_SLICE) {
            read_payload(&file, chunk, at, &what)?;
            crc = crc32c::crc32c_append(crc, chunk);
            at += chunk.len() as u64;
        }
        if crc != header.checksum {
            return Err(checksum_mismatch(&what, header.checksum, crc));
        }
        Ok(Some(header))
    }

    /// `get_packed` without keeping the payload.
    pub(super) fn verify_packed(&self, id: &ObjectId) -> Result<Option<ObjectHeader>> {
        let Some((_, slot, _)) = self.segments.find(id) else {
            return Ok(None);
        };
        let mut buf = vec![0u8; (slot.stored as usize).saturating_sub(HEADER_LEN)];
        self.get_packed(id, &mut buf)
    }

    /// Deletes `id`'s packed image durably. `Ok(None)`: not packed here;
    /// else the bytes of the image.
    pub(super) fn delete_packed(&self, id: &ObjectId) -> Result<Option<u64>> {
        let slot = {
            let mut state = self.segments.lock();
            loop {
                let Some(slot) = state.index.get(id).copied() else {
                    return Ok(None);
                };
                if state.segments.get(&slot.seq).is_some_and(|s| s.compacting) {
                    state = self
                        .segments
                        .settled
                        .wait(state)
                        .unwrap_or_else(|e| e.into_inner());
                    continue;
                }
                state.index.remove(id);
                state
                    .segments
                    .get_mut(&slot.seq)
                    .expect("indexed segments exist")
                    .busy += 1;
                break slot;
            }
        };
        // On failure the image is still live on disk: it stays served, so a
        // retried delete finds it again.
        self.retire(slot.seq, &[(*id, slot)], true)?;
        self.changed(*id, false);
        self.objects.fetch_sub(1, Ordering::Relaxed);
        Ok(Some(slot.stored))
    }

    /// Marks the copies a newer one superseded dead (the sweep at open).
    pub(super) fn bury_superseded(&self, superseded: Vec<(u64, ObjectId)>) -> Result<u64> {
        let mut by_seg: BTreeMap<u64, Vec<ObjectId>> = BTreeMap::new();
        for (seq, id) in superseded {
            by_seg.entry(seq).or_default().push(id);
        }
        let mut n = 0;
        for (seq, ids) in by_seg {
            let file = {
                let mut state = self.segments.lock();
                if !state.segments.contains_key(&seq) {
                    continue;
                }
                self.segments.dead_file(&mut state, seq)?
            };
            self.segments.write_dead(seq, &file, &ids)?;
            n += ids.len() as u64;
            let next = {
                let mut state = self.segments.lock();
                self.after_change(&mut state, seq)
            };
            self.tidy(next);
        }
        Ok(n)
    }
}

enum Tidy {
    Nothing,
    Remove(u64, u64),
    Compact(u64, Arc<File>, Vec<(ObjectId, Slot)>),
}

/// `get_packed` of an image read whole with one direct read from `direct`
/// (the segment opened with O_DIRECT): header checked, payload copied into
/// `dst` and checksummed.
fn get_packed_direct(
    direct: &File,
    slot: Slot,
    id: &ObjectId,
    dst: &mut [u8],
    what: &str,
) -> Result<ObjectHeader> {
    let read = read_range_direct(direct, slot.offset, slot.stored as usize, |image| {
        let header = check_header(image, slot, id, what)?;
        check_destination(id, dst.len() as u64, header.payload_len())?;
        let crc = copy_checksummed(dst, &image[HEADER_LEN..], 0);
        if crc != header.checksum {
            return Err(checksum_mismatch(what, header.checksum, crc));
        }
        Ok(header)
    });
    match read {
        Ok(checked) => checked,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(ShoalError::new(
            ErrorKind::ObjectCorrupt,
            format!("{what}: truncated image"),
        )),
        Err(e) => Err(io_error(&format!("read {what}"), e)),
    }
}

//! `DirTier` itself: the tier's shared state (`Inner`), its construction,
//! its capacity accounting, and the `Tier` implementation, which hands each
//! call to the module of its concern (mod.rs has the layout and the list).
//!
//! `Inner`'s other methods live by concern in `walk`, `images`, `packed`
//! and `batch`, which import `Inner` from here; this module names none of
//! theirs. The types those methods take or return (`Found`, `AtOpen`,
//! `Staged`) are defined here rather than beside them: the module-cycle
//! check counts a type's methods, wherever they are, for the type's module,
//! so a type they name must not come from a module that imports this one.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use async_trait::async_trait;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ObjectId;

use crate::format::{ObjectHeader, ObjectSizes};
use crate::identity::{Adoption, TierIdentity};
use crate::range::{DestRange, SourceRange};
use crate::tier::{PutItem, Tier, TierUsage};

use super::io::{io_error, sync_dir, write_durably};
use super::segments::{Segments, SEGMENTS};

const MARKER: &str = "shoal-tier.id";
/// Beside the marker while its owner is stopped cleanly (and expected back):
/// no other node adopts the tier meanwhile.
const STOPPED: &str = "shoal-tier.stopped";
pub(super) const OBJECTS: &str = "objects";
pub(super) const TMP: &str = "tmp";

/// A directory tier. Cheap to clone (shared state).
#[derive(Clone)]
pub struct DirTier {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) root: PathBuf,
    pub(super) capacity: u64,
    pub(super) used: AtomicU64,
    pub(super) objects: AtomicU64,
    /// True once the sizes of the images found at open are in `used`. The
    /// count runs in the background (a stat per file: seconds for a million
    /// objects, which must not delay a restart); writes and deletes wait for
    /// it so their own accounting never mixes with a half-done count.
    pub(super) counted: (Mutex<bool>, Condvar),
    /// What the walk at open found, kept for recovery's first `sweep` and
    /// `list` (a restart would otherwise list a million files three times).
    pub(super) found: (Mutex<Found>, Condvar),
    /// The packed images (loaded by the walk at open).
    pub(super) segments: Segments,
}

/// The walk at open, in the background, and what it found.
#[derive(Default)]
pub(super) struct Found {
    /// `None` while the walk runs; its error, if it failed.
    pub(super) walked: Option<Result<()>>,
    /// Ids of the images found, until the first `list` takes them.
    pub(super) ids: Option<Vec<ObjectId>>,
    /// Names under `objects/` that are not ids, and segment files to remove,
    /// until the first `sweep`.
    pub(super) strays: Option<Vec<PathBuf>>,
    /// Packed copies that newer ones supersede, to mark dead at the sweep.
    pub(super) superseded: Vec<(u64, ObjectId)>,
    /// Images placed (`true`) or removed since the walk began, in order,
    /// while `ids` is kept: the first `list` applies them.
    pub(super) since: Vec<(ObjectId, bool)>,
}

/// What the walk at open found.
pub(super) struct AtOpen {
    /// Ids of the file images.
    pub(super) files: Vec<ObjectId>,
    /// Ids of the live packed images.
    pub(super) packed_ids: Vec<ObjectId>,
    /// Bytes of the segment files, and the packed images.
    pub(super) packed: (u64, u64),
    pub(super) strays: Vec<PathBuf>,
    pub(super) superseded: Vec<(u64, ObjectId)>,
}

/// An image written to `tmp/` and not yet published (see `Inner::stage`).
pub(super) struct Staged {
    pub(super) id: ObjectId,
    pub(super) tmp: PathBuf,
    pub(super) file: File,
    pub(super) header: ObjectHeader,
    /// Capacity it took.
    pub(super) stored: u64,
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
        Self::claim_own(root, owner, &what)?;
        Self::open_claimed(root, capacity, &what)
    }

    /// Opens another node's tier for `adopter` (`adopter.adopted_by` names
    /// it) once that node was removed from the cluster: its directory must
    /// exist with that node's marker, adopted by this adopter already or by
    /// one `may_take` accepts (`None`: not adopted; see
    /// [`TierIdentity::adoption`]); the marker is rewritten to name the
    /// adopter (durably) before this returns. Nothing is created: a
    /// directory this node cannot see is `ObjectNotFound`.
    pub fn adopt(
        root: &Path,
        adopter: &TierIdentity,
        capacity: u64,
        may_take: impl Fn(Option<u32>) -> bool,
    ) -> Result<Self> {
        let what = root.display().to_string();
        let found = read_marker(root)?.ok_or_else(|| {
            ShoalError::new(
                ErrorKind::ObjectNotFound,
                format!("no shoal tier at {what} seen from this node (no {MARKER})"),
            )
        })?;
        if found.adopted_by.is_none() && root.join(STOPPED).exists() {
            return Err(found.stopped_cleanly(&what));
        }
        if adopter.adoption(&found, &what, may_take)? == Adoption::TakeOver {
            write_durably(root, MARKER, adopter.encode()?.as_bytes())?;
        }
        Self::open_claimed(root, capacity, &what)
    }

    /// The marker part of [`open`](Self::open): `owner`'s tier, or a new
    /// empty one made `owner`'s; a mark of a clean stop goes (it is back).
    fn claim_own(root: &Path, owner: &TierIdentity, what: &str) -> Result<()> {
        match read_marker(root)? {
            Some(found) => owner.check(&found, what)?,
            None => {
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
        }
        mark_stopped(root, false)
    }

    /// The rest of opening a tier whose marker was checked: its layout
    /// made, then walked in the background.
    fn open_claimed(root: &Path, capacity: u64, what: &str) -> Result<Self> {
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
        let walk = move || inner.walk_and_count();
        if let Err(e) = std::thread::Builder::new()
            .name("shoal-tier-walk".into())
            .spawn(walk)
        {
            return Err(io_error(&format!("start walking {what}"), e));
        }
        Ok(tier)
    }

    /// The tier's directory, as given to `open`.
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

    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| ShoalError::io("tier I/O task", e))?
    }
}

// -- capacity ---------------------------------------------------------------

impl Inner {
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
        self.put_items(items).await
    }

    async fn get(&self, id: ObjectId, dst: DestRange) -> (DestRange, Result<ObjectHeader>) {
        // The range waits here until the task takes it, so a task cancelled
        // before it ran (the runtime shutting down) can hand it back.
        let parked = Arc::new(Mutex::new(Some(dst)));
        let inner = self.inner.clone();
        let handed = parked.clone();
        let task = tokio::task::spawn_blocking(move || {
            let mut dst = handed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .expect("the range is taken once");
            let got = inner.get(id, &mut dst);
            (dst, got)
        });
        match task.await {
            Ok(done) => done,
            // The task panicked and took the range with it: nothing to hand back.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: a blocking task is only ever cancelled before it
            // starts, so the range is still parked.
            Err(e) => {
                let dst = parked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .expect("a cancelled blocking task never ran");
                let err = ShoalError::io(
                    &format!("read of {id} from {}", self.inner.root.display()),
                    e,
                );
                (dst, Err(err))
            }
        }
    }

    async fn verify(&self, id: ObjectId) -> Result<ObjectHeader> {
        self.blocking(move |inner| inner.verify(id)).await
    }

    async fn header(&self, id: ObjectId) -> Result<ObjectHeader> {
        self.blocking(move |inner| inner.header(id)).await
    }

    async fn delete(&self, id: ObjectId) -> Result<bool> {
        self.blocking(move |inner| inner.delete(id)).await
    }

    async fn list(&self) -> Result<Vec<ObjectId>> {
        self.blocking(|inner| inner.list()).await
    }

    async fn marker(&self) -> Result<Option<TierIdentity>> {
        self.blocking(|inner| read_marker(&inner.root)).await
    }

    async fn mark_stopped(&self, stopped: bool) -> Result<()> {
        self.blocking(move |inner| mark_stopped(&inner.root, stopped))
            .await
    }

    async fn sweep(&self) -> Result<u64> {
        self.blocking(|inner| inner.sweep()).await
    }
}

/// The owner marker of the tier at `root`; `None` where there is none.
fn read_marker(root: &Path) -> Result<Option<TierIdentity>> {
    let marker = root.join(MARKER);
    match fs::read_to_string(&marker) {
        Ok(text) => TierIdentity::decode(&text, &marker.display().to_string()).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error(&format!("read {}", marker.display()), e)),
    }
}

/// Marks (durably) the owner of the tier at `root` as stopped cleanly, or
/// clears the mark.
fn mark_stopped(root: &Path, stopped: bool) -> Result<()> {
    if stopped {
        return write_durably(root, STOPPED, b"stopped cleanly: expected back\n");
    }
    match fs::remove_file(root.join(STOPPED)) {
        Ok(()) => sync_dir(root),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(
            &format!("remove {STOPPED} in {}", root.display()),
            e,
        )),
    }
}

//! Open files. A file opened for reading holds a reference to the sealed
//! object its name was bound to at open (a rewrite meanwhile does not
//! change what it reads, as with a file replaced by rename on a local file
//! system). A file opened for writing gets its own draft (draft.rs): an
//! unsealed store object, filled from the current version unless
//! truncated, sealed under the name when closed: a version is always one
//! writer's whole file, never a mix (last close wins). Each open file
//! knows its inode and whether it reads through the kernel's page cache
//! of it (inodes.rs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use shoal_core::ObjectId;

use crate::draft::Draft;
use crate::inodes::Version;
use crate::writers::Changers;

/// A sealed object's bytes in this process's mapping of the region.
pub struct Sealed {
    pub id: ObjectId,
    /// Address in the client's mapping (kept as an integer so the handle
    /// can be shared by the session threads).
    address: usize,
    len: usize,
}

impl Sealed {
    /// # Safety
    /// `address..address + len` must lie in the client's mapping, in an
    /// object referenced until this handle is released.
    pub unsafe fn new(id: ObjectId, address: *const u8, len: usize) -> Self {
        Self {
            id,
            address: address as usize,
            len,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the constructor's contract: the range is mapped and the
        // object referenced (so neither freed nor written) while we live.
        unsafe { std::slice::from_raw_parts(self.address as *const u8, self.len) }
    }
}

/// A file being written, in two locks: metadata operations read `info`
/// (held briefly, never across a call to the daemon), while a write,
/// truncate or commit holds `draft` for its whole length, which may wait
/// for the store (for room). So a lookup or a listing never waits behind a
/// write waiting for memory. Order: `draft` → `info`.
pub struct Writer {
    pub info: Mutex<WriterInfo>,
    pub draft: Mutex<Draft>,
}

pub struct WriterInfo {
    pub path: String,
    pub ino: u64,
    /// The file's length (the draft's, kept here for stat).
    pub len: u64,
    /// Written since the last commit.
    pub dirty: bool,
    /// Who wrote it since the last commit (writers.rs: whose close commits).
    pub changers: Changers,
    /// Its name was unlinked while open: closing it writes nothing.
    pub unlinked: bool,
    /// Another writer had the same inode open meanwhile: the kernel's page
    /// cache of it mixes both writers' bytes, so it must not be kept for
    /// the version this one writes.
    pub shared: bool,
    /// Opened without the page cache (the inode's pages were not its
    /// draft's base): the inode's pages are not the version it seals.
    pub direct: bool,
    /// The version its last commit sealed (None once written again).
    pub sealed: Option<Version>,
    /// A modification time set while it is open (ms since the epoch):
    /// what stat shows, and the name's after its next seal.
    pub mtime_ms: Option<u64>,
    /// The process that opened it closed a descriptor of it (a flush; a
    /// forked child's close at its exec does not count) and nothing was written
    /// since: its release, which the kernel sends after that close
    /// returned, is probably on its way.
    pub closing: bool,
}

impl Writer {
    pub fn new(path: String, ino: u64, draft: Draft, dirty: bool) -> Self {
        let info = WriterInfo {
            path,
            ino,
            len: draft.len(),
            dirty,
            changers: Changers::default(),
            unlinked: false,
            shared: false,
            direct: false,
            sealed: None,
            mtime_ms: None,
            closing: false,
        };
        Self {
            info: Mutex::new(info),
            draft: Mutex::new(draft),
        }
    }

    /// Runs `change` on the draft (holding it) for thread `by` (FUSE's
    /// pid of the request), then records its new length and, if it
    /// succeeded, that the file is dirty and who changed it.
    pub fn change<T, E>(
        &self,
        by: u32,
        change: impl FnOnce(&mut Draft) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut draft = lock(&self.draft);
        let result = change(&mut draft);
        let mut info = lock(&self.info);
        info.len = draft.len();
        if result.is_ok() {
            // A write after a time was set sets the seal time again.
            info.dirty = true;
            info.changers.changed_by(by);
            info.sealed = None;
            info.mtime_ms = None;
            info.closing = false;
        }
        result
    }
}

/// An open file. Handles are shared (`Arc`) so that reads and writes of
/// different files, and reads of one sealed file, run on several session
/// threads at once; a writer has its own locks.
pub enum Handle {
    Reader(Sealed),
    Writer(Box<Writer>),
    /// A read-only open of a file that has no version yet (one this mount
    /// is creating): empty, as readers never see a writer's draft.
    Empty,
}

/// Locks `m`. A thread that panicked while holding it left a buffer that is
/// still a valid (if partial) file, so the poison is ignored rather than
/// taking the whole mount down.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads `size` bytes at `offset` of `bytes` (short at the end).
pub fn slice_at(bytes: &[u8], offset: u64, size: u32) -> &[u8] {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let end = start.saturating_add(size as usize).min(bytes.len());
    &bytes[start..end]
}

/// An open file in the table: its handle, its inode, and whether it uses
/// the inode's page cache.
pub struct Open {
    pub handle: Arc<Handle>,
    pub ino: u64,
    pub cached: bool,
}

#[derive(Default)]
pub struct Handles {
    open: HashMap<u64, Open>,
    next: u64,
}

impl Handles {
    pub fn insert(&mut self, handle: Handle, ino: u64, cached: bool) -> u64 {
        self.next += 1;
        let open = Open {
            handle: Arc::new(handle),
            ino,
            cached,
        };
        self.open.insert(self.next, open);
        self.next
    }

    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.open.get(&fh).map(|o| o.handle.clone())
    }

    pub fn remove(&mut self, fh: u64) -> Option<Open> {
        self.open.remove(&fh)
    }

    pub fn writers(&self) -> impl Iterator<Item = &Writer> {
        self.open.values().filter_map(|o| match o.handle.as_ref() {
            Handle::Writer(w) => Some(w.as_ref()),
            Handle::Reader(_) | Handle::Empty => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_short_at_the_end_and_empty_past_it() {
        assert_eq!(slice_at(b"hello", 3, 10), b"lo");
        assert_eq!(slice_at(b"hello", 9, 10), b"");
        assert_eq!(slice_at(b"hello", u64::MAX, u32::MAX), b"");
    }
}

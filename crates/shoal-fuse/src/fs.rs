//! The file system: names as files, name prefixes as directories.
//!
//! - lookup/getattr: a name bound in the store is a file (its size and seal
//!   time); a prefix of names, or a directory made by `mkdir` here, is a
//!   directory; a file being written here that has no version yet is a file
//!   of its buffer's size.
//! - open for reading: a reference to the object the name is bound to;
//!   reads are slices of the mapped region. An inode holds one version
//!   (inodes.rs), so its page cache is kept (FOPEN_KEEP_CACHE): repeated
//!   reads and mmap are served by the kernel without a call here. An open
//!   of an inode whose version is no longer the name's (the kernel's entry
//!   is up to TTL old) reads the current version without the page cache
//!   (FOPEN_DIRECT_IO), whole all the same.
//! - open for writing / create: a draft (draft.rs): the bytes go straight
//!   into an unsealed store object that grows with the file, sealed under
//!   the name at flush (close), fsync and release. A writer takes an inode
//!   of its own: one that files are open on (readers of a version, another
//!   writer) is refused with ESTALE after a fresh inode is made for the
//!   name, which the kernel's retry opens. Readers of an inode being
//!   written read the name's sealed version without the page cache: no
//!   reader sees a draft.
//!
//! Concurrency: fuser runs several session threads (`mount.rs`), each
//! reading requests from its own clone of the /dev/fuse descriptor. The
//! names, inodes and the table of open files are one lock (`State`), held
//! for a whole metadata operation so those stay ordered as before; reads
//! and writes only look their handle up under it and then work on the
//! handle alone (a sealed object needs no lock, a writer's draft has its
//! own), so I/O on different files, and reads of one file, run in parallel.
//! Lock order: `state` → a writer → `drafts` or `client`; a commit takes a
//! writer and then the drafts connection without `state`, so it never waits
//! for a metadata operation that waits for it. Drafts have connections of
//! their own (several, each draft on the one that holds its object): a write
//! waiting for room does not hold up lookups and opens, nor other files'
//! growth and seals on another connection.
//!
//! Once the daemon is gone every operation answers EIO at once; the mount
//! itself is ended by `mount.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};
use libc::c_int;
use shoal_client::{Client, Located, NameEntry};
use shoal_core::error::{ErrorKind, ShoalError};
use shoal_core::names;
use shoal_core::region::Mapping;
use shoal_core::ObjectId;

use crate::draft::{Draft, DraftStore, Held};
use crate::errno::{daemon_gone, errno};
use crate::handles::{lock, slice_at, Handle, Handles, Sealed, Writer};
use crate::inodes::{Content, Inodes, Version};
use crate::session::{configure_kernel, BLOCK};

/// How long the kernel may trust an answer about a name. Short: other
/// clients rename and rewrite names behind the mount's back.
const TTL: Duration = Duration::from_secs(1);
/// A draft's create waits for room this long at a time, letting go of its
/// connection in between.
const CREATE_WAIT_SLICE: Duration = Duration::from_millis(50);
/// An open for writing this soon after a lookup answered with the inode is
/// not refused with ESTALE again (it may be the kernel's one retry).
const RETRY_WINDOW: Duration = Duration::from_millis(50);
/// Every file's and directory's mode (names have no mode of their own).
const FILE_PERM: u16 = 0o644;
const DIR_PERM: u16 = 0o755;
/// How long an inode made for a writer's retry waits for it.
const RESERVED_FOR: Duration = Duration::from_secs(1);

/// What a path is.
enum Node {
    File { size: u64, mtime: SystemTime },
    Dir,
}

fn mtime_of(entry: &NameEntry) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(entry.mtime_ms)
}

fn version_of(entry: &NameEntry) -> Version {
    Version {
        id: entry.id,
        size: entry.data_size,
        mtime: mtime_of(entry),
    }
}

/// Replies with `errno`.
fn errno_of(e: c_int) -> Errno {
    Errno::from_i32(e)
}

/// The mount's view of names, inodes and open files, under one lock.
#[derive(Default)]
struct State {
    inodes: Inodes,
    handles: Handles,
    /// Directories made here by mkdir: a name prefix exists only while a
    /// name is under it, so empty directories live in the mount.
    dirs: BTreeSet<String>,
    /// Modes set by chmod that are not the default (0644, 0755): names
    /// have no mode in the store, so the mount keeps them (docs/posix.md).
    modes: std::collections::HashMap<String, u16>,
}

pub struct ShoalFs {
    /// Metadata, names and readers' objects.
    client: Mutex<Client>,
    /// Drafts (files being written): their creates may wait for room, and
    /// a connection answers one call at a time, so lookups, opens and
    /// reads must not queue behind them. Several, so that writers of
    /// several files do not queue behind one another's growth and seals
    /// either; new drafts take them in turn.
    drafts: Vec<Mutex<Client>>,
    /// Each drafts connection's mapping of the region (where its drafts' bytes are).
    draft_maps: Vec<Arc<Mapping>>,
    /// The drafts connection the next draft takes (in turn); a draft keeps
    /// the one it took (`Held::conn`).
    next_draft: AtomicUsize,
    state: Mutex<State>,
    /// Largest file: the store's capacity (an object larger than memory
    /// can never be created). Beyond: EFBIG.
    max_file: u64,
    /// How long a close waits for memory when the store is full (the
    /// tiers' drain may free some); then ENOSPC.
    space_wait_ms: u32,
    /// Cleared when the daemon goes away (here or by the watcher).
    alive: Arc<AtomicBool>,
    uid: u32,
    gid: u32,
    /// Ask the kernel for its write-back cache (`MountConfig::writeback_cache`).
    writeback_cache: bool,
}

impl ShoalFs {
    pub fn new(
        client: Client,
        drafts: Vec<Client>,
        space_wait_ms: u32,
        alive: Arc<AtomicBool>,
        writeback_cache: bool,
    ) -> Self {
        let max_file = client.info().capacity;
        Self {
            client: Mutex::new(client),
            draft_maps: drafts.iter().map(|c| c.mapping().clone()).collect(),
            drafts: drafts.into_iter().map(Mutex::new).collect(),
            next_draft: AtomicUsize::new(0),
            state: Mutex::new(State::default()),
            max_file,
            space_wait_ms,
            alive,
            // SAFETY: getuid/getgid cannot fail.
            uid: unsafe { libc::getuid() },
            // SAFETY: as above.
            gid: unsafe { libc::getgid() },
            writeback_cache,
        }
    }

    /// Turns a store error into an errno, noting a daemon that went away.
    fn fail(&self, err: &ShoalError) -> c_int {
        if daemon_gone(err) {
            if self.alive.swap(false, Ordering::SeqCst) {
                tracing::warn!(%err, "the daemon went away: the mount answers EIO");
            }
            return libc::EIO;
        }
        errno(err)
    }

    fn check_alive(&self) -> Result<(), c_int> {
        if self.alive.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(libc::EIO)
        }
    }

    fn handle(&self, fh: FileHandle) -> Option<Arc<Handle>> {
        lock(&self.state).handles.get(fh.0)
    }

    fn resolve(&self, path: &str) -> Result<Option<NameEntry>, c_int> {
        let resolved = lock(&self.client).resolve(path);
        match resolved {
            Ok(entry) => Ok(Some(entry)),
            Err(err) if errno(&err) == libc::ENOENT && !daemon_gone(&err) => Ok(None),
            Err(err) => Err(self.fail(&err)),
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<NameEntry>, c_int> {
        let listed = lock(&self.client).list_names(dir);
        listed.map_err(|e| self.fail(&e))
    }

    fn file_attr(&self, ino: u64, size: u64, mtime: SystemTime) -> FileAttr {
        self.attr(ino, &Node::File { size, mtime })
    }

    fn attr(&self, ino: u64, node: &Node) -> FileAttr {
        let (kind, size, mtime, perm, nlink) = match *node {
            Node::File { size, mtime } => (FileType::RegularFile, size, mtime, FILE_PERM, 1),
            Node::Dir => (FileType::Directory, 0, SystemTime::now(), DIR_PERM, 2),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: BLOCK,
            flags: 0,
        }
    }

    /// Seals a writer's draft as the name's new version. Holds only the
    /// writer (and the client for each call): other files go on meanwhile.
    /// `closer`: the thread whose close(2) this is (a flush); it commits
    /// only what its process wrote (writers.rs).
    fn commit(&self, fh: FileHandle, closer: Option<u32>) -> Result<(), c_int> {
        self.check_alive()?;
        let Some(handle) = self.handle(fh) else {
            return Ok(());
        };
        let Handle::Writer(writer) = handle.as_ref() else {
            return Ok(());
        };
        let mut draft = lock(&writer.draft);
        let (path, dirty, unlinked, theirs) = {
            let info = lock(&writer.info);
            let theirs = closer.is_none_or(|tid| info.changers.commits_on_close_by(tid));
            (info.path.clone(), info.dirty, info.unlinked, theirs)
        };
        if !dirty || unlinked || !theirs {
            return Ok(());
        }
        tracing::debug!(%path, len = draft.len(), ?closer, "commit");
        let id = draft.seal(self, &path)?;
        let mtime_ms = lock(&writer.info).mtime_ms.take();
        if let Some(ms) = mtime_ms {
            // A time set while it was being written (touch -d, rsync).
            let set = lock(&self.client).set_mtime(&path, ms);
            set.map_err(|e| self.fail(&e))?;
        }
        let mut info = lock(&writer.info);
        // A rename or unlink takes the draft first: not meanwhile.
        info.dirty = false;
        info.changers.clear();
        info.sealed = Some(Version {
            id,
            size: draft.len(),
            mtime: mtime_ms
                .map_or_else(SystemTime::now, |ms| UNIX_EPOCH + Duration::from_millis(ms)),
        });
        Ok(())
    }

    /// A writer's handle is closed for good: its draft's object goes (an
    /// unsealed one aborted, a sealed one's reference released).
    fn finish_writer(&self, writer: &Writer) {
        let mut draft = lock(&writer.draft);
        if self.alive.load(Ordering::SeqCst) {
            draft.finish(self);
        } else {
            // The daemon is gone, and with it every object of ours.
            *draft = Draft::default();
        }
    }

    /// A file open on an inode was closed. The last writer of an inode
    /// leaves it holding the version it sealed, when its pages are exactly
    /// that version's (it alone wrote through them since its base);
    /// otherwise what the inode holds is not known any more.
    fn closed(&self, open: &crate::handles::Open) {
        let sealed = match open.handle.as_ref() {
            Handle::Writer(w) => {
                let info = lock(&w.info);
                let whole = !info.shared && !info.direct && !info.unlinked && !info.dirty;
                Some(info.sealed.filter(|_| whole))
            }
            Handle::Reader(_) | Handle::Empty => None,
        };
        let mut st = lock(&self.state);
        let writers_left = st.handles.writers().any(|w| lock(&w.info).ino == open.ino);
        let Some(node) = st.inodes.get_mut(open.ino) else {
            return;
        };
        node.opens = node.opens.saturating_sub(1);
        node.cached_opens = node.cached_opens.saturating_sub(u32::from(open.cached));
        if let Some(sealed) = sealed {
            if node.content == Content::Draft && !writers_left {
                node.content = sealed.map_or(Content::Stale, Content::Version);
            }
        }
        st.inodes.forget(open.ino, 0);
    }

    fn release_object(&self, id: ObjectId) {
        self.release_on(&self.client, id);
    }

    /// Gives back a reference `connection` holds (nothing to do once the
    /// daemon is gone: it dropped them all).
    fn release_on(&self, connection: &Mutex<Client>, id: ObjectId) {
        if self.alive.load(Ordering::SeqCst) {
            let released = lock(connection).release(&[id]);
            if let Err(err) = released {
                self.fail(&err);
            }
        }
    }

    /// The drafts connection the next draft takes.
    fn next_draft(&self) -> usize {
        self.next_draft.fetch_add(1, Ordering::Relaxed) % self.drafts.len()
    }
}

/// Drafts live in the store, through the mount's drafts connection (its
/// lock taken per call: a draft's copies run without it).
impl DraftStore for ShoalFs {
    fn create(&self, data_size: u64, wait: bool) -> Result<(Held, *mut u8), c_int> {
        let id = ObjectId::random();
        let conn = self.next_draft();
        // A create that waits for room does so in slices, letting go of the
        // connection between them: the seals and shrinks of other drafts
        // on it are what may free that room.
        let deadline = Instant::now() + Duration::from_millis(u64::from(self.space_wait_ms));
        let (mut client, location) = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = if wait {
                left.min(CREATE_WAIT_SLICE)
            } else {
                Duration::ZERO
            };
            let mut client = lock(&self.drafts[conn]);
            match client.create_growing(id, data_size, slice.as_millis() as u32) {
                Ok(location) => break (client, location),
                Err(err) if wait && err.kind() == ErrorKind::StoreFull && !left.is_zero() => {}
                Err(err) => return Err(self.fail(&err)),
            }
        };
        let node = client.node();
        match client.located_ptr_mut(Located::local(node, location)) {
            Ok(address) => Ok((Held { id, conn }, address)),
            Err(err) => {
                let _ = client.abort(id);
                Err(self.fail(&err))
            }
        }
    }

    fn resize(&self, object: Held, data_size: u64) -> Result<bool, c_int> {
        let resized = lock(&self.drafts[object.conn]).resize(object.id, data_size);
        resized.map_err(|e| self.fail(&e))
    }

    fn prepare_write(&self, object: Held, at: *mut u8, len: usize) {
        // The connection's mapping, without its lock (other drafts' store
        // calls hold it): a mapping is never replaced while its client lives.
        let mapping = &self.draft_maps[object.conn];
        let offset = (at as usize).wrapping_sub(mapping.base() as usize) as u64;
        mapping.populate_for_writing(offset, len as u64);
    }

    fn seal_named(&self, object: Held, name: &str) -> Result<(), c_int> {
        let mut client = lock(&self.drafts[object.conn]);
        client.name(object.id, name).map_err(|e| self.fail(&e))?;
        // The seal waits for the node's default durability.
        client
            .seal_durable(&[object.id], false, None)
            .map_err(|e| self.fail(&e))
    }

    fn is_sealed(&self, object: Held) -> Option<bool> {
        let sealed = lock(&self.drafts[object.conn]).contains(object.id);
        sealed.ok()
    }

    fn abort(&self, object: Held) {
        let aborted = lock(&self.drafts[object.conn]).abort(object.id);
        if let Err(err) = aborted {
            self.fail(&err);
        }
    }

    fn release(&self, object: Held) {
        self.release_on(&self.drafts[object.conn], object.id);
    }
}

/// A metadata operation: the state locked for its whole length.
struct Op<'a> {
    fs: &'a ShoalFs,
    st: std::sync::MutexGuard<'a, State>,
}

impl<'a> Op<'a> {
    fn new(fs: &'a ShoalFs) -> Self {
        Self {
            fs,
            st: lock(&fs.state),
        }
    }

    fn path_of(&self, ino: INodeNo) -> Result<String, c_int> {
        self.st
            .inodes
            .path(ino.0)
            .map(str::to_owned)
            .ok_or(libc::ENOENT)
    }

    /// The path of `name` in directory `parent`, checked as a name.
    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<String, c_int> {
        let dir = self.path_of(parent)?;
        let name = name.to_str().ok_or(libc::EINVAL)?;
        let path = if dir.is_empty() {
            name.to_owned()
        } else {
            format!("{dir}/{name}")
        };
        names::check(&path).map_err(|e| errno(&e))?;
        Ok(path)
    }

    /// The length of the file a writer on this mount has open on `ino`
    /// (the newest, when several), if one has.
    fn writer_len(&self, ino: u64) -> Option<u64> {
        self.newest_writer(|w| w.ino == ino)
    }

    /// The length of the file a writer on this mount has open for `path`.
    fn path_writer_len(&self, path: &str) -> Option<u64> {
        self.newest_writer(|w| w.path == path)
    }

    fn newest_writer(&self, pick: impl Fn(&crate::handles::WriterInfo) -> bool) -> Option<u64> {
        self.newest_writer_attrs(pick).map(|(len, _)| len)
    }

    /// The newest writer's length and modification time (the one set
    /// while it is open, else now).
    fn newest_writer_attrs(
        &self,
        pick: impl Fn(&crate::handles::WriterInfo) -> bool,
    ) -> Option<(u64, SystemTime)> {
        let mut best: Option<(bool, u64, Option<u64>)> = None;
        for writer in self.st.handles.writers() {
            let w = lock(&writer.info);
            if w.unlinked || !pick(&w) {
                continue;
            }
            if best.is_none_or(|(was_dirty, ..)| w.dirty && !was_dirty) {
                best = Some((w.dirty, w.len, w.mtime_ms));
            }
        }
        best.map(|(_, len, ms)| {
            let mtime =
                ms.map_or_else(SystemTime::now, |ms| UNIX_EPOCH + Duration::from_millis(ms));
            (len, mtime)
        })
    }

    fn is_dir(&self, path: &str) -> Result<bool, c_int> {
        if path.is_empty() || self.st.dirs.contains(path) {
            return Ok(true);
        }
        let made_under = self
            .st
            .dirs
            .range(format!("{path}/")..)
            .next()
            .is_some_and(|d| names::is_under(d, path));
        Ok(made_under || !self.fs.list(path)?.is_empty())
    }

    /// What `path` is: a file being written here, a sealed file, or a
    /// directory.
    fn node(&self, path: &str) -> Result<Node, c_int> {
        self.fs.check_alive()?;
        if let Some(size) = self.path_writer_len(path) {
            return Ok(Node::File {
                size,
                mtime: SystemTime::now(),
            });
        }
        if !path.is_empty() {
            if let Some(entry) = self.fs.resolve(path)? {
                return Ok(Node::File {
                    size: entry.data_size,
                    mtime: mtime_of(&entry),
                });
            }
        }
        if self.is_dir(path)? {
            Ok(Node::Dir)
        } else {
            Err(libc::ENOENT)
        }
    }

    /// The inode a lookup of `path` answers with, and its attributes: the
    /// inode a writer here has open, or the one of the name's version (a
    /// new one for a new version), or the directory's.
    fn lookup(&mut self, path: &str) -> Result<(u64, FileAttr), c_int> {
        self.fs.check_alive()?;
        if let Some(ino) = self.st.inodes.current(path) {
            match self.st.inodes.get(ino).map(|n| n.content) {
                Some(Content::Draft) => {
                    if let Some(len) = self.writer_len(ino) {
                        return Ok((ino, self.fs.file_attr(ino, len, SystemTime::now())));
                    }
                }
                Some(Content::Reserved { version, until }) if Instant::now() < until => {
                    return Ok((ino, self.reserved_attr(ino, version)));
                }
                _ => {}
            }
        }
        if !path.is_empty() {
            if let Some(entry) = self.fs.resolve(path)? {
                let version = version_of(&entry);
                let ino = self.st.inodes.version(path, version);
                return Ok((ino, self.fs.file_attr(ino, version.size, version.mtime)));
            }
        }
        if self.is_dir(path)? {
            let ino = self.st.inodes.dir(path);
            return Ok((ino, self.fs.attr(ino, &Node::Dir)));
        }
        Err(libc::ENOENT)
    }

    fn reserved_attr(&self, ino: u64, version: Option<Version>) -> FileAttr {
        match version {
            Some(v) => self.fs.file_attr(ino, v.size, v.mtime),
            None => self.fs.file_attr(ino, 0, SystemTime::now()),
        }
    }

    /// The attributes of inode `ino`: those of what it holds, so that the
    /// kernel's size of it stays its version's (files open on it read
    /// that version's pages up to that size).
    fn getattr(&mut self, ino: u64) -> Result<FileAttr, c_int> {
        self.fs.check_alive()?;
        let node = self.st.inodes.get(ino).ok_or(libc::ENOENT)?;
        let (path, content) = (node.path.clone(), node.content);
        match content {
            Content::Version(mut v) => {
                // The name's modification time while the name holds it.
                if self.st.inodes.current(&path) == Some(ino) {
                    if let Some(entry) = self.fs.resolve(&path)? {
                        if entry.id == v.id {
                            v.mtime = mtime_of(&entry);
                            self.st.inodes.version(&path, v);
                        }
                    }
                }
                Ok(self.fs.file_attr(ino, v.size, v.mtime))
            }
            Content::Draft if self.writer_len(ino).is_some() => {
                let (len, mtime) = self
                    .newest_writer_attrs(|w| w.ino == ino)
                    .unwrap_or((0, SystemTime::now()));
                Ok(self.fs.file_attr(ino, len, mtime))
            }
            Content::Reserved { version, .. } => Ok(self.reserved_attr(ino, version)),
            Content::Dir | Content::Draft | Content::Stale => {
                let node = self.node(&path)?;
                Ok(self.fs.attr(ino, &node))
            }
        }
    }

    /// Whether a handle open for writing on this mount has inode `ino`.
    fn writing(&self, ino: u64) -> bool {
        self.st.handles.writers().any(|w| lock(&w.info).ino == ino)
    }

    /// Counts a file opened on `ino` and inserts its handle.
    fn insert_open(&mut self, handle: Handle, ino: u64, cached: bool) -> u64 {
        if let Some(node) = self.st.inodes.get_mut(ino) {
            node.opens += 1;
            node.cached_opens += u32::from(cached);
        }
        self.st.handles.insert(handle, ino, cached)
    }

    /// Whether the kernel may be retrying an open of `ino` it just looked
    /// up (or a rewrite raced that lookup): not to be refused again.
    fn just_looked_up(&self, ino: u64) -> bool {
        self.st
            .inodes
            .get(ino)
            .and_then(|n| n.looked_up)
            .is_some_and(|at| at.elapsed() < RETRY_WINDOW)
    }

    /// Opens inode `ino` for writing: its current bytes unless the kernel
    /// truncates them next (with the write-back cache, EBUSY while another
    /// handle writes it). The writer takes the inode when nothing else has
    /// it open and its pages are the draft's base; otherwise a fresh inode
    /// is made the name's and the kernel is told to retry (ESTALE).
    /// `opener`: the thread that opens it; with `truncate` (`O_TRUNC`: the
    /// kernel leaves the truncation to the open, `FUSE_ATOMIC_O_TRUNC`) the
    /// file starts empty and is that process's change.
    fn open_writer_handle(&mut self, ino: u64, opener: u32, truncate: bool) -> Result<u64, c_int> {
        if self.fs.writeback_cache && self.writing(ino) {
            // The kernel writes cached pages back through any handle open
            // for writing on the inode: two writers' bytes would mix.
            return Err(libc::EBUSY);
        }
        let node = self.st.inodes.get(ino).ok_or(libc::ENOENT)?;
        let (path, content, busy) = (node.path.clone(), node.content, node.cached_opens > 0);
        let (draft, base) = self.draft_of_current(&path)?;
        let holds_base = match content {
            Content::Version(v) => base.is_some_and(|b| b.id == v.id),
            Content::Reserved { version, .. } => version.map(|v| v.id) == base.map(|b| b.id),
            Content::Dir | Content::Draft | Content::Stale => false,
        };
        let writer_here = content == Content::Draft && self.writing(ino);
        let retry = self.just_looked_up(ino);
        let (direct, shared) = if !busy && holds_base {
            (false, false)
        } else if retry && writer_here {
            // Two writers opened it at once: they share its page cache
            // (each still seals its own version).
            (false, true)
        } else if retry && !busy {
            // Its pages are another version's: write around them.
            (true, false)
        } else {
            // Readers (or a writer) have it open: the writer gets a fresh
            // inode, which the kernel's retry of the open finds.
            let mut draft = draft;
            draft.finish(self.fs);
            let until = Instant::now() + RESERVED_FOR;
            self.st.inodes.fresh(
                &path,
                Content::Reserved {
                    version: base,
                    until,
                },
            );
            return Err(libc::ESTALE);
        };
        let draft = match truncate {
            true => {
                let mut draft = draft;
                draft.finish(self.fs);
                Draft::default()
            }
            false => draft,
        };
        let writer = Writer::new(path, ino, draft, truncate);
        {
            let mut info = lock(&writer.info);
            info.sealed = base;
            info.direct = direct;
            info.shared = shared;
            info.changers.opened_by(opener);
            if truncate {
                info.changers.changed_by(opener);
            }
        }
        if shared {
            for other in self.st.handles.writers() {
                let mut other = lock(&other.info);
                if other.ino == ino {
                    other.shared = true;
                }
            }
        }
        if let Some(node) = self.st.inodes.get_mut(ino) {
            node.content = Content::Draft;
        }
        Ok(self.insert_open(Handle::Writer(Box::new(writer)), ino, !direct))
    }

    /// A draft starting from the version bound to `path` (empty if none),
    /// and that version: a reference to it, taken on a drafts connection
    /// (the draft lets it go there), copied only when the file is changed.
    fn draft_of_current(&self, path: &str) -> Result<(Draft, Option<Version>), c_int> {
        let fs = self.fs;
        let conn = fs.next_draft();
        let mut client = lock(&fs.drafts[conn]);
        let (entry, located) = match client.get_named(path, 0) {
            Ok(got) => got,
            Err(err) if errno(&err) == libc::ENOENT && !daemon_gone(&err) => {
                return Ok((Draft::default(), None))
            }
            Err(err) => {
                drop(client);
                return Err(fs.fail(&err));
            }
        };
        match client.located_ptr(located) {
            Ok(ptr) => {
                let held = Held { id: entry.id, conn };
                let draft = Draft::from_sealed(held, ptr, entry.data_size);
                Ok((draft, Some(version_of(&entry))))
            }
            Err(err) => {
                let _ = client.release(&[entry.id]);
                drop(client);
                Err(fs.fail(&err))
            }
        }
    }

    /// The version bound to `path` with a reference to it (a handle's),
    /// or None when the name has none.
    fn get_version(&self, path: &str) -> Result<Option<(Sealed, Version)>, c_int> {
        let mut client = lock(&self.fs.client);
        let (entry, located) = match client.get_named(path, 0) {
            Ok(got) => got,
            Err(err) if errno(&err) == libc::ENOENT && !daemon_gone(&err) => return Ok(None),
            Err(err) => {
                drop(client);
                return Err(self.fs.fail(&err));
            }
        };
        let ptr = match client.located_ptr(located) {
            Ok(ptr) => ptr,
            Err(err) => {
                let _ = client.release(&[entry.id]);
                drop(client);
                return Err(self.fs.fail(&err));
            }
        };
        // SAFETY: `ptr` is the object's data in our mapping, referenced by
        // the get above until the handle's release.
        let sealed = unsafe { Sealed::new(entry.id, ptr, entry.data_size as usize) };
        Ok(Some((sealed, version_of(&entry))))
    }

    /// Opens inode `ino` for reading: the version bound to its name now,
    /// through the page cache when the inode holds that version (kept:
    /// FOPEN_KEEP_CACHE), else without it (FOPEN_DIRECT_IO).
    fn open_reader(&mut self, ino: u64) -> Result<(u64, FopenFlags), c_int> {
        let node = self.st.inodes.get(ino).ok_or(libc::ENOENT)?;
        let (path, content) = (node.path.clone(), node.content);
        let got = self.get_version(&path)?;
        let holds = match (content, &got) {
            (Content::Version(v), Some((_, now))) => v.id == now.id,
            _ => false,
        };
        if holds {
            let (sealed, _) = got.expect("matched above");
            let fh = self.insert_open(Handle::Reader(sealed), ino, true);
            return Ok((fh, FopenFlags::FOPEN_KEEP_CACHE));
        }
        // Another version's inode (the kernel's entry is up to a second
        // old, or a rewrite raced the lookup), one being written here,
        // reserved for a writer or of unknown pages: the name's version,
        // past the cache. (Not ESTALE: under load the kernel's one retry
        // can land on an inode a rewrite has made stale again.)
        let handle = match got {
            Some((sealed, _)) => Handle::Reader(sealed),
            None if matches!(content, Content::Version(_) | Content::Dir) => {
                return Err(libc::ENOENT)
            }
            None => Handle::Empty,
        };
        let fh = self.insert_open(handle, ino, false);
        Ok((fh, FopenFlags::FOPEN_DIRECT_IO))
    }

    /// Files are owned by the mounting user: a change of owner is refused
    /// (EPERM), never answered with a success that changes nothing. A mode
    /// is kept by the mount, per name (rsync makes its files 0600 while
    /// writing them, then gives them the source's mode).
    fn set_owner_and_mode(
        &mut self,
        ino: u64,
        path: &str,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<(), c_int> {
        if uid.is_some_and(|u| u != self.fs.uid) || gid.is_some_and(|g| g != self.fs.gid) {
            return Err(libc::EPERM);
        }
        if let Some(mode) = mode {
            let perm = (mode & 0o7777) as u16;
            if perm == self.default_perm(ino) {
                self.st.modes.remove(path);
            } else {
                self.st.modes.insert(path.to_owned(), perm);
            }
        }
        Ok(())
    }

    fn default_perm(&self, ino: u64) -> u16 {
        let dir = self
            .st
            .inodes
            .get(ino)
            .is_some_and(|n| n.content == Content::Dir);
        if dir {
            DIR_PERM
        } else {
            FILE_PERM
        }
    }

    /// `attr` with the mode chmod gave its name, if any.
    fn moded(&self, mut attr: FileAttr) -> FileAttr {
        if let Some(path) = self.st.inodes.path(attr.ino.0) {
            if let Some(&perm) = self.st.modes.get(path) {
                attr.perm = perm;
            }
        }
        attr
    }

    /// Sets the modification time of the file at `path` (inode `ino`):
    /// the name's, kept by the daemon. A file being written here takes it
    /// at its next seal (a write after it would set the seal time anyway).
    fn set_mtime(&mut self, ino: u64, path: &str, mtime: TimeOrNow) -> Result<(), c_int> {
        let at = match mtime {
            TimeOrNow::SpecificTime(t) => t,
            TimeOrNow::Now => SystemTime::now(),
        };
        let ms = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        match self.st.inodes.get(ino).map(|n| n.content) {
            Some(Content::Dir) | None => return Ok(()),
            _ => {}
        }
        let mut pending = false;
        for writer in self.st.handles.writers() {
            let mut w = lock(&writer.info);
            if w.ino == ino && !w.unlinked {
                w.mtime_ms = Some(ms);
                pending |= w.dirty;
            }
        }
        if pending {
            return Ok(());
        }
        let set = lock(&self.fs.client).set_mtime(path, ms);
        set.map_err(|e| self.fs.fail(&e))?;
        if let Some(node) = self.st.inodes.get_mut(ino) {
            if let Content::Version(v) = &mut node.content {
                v.mtime = UNIX_EPOCH + Duration::from_millis(ms);
            }
        }
        Ok(())
    }

    /// A truncate by path (no handle): a new version of the kept bytes.
    /// The inode takes it when nothing has it open; otherwise it keeps its
    /// version (its readers') and the next lookup gives the new one its
    /// own.
    fn truncate_path(
        mut self,
        path: &str,
        ino: u64,
        size: u64,
        by: u32,
    ) -> Result<FileAttr, c_int> {
        let (draft, base) = self.draft_of_current(path)?;
        let writer = Writer::new(path.to_owned(), ino, draft, false);
        let fh = self
            .st
            .handles
            .insert(Handle::Writer(Box::new(writer)), ino, false);
        let max = self.fs.max_file;
        let handle = self.st.handles.get(fh);
        let resized = match handle.as_deref() {
            Some(Handle::Writer(w)) => w.change(by, |d| d.truncate(self.fs, size, max)),
            _ => Err(libc::EBADF),
        };
        // The commit takes the writer and the client, not the state.
        drop(self.st);
        let result = resized.and_then(|()| self.fs.commit(FileHandle(fh), None));
        let mut st = lock(&self.fs.state);
        st.handles.remove(fh);
        let sealed = match handle.as_deref() {
            Some(Handle::Writer(w)) => lock(&w.info).sealed,
            _ => None,
        };
        if let (Ok(()), Some(v)) = (&result, sealed) {
            if let Some(node) = st.inodes.get_mut(ino) {
                let held_base = base.is_some_and(|b| node.content == Content::Version(b));
                if node.opens == 0 && held_base {
                    node.content = Content::Version(v);
                }
            }
        }
        drop(st);
        if let Some(Handle::Writer(w)) = handle.as_deref() {
            self.fs.finish_writer(w);
        }
        result?;
        Op::new(self.fs).getattr(ino)
    }
    fn rename_paths(&mut self, from: &str, to: &str, flags: RenameFlags) -> Result<(), c_int> {
        self.fs.check_alive()?;
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return Err(libc::EINVAL);
        }
        let source = self.node(from)?;
        let target = match self.node(to) {
            Ok(node) => Some(node),
            Err(libc::ENOENT) => None,
            Err(e) => return Err(e),
        };
        if flags.contains(RenameFlags::RENAME_NOREPLACE) && target.is_some() {
            return Err(libc::EEXIST);
        }
        match (&source, &target) {
            (Node::File { .. }, Some(Node::Dir)) => return Err(libc::EISDIR),
            (Node::Dir, Some(Node::File { .. })) => return Err(libc::ENOTDIR),
            (Node::Dir, Some(Node::Dir)) if !self.fs.list(to)?.is_empty() => {
                return Err(libc::ENOTEMPTY)
            }
            _ => {}
        }
        if matches!(source, Node::Dir) && names::is_under(to, from) {
            return Err(libc::EINVAL);
        }
        let stored = match source {
            Node::File { .. } => self.fs.resolve(from)?.is_some(),
            Node::Dir => !self.fs.list(from)?.is_empty(),
        };
        if stored {
            let renamed = lock(&self.fs.client).rename(from, to);
            renamed.map_err(|e| self.fs.fail(&e))?;
        }
        // Directories made here, writers and inode numbers follow.
        let made: Vec<String> = self
            .st
            .dirs
            .iter()
            .filter(|d| d.as_str() == from || names::is_under(d, from))
            .cloned()
            .collect();
        for d in made {
            self.st.dirs.remove(&d);
            self.st.dirs.insert(format!("{to}{}", &d[from.len()..]));
        }
        let moded: Vec<(String, u16)> = self
            .st
            .modes
            .iter()
            .filter(|(p, _)| p.as_str() == from || names::is_under(p, from))
            .map(|(p, &m)| (p.clone(), m))
            .collect();
        self.st.modes.remove(to);
        for (p, m) in moded {
            self.st.modes.remove(&p);
            self.st.modes.insert(format!("{to}{}", &p[from.len()..]), m);
        }
        self.st.dirs.remove(to);
        if matches!(source, Node::Dir) {
            self.st.dirs.insert(to.to_owned());
        }
        for writer in self.st.handles.writers() {
            let moved =
                |w: &crate::handles::WriterInfo| w.path == from || names::is_under(&w.path, from);
            if !moved(&lock(&writer.info)) {
                continue;
            }
            // Not while its commit binds the old name (state → draft → info).
            let _draft = lock(&writer.draft);
            let mut w = lock(&writer.info);
            if moved(&w) {
                w.path = format!("{to}{}", &w.path[from.len()..]);
            }
        }
        self.st.inodes.rename(from, to);
        Ok(())
    }

    /// The entries of directory `dir`: (name, kind), sorted.
    fn children(&self, dir: &str) -> Result<BTreeMap<String, FileType>, c_int> {
        let mut out = BTreeMap::new();
        let strip = |p: &str| -> Option<String> {
            if dir.is_empty() {
                Some(p.to_owned())
            } else {
                p.strip_prefix(dir)?.strip_prefix('/').map(str::to_owned)
            }
        };
        let mut add = |rest: String, is_file: bool| match rest.split_once('/') {
            Some((first, _)) => {
                out.insert(first.to_owned(), FileType::Directory);
            }
            None => {
                let kind = if is_file {
                    FileType::RegularFile
                } else {
                    FileType::Directory
                };
                out.entry(rest).or_insert(kind);
            }
        };
        for entry in self.fs.list(dir)? {
            if let Some(rest) = strip(&entry.name) {
                add(rest, true);
            }
        }
        for d in &self.st.dirs {
            if let Some(rest) = strip(d) {
                add(rest, false);
            }
        }
        for writer in self.st.handles.writers() {
            let w = lock(&writer.info);
            if !w.unlinked {
                if let Some(rest) = strip(&w.path) {
                    add(rest, true);
                }
            }
        }
        Ok(out)
    }
}

impl Filesystem for ShoalFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        configure_kernel(config, self.writeback_cache);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut op = Op::new(self);
        match op.child(parent, name).and_then(|p| op.lookup(&p)) {
            Ok((ino, attr)) => {
                op.st.inodes.looked_up(ino);
                reply.entry(&TTL, &op.moded(attr), Generation(0));
            }
            Err(e) => reply.error(errno_of(e)),
        }
    }

    // fuser's batch_forget calls this for each inode.
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        lock(&self.state).inodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut op = Op::new(self);
        match op.getattr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &op.moded(attr)),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = (|| {
            self.check_alive()?;
            let mut op = Op::new(self);
            let path = op.path_of(ino)?;
            op.set_owner_and_mode(ino.0, &path, mode, uid, gid)?;
            if let Some(mtime) = mtime {
                op.set_mtime(ino.0, &path, mtime)?;
            }
            let op = op;
            if let Some(size) = size {
                let max = self.max_file;
                let writer = fh
                    .and_then(|fh| op.st.handles.get(fh.0))
                    .filter(|h| matches!(h.as_ref(), Handle::Writer(_)));
                match writer.as_deref() {
                    Some(Handle::Writer(w)) => {
                        // Without the state: a truncate that grows the
                        // file may wait for room.
                        drop(op);
                        w.change(req.pid(), |d| d.truncate(self, size, max))?;
                        return Op::new(self).getattr(ino.0);
                    }
                    _ => {
                        // A truncate by path while writers have it open
                        // resizes what they will write.
                        let mut resized = false;
                        for writer in op.st.handles.writers() {
                            let open = {
                                let w = lock(&writer.info);
                                w.path == path && !w.unlinked
                            };
                            if open {
                                writer.change(req.pid(), |d| d.truncate(self, size, max))?;
                                resized = true;
                            }
                        }
                        if !resized {
                            return op.truncate_path(&path, ino.0, size, req.pid());
                        }
                    }
                }
            }
            let mut op = op;
            op.getattr(ino.0)
        })();
        match result {
            Ok(attr) => reply.attr(&TTL, &Op::new(self).moded(attr)),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let mut op = Op::new(self);
        let result = op.child(parent, name).and_then(|path| {
            match op.node(&path) {
                Ok(_) => return Err(libc::EEXIST),
                Err(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
            op.st.dirs.insert(path.clone());
            let ino = op.st.inodes.dir(&path);
            Ok((ino, self.attr(ino, &Node::Dir)))
        });
        match result {
            Ok((ino, attr)) => {
                op.st.inodes.looked_up(ino);
                reply.entry(&TTL, &attr, Generation(0));
            }
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut op = Op::new(self);
        let result = op.child(parent, name).and_then(|path| {
            self.check_alive()?;
            let mut open = false;
            for writer in op.st.handles.writers() {
                if lock(&writer.info).path != path {
                    continue;
                }
                // Not while its commit binds the name (state → draft → info).
                let _draft = lock(&writer.draft);
                let mut w = lock(&writer.info);
                if w.path == path {
                    w.unlinked = true;
                    open = true;
                }
            }
            let unlinked = lock(&self.client).unlink(&path);
            match unlinked {
                Ok(()) => {
                    op.st.inodes.unlinked(&path);
                    op.st.modes.remove(&path);
                    Ok(())
                }
                Err(err) if open && errno(&err) == libc::ENOENT => Ok(()),
                Err(err) => Err(self.fail(&err)),
            }
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut op = Op::new(self);
        let result = op.child(parent, name).and_then(|path| {
            match op.node(&path)? {
                Node::File { .. } => return Err(libc::ENOTDIR),
                Node::Dir => {}
            }
            if !op.children(&path)?.is_empty() {
                return Err(libc::ENOTEMPTY);
            }
            op.st.dirs.remove(&path);
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut op = Op::new(self);
        let result = op.child(parent, name).and_then(|from| {
            let to = op.child(newparent, newname)?;
            op.rename_paths(&from, &to, flags)
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let result = (|| {
            self.check_alive()?;
            let mut op = Op::new(self);
            let path = op.path_of(ino)?;
            if flags.acc_mode() == OpenAccMode::O_RDONLY {
                op.open_reader(ino.0)
            } else {
                // The kernel's entry for a name another client removed is
                // up to a TTL old: ESTALE makes it look the name up again,
                // and an O_CREAT open then creates the file.
                let node = op.node(&path).map_err(|e| match e {
                    libc::ENOENT => libc::ESTALE,
                    e => e,
                })?;
                if matches!(node, Node::Dir) {
                    return Err(libc::EISDIR);
                }
                let truncate = flags.0 & libc::O_TRUNC != 0;
                let fh = op.open_writer_handle(ino.0, req.pid(), truncate)?;
                let direct = matches!(
                    op.st.handles.get(fh).as_deref(),
                    Some(Handle::Writer(w)) if lock(&w.info).direct
                );
                let flags = if direct {
                    FopenFlags::FOPEN_DIRECT_IO
                } else {
                    FopenFlags::empty()
                };
                Ok((fh, flags))
            }
        })();
        match result {
            Ok((fh, open_flags)) => reply.opened(FileHandle(fh), open_flags),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let result = (|| {
            self.check_alive()?;
            let mut op = Op::new(self);
            let path = op.child(parent, name)?;
            let existing = match op.node(&path) {
                Ok(Node::Dir) => return Err(libc::EISDIR),
                Ok(Node::File { .. }) if flags & libc::O_EXCL != 0 => return Err(libc::EEXIST),
                Ok(Node::File { .. }) => true,
                Err(libc::ENOENT) => false,
                Err(e) => return Err(e),
            };
            // A new file is dirty from the start: closing it empty still
            // makes it exist.
            let truncate = !existing || flags & libc::O_TRUNC != 0;
            let (draft, base) = if truncate {
                (Draft::default(), None)
            } else {
                op.draft_of_current(&path)?
            };
            // An inode of its own: the kernel has none for the name (its
            // entry was negative), files open elsewhere keep theirs.
            let ino = op.st.inodes.fresh(&path, Content::Draft);
            let writer = Writer::new(path, ino, draft, truncate);
            {
                let mut info = lock(&writer.info);
                info.sealed = base;
                if truncate {
                    info.changers.changed_by(req.pid());
                }
                info.changers.opened_by(req.pid());
            }
            let fh = op.insert_open(Handle::Writer(Box::new(writer)), ino, true);
            let attr = op.getattr(ino)?;
            let attr = op.moded(attr);
            op.st.inodes.looked_up(ino);
            Ok((attr, fh))
        })();
        match result {
            Ok((attr, fh)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if let Err(e) = self.check_alive() {
            return reply.error(errno_of(e));
        }
        match self.handle(fh).as_deref() {
            Some(Handle::Reader(sealed)) => reply.data(slice_at(sealed.bytes(), offset, size)),
            Some(Handle::Writer(w)) => reply.data(slice_at(lock(&w.draft).bytes(), offset, size)),
            Some(Handle::Empty) => reply.data(&[]),
            None => reply.error(Errno::EBADF),
        }
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if let Err(e) = self.check_alive() {
            return reply.error(errno_of(e));
        }
        match self.handle(fh).as_deref() {
            Some(Handle::Writer(w)) => {
                match w.change(req.pid(), |d| d.write(self, offset, data, self.max_file)) {
                    Ok(n) => reply.written(n as u32),
                    Err(e) => reply.error(errno_of(e)),
                }
            }
            _ => reply.error(Errno::EBADF),
        }
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) hears this one: a full store is its ENOSPC. A close by a
        // process that did not write the file (a forked child's copy, closed
        // at its exec) commits nothing: writers.rs.
        match self.commit(fh, Some(req.pid())) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // The seal waits for the node's default durability.
        match self.commit(fh, None) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Writes after the last flush (a shared mmap written back late, or
        // a file whose writer's close came from another process).
        let result = self.commit(fh, None);
        let removed = lock(&self.state).handles.remove(fh.0);
        if let Some(open) = &removed {
            match open.handle.as_ref() {
                Handle::Reader(sealed) => self.release_object(sealed.id),
                Handle::Writer(writer) => self.finish_writer(writer),
                Handle::Empty => {}
            }
            self.closed(open);
        }
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let result = (|| {
            self.check_alive()?;
            let mut op = Op::new(self);
            let dir = op.path_of(ino)?;
            if !matches!(op.node(&dir)?, Node::Dir) {
                return Err(libc::ENOTDIR);
            }
            let children = op.children(&dir)?;
            let mut number = |path: &str| match op.st.inodes.current(path) {
                Some(ino) => ino,
                None => op.st.inodes.unkept_number(),
            };
            let parent = match dir.rsplit_once('/') {
                Some((up, _)) => number(up),
                None => INodeNo::ROOT.0,
            };
            let mut entries = vec![
                (ino.0, FileType::Directory, ".".to_owned()),
                (parent, FileType::Directory, "..".to_owned()),
            ];
            for (name, kind) in children {
                let path = if dir.is_empty() {
                    name.clone()
                } else {
                    format!("{dir}/{name}")
                };
                entries.push((number(&path), kind, name));
            }
            Ok(entries)
        })();
        match result {
            Ok(entries) => {
                let skip = usize::try_from(offset).unwrap_or(usize::MAX);
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(skip) {
                    if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        if let Err(e) = self.check_alive() {
            return reply.error(errno_of(e));
        }
        let stats = lock(&self.client).stats();
        match stats {
            Ok(s) => {
                let frsize = 4096u64;
                let blocks = s.capacity / frsize;
                let free = s.capacity.saturating_sub(s.used) / frsize;
                reply.statfs(
                    blocks,
                    free,
                    free,
                    s.objects,
                    u64::MAX / 2,
                    BLOCK,
                    names::MAX_COMPONENT as u32,
                    frsize as u32,
                );
            }
            Err(err) => reply.error(errno_of(self.fail(&err))),
        }
    }
}

//! The file system: names as files, name prefixes as directories.
//!
//! - lookup/getattr: a name bound in the store is a file (its size and seal
//!   time); a prefix of names, or a directory made by `mkdir` here, is a
//!   directory; a file being written here that has no version yet is a file
//!   of its buffer's size.
//! - open for reading: a reference to the object the name is bound to;
//!   reads are slices of the mapped region. FOPEN_KEEP_CACHE when the object
//!   is the one this inode's cache was filled from, so repeated reads (and
//!   mmap) are served by the kernel's page cache without a call here.
//! - open for writing / create: a draft (draft.rs): the bytes go straight
//!   into an unsealed store object that grows with the file, sealed under
//!   the name at flush (close), fsync and release.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
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
use crate::inodes::Inodes;
use crate::session::{configure_kernel, BLOCK};

/// How long the kernel may trust an answer about a name. Short: other
/// clients rename and rewrite names behind the mount's back.
const TTL: Duration = Duration::from_secs(1);
/// A draft's create waits for room this long at a time, letting go of its
/// connection in between.
const CREATE_WAIT_SLICE: Duration = Duration::from_millis(50);

/// What a path is.
enum Node {
    File { size: u64, mtime: SystemTime },
    Dir,
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
    /// Per inode, the object its page cache was filled from.
    cached: HashMap<u64, ObjectId>,
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

    fn attr(&self, ino: u64, node: &Node) -> FileAttr {
        let (kind, size, mtime, perm, nlink) = match *node {
            Node::File { size, mtime } => (FileType::RegularFile, size, mtime, 0o644, 1),
            Node::Dir => (FileType::Directory, 0, SystemTime::now(), 0o755, 2),
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
    fn commit(&self, fh: FileHandle) -> Result<(), c_int> {
        self.check_alive()?;
        let Some(handle) = self.handle(fh) else {
            return Ok(());
        };
        let Handle::Writer(writer) = handle.as_ref() else {
            return Ok(());
        };
        let mut draft = lock(&writer.draft);
        let (path, dirty, unlinked) = {
            let info = lock(&writer.info);
            (info.path.clone(), info.dirty, info.unlinked)
        };
        if !dirty || unlinked {
            return Ok(());
        }
        let id = draft.seal(self, &path)?;
        let (ino, shared) = {
            let mut info = lock(&writer.info);
            // A rename or unlink takes the draft first: not meanwhile.
            info.dirty = false;
            (info.ino, info.shared)
        };
        drop(draft);
        // The kernel's cache of this inode holds what was just written
        // (write-through): a reader may keep it, unless another writer's
        // bytes are in it too.
        let mut st = lock(&self.state);
        if shared {
            st.cached.remove(&ino);
        } else {
            st.cached.insert(ino, id);
        }
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

    /// The newest file written here for `path`, if a writer has it open:
    /// (its length, or a copy of its bytes with `copy`).
    fn open_writer(&self, path: &str, copy: bool) -> Option<(u64, Option<Vec<u8>>)> {
        let mut best: Option<(bool, u64, Option<Vec<u8>>)> = None;
        for writer in self.st.handles.writers() {
            let (dirty, len) = {
                let w = lock(&writer.info);
                if w.path != path || w.unlinked {
                    continue;
                }
                (w.dirty, w.len)
            };
            if best
                .as_ref()
                .is_none_or(|(was_dirty, ..)| dirty && !was_dirty)
            {
                // A copy waits for a write under way (rare: an open of a
                // file this mount is writing).
                let bytes = copy.then(|| lock(&writer.draft).bytes().to_vec());
                best = Some((dirty, len, bytes));
            }
        }
        best.map(|(_, len, bytes)| (len, bytes))
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

    fn node(&self, path: &str) -> Result<Node, c_int> {
        self.fs.check_alive()?;
        if let Some((size, _)) = self.open_writer(path, false) {
            return Ok(Node::File {
                size,
                mtime: SystemTime::now(),
            });
        }
        if !path.is_empty() {
            if let Some(entry) = self.fs.resolve(path)? {
                return Ok(Node::File {
                    size: entry.data_size,
                    mtime: UNIX_EPOCH + Duration::from_millis(entry.mtime_ms),
                });
            }
        }
        if self.is_dir(path)? {
            Ok(Node::Dir)
        } else {
            Err(libc::ENOENT)
        }
    }

    fn stat(&mut self, path: &str) -> Result<FileAttr, c_int> {
        let node = self.node(path)?;
        let ino = self.st.inodes.ino(path);
        Ok(self.fs.attr(ino, &node))
    }

    /// Whether a handle open for writing on this mount has inode `ino`.
    fn writing(&self, ino: u64) -> bool {
        self.st.handles.writers().any(|w| lock(&w.info).ino == ino)
    }

    /// Opens `path` for writing: its current bytes unless truncated (with
    /// the write-back cache, EBUSY while another handle writes it).
    fn open_writer_handle(&mut self, path: String, ino: u64, truncate: bool) -> Result<u64, c_int> {
        if self.fs.writeback_cache && self.writing(ino) {
            // The kernel writes cached pages back through any handle open
            // for writing on the inode: two writers' bytes would mix.
            return Err(libc::EBUSY);
        }
        let draft = if truncate {
            Draft::default()
        } else if let Some((_, Some(bytes))) = self.open_writer(&path, true) {
            Draft::from_bytes(self.fs, &bytes)?
        } else {
            self.draft_of_current(&path)?
        };
        let writer = Writer::new(path, ino, draft, truncate);
        for other in self.st.handles.writers() {
            let mut other = lock(&other.info);
            if other.ino == ino {
                other.shared = true;
                lock(&writer.info).shared = true;
            }
        }
        Ok(self.st.handles.insert(Handle::Writer(writer)))
    }

    /// A draft starting from the version bound to `path` (empty if none):
    /// a reference to it, taken on a drafts connection (the draft lets it
    /// go there), copied only when the file is changed.
    fn draft_of_current(&self, path: &str) -> Result<Draft, c_int> {
        let fs = self.fs;
        let conn = fs.next_draft();
        let mut client = lock(&fs.drafts[conn]);
        let (entry, located) = match client.get_named(path, 0) {
            Ok(got) => got,
            Err(err) if errno(&err) == libc::ENOENT && !daemon_gone(&err) => {
                return Ok(Draft::default())
            }
            Err(err) => {
                drop(client);
                return Err(fs.fail(&err));
            }
        };
        match client.located_ptr(located) {
            Ok(ptr) => {
                let held = Held { id: entry.id, conn };
                Ok(Draft::from_sealed(held, ptr, entry.data_size))
            }
            Err(err) => {
                let _ = client.release(&[entry.id]);
                drop(client);
                Err(fs.fail(&err))
            }
        }
    }

    /// Opens the object bound to `path` for reading; `keep_cache` when it
    /// is the one the inode's page cache holds.
    fn open_reader(&mut self, path: &str, ino: u64) -> Result<(u64, bool), c_int> {
        let mut client = lock(&self.fs.client);
        let (entry, located) = match client.get_named(path, 0) {
            Ok(got) => got,
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
        drop(client);
        // SAFETY: `ptr` is the object's data in our mapping, referenced by
        // the get above until the handle's release.
        let sealed = unsafe { Sealed::new(entry.id, ptr, entry.data_size as usize) };
        let keep = self.st.cached.insert(ino, entry.id) == Some(entry.id);
        Ok((self.st.handles.insert(Handle::Reader(sealed)), keep))
    }

    fn truncate_path(mut self, path: &str, ino: u64, size: u64) -> Result<(), c_int> {
        let fh = self.open_writer_handle(path.to_owned(), ino, false)?;
        let max = self.fs.max_file;
        let handle = self.st.handles.get(fh);
        let resized = match handle.as_deref() {
            Some(Handle::Writer(w)) => w.change(|d| d.truncate(self.fs, size, max)),
            _ => Err(libc::EBADF),
        };
        // The commit takes the writer and the client, not the state.
        drop(self.st);
        let result = resized.and_then(|()| self.fs.commit(FileHandle(fh)));
        lock(&self.fs.state).handles.remove(fh);
        if let Some(Handle::Writer(w)) = handle.as_deref() {
            self.fs.finish_writer(w);
        }
        result
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
        match op.child(parent, name).and_then(|p| op.stat(&p)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut op = Op::new(self);
        match op.path_of(ino).and_then(|p| op.stat(&p)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
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
            let op = Op::new(self);
            let path = op.path_of(ino)?;
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
                        w.change(|d| d.truncate(self, size, max))?;
                        return Op::new(self).stat(&path);
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
                                writer.change(|d| d.truncate(self, size, max))?;
                                resized = true;
                            }
                        }
                        if !resized {
                            op.truncate_path(&path, ino.0, size)?;
                            return Op::new(self).stat(&path);
                        }
                    }
                }
            }
            let mut op = op;
            op.stat(&path)
        })();
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
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
            op.stat(&path)
        });
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let op = Op::new(self);
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
                Ok(()) => Ok(()),
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

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let result = (|| {
            self.check_alive()?;
            let mut op = Op::new(self);
            let path = op.path_of(ino)?;
            if flags.acc_mode() == OpenAccMode::O_RDONLY {
                if let Some((_, Some(bytes))) = op.open_writer(&path, true) {
                    // Written here and not closed yet: read what it holds.
                    let fh = op.st.handles.insert(Handle::Snapshot(bytes));
                    return Ok((fh, FopenFlags::empty()));
                }
                let (fh, keep) = op.open_reader(&path, ino.0)?;
                let flags = if keep {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                Ok((fh, flags))
            } else {
                if matches!(op.node(&path)?, Node::Dir) {
                    return Err(libc::EISDIR);
                }
                let fh = op.open_writer_handle(path, ino.0, flags.0 & libc::O_TRUNC != 0)?;
                Ok((fh, FopenFlags::empty()))
            }
        })();
        match result {
            Ok((fh, open_flags)) => reply.opened(FileHandle(fh), open_flags),
            Err(e) => reply.error(errno_of(e)),
        }
    }

    fn create(
        &self,
        _req: &Request,
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
            let ino = op.st.inodes.ino(&path);
            // A new file is dirty from the start: closing it empty still
            // makes it exist.
            let truncate = !existing || flags & libc::O_TRUNC != 0;
            let fh = op.open_writer_handle(path.clone(), ino, truncate)?;
            let attr = op.stat(&path)?;
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
            Some(Handle::Snapshot(bytes)) => reply.data(slice_at(bytes, offset, size)),
            None => reply.error(Errno::EBADF),
        }
    }

    fn write(
        &self,
        _req: &Request,
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
                match w.change(|d| d.write(self, offset, data, self.max_file)) {
                    Ok(n) => reply.written(n as u32),
                    Err(e) => reply.error(errno_of(e)),
                }
            }
            _ => reply.error(Errno::EBADF),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) hears this one: a full store is its ENOSPC.
        match self.commit(fh) {
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
        match self.commit(fh) {
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
        // Writes after the last flush (a shared mmap written back late).
        let result = self.commit(fh);
        let removed = lock(&self.state).handles.remove(fh.0);
        match removed.as_deref() {
            Some(Handle::Reader(sealed)) => self.release_object(sealed.id),
            Some(Handle::Writer(writer)) => self.finish_writer(writer),
            Some(Handle::Snapshot(_)) | None => {}
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
            let parent = match dir.rsplit_once('/') {
                Some((up, _)) => op.st.inodes.ino(up),
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
                entries.push((op.st.inodes.ino(&path), kind, name));
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

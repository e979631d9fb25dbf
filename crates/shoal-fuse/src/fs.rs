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
//! - open for writing / create: a private buffer (handles.rs), written as a
//!   new object under the name at flush (close), fsync and release.
//!
//! Once the daemon is gone every operation answers EIO at once; the mount
//! itself is ended by `mount.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    consts, FileAttr, FileType, Filesystem, KernelConfig, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    FUSE_ROOT_ID,
};
use libc::c_int;
use shoal_client::{Client, NameEntry};
use shoal_core::error::ShoalError;
use shoal_core::names;
use shoal_core::ObjectId;

use crate::errno::{daemon_gone, errno};
use crate::handles::{slice_at, Handle, Handles, Sealed, Writer};
use crate::inodes::Inodes;

/// How long the kernel may trust an answer about a name. Short: other
/// clients rename and rewrite names behind the mount's back.
const TTL: Duration = Duration::from_secs(1);
/// st_blksize: programs (cp, dd without bs) size their I/O by it.
const BLOCK: u32 = 1 << 20;

/// What a path is.
enum Node {
    File { size: u64, mtime: SystemTime },
    Dir,
}

pub struct ShoalFs {
    client: Client,
    inodes: Inodes,
    handles: Handles,
    /// Directories made here by mkdir: a name prefix exists only while a
    /// name is under it, so empty directories live in the mount.
    dirs: BTreeSet<String>,
    /// Per inode, the object its page cache was filled from.
    cached: HashMap<u64, ObjectId>,
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
}

impl ShoalFs {
    pub fn new(client: Client, space_wait_ms: u32, alive: Arc<AtomicBool>) -> Self {
        let max_file = client.info().capacity;
        Self {
            client,
            inodes: Inodes::default(),
            handles: Handles::default(),
            dirs: BTreeSet::new(),
            cached: HashMap::new(),
            max_file,
            space_wait_ms,
            alive,
            // SAFETY: getuid/getgid cannot fail.
            uid: unsafe { libc::getuid() },
            // SAFETY: as above.
            gid: unsafe { libc::getgid() },
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

    fn path_of(&self, ino: u64) -> Result<String, c_int> {
        self.inodes.path(ino).map(str::to_owned).ok_or(libc::ENOENT)
    }

    /// The path of `name` in directory `parent`, checked as a name.
    fn child(&self, parent: u64, name: &OsStr) -> Result<String, c_int> {
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

    /// The newest buffer written here for `path`, if a writer has it open.
    fn open_writer(&self, path: &str) -> Option<&Writer> {
        self.handles
            .writers()
            .filter(|w| w.path == path && !w.unlinked)
            .max_by_key(|w| w.dirty)
    }

    fn resolve(&mut self, path: &str) -> Result<Option<NameEntry>, c_int> {
        match self.client.resolve(path) {
            Ok(entry) => Ok(Some(entry)),
            Err(err) if errno(&err) == libc::ENOENT && !daemon_gone(&err) => Ok(None),
            Err(err) => Err(self.fail(&err)),
        }
    }

    fn list(&mut self, dir: &str) -> Result<Vec<NameEntry>, c_int> {
        self.client.list_names(dir).map_err(|e| self.fail(&e))
    }

    fn is_dir(&mut self, path: &str) -> Result<bool, c_int> {
        if path.is_empty() || self.dirs.contains(path) {
            return Ok(true);
        }
        let made_under = self
            .dirs
            .range(format!("{path}/")..)
            .next()
            .is_some_and(|d| names::is_under(d, path));
        Ok(made_under || !self.list(path)?.is_empty())
    }

    fn node(&mut self, path: &str) -> Result<Node, c_int> {
        self.check_alive()?;
        if let Some(w) = self.open_writer(path) {
            return Ok(Node::File {
                size: w.buf.len() as u64,
                mtime: SystemTime::now(),
            });
        }
        if !path.is_empty() {
            if let Some(entry) = self.resolve(path)? {
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

    fn attr(&self, ino: u64, node: &Node) -> FileAttr {
        let (kind, size, mtime, perm, nlink) = match *node {
            Node::File { size, mtime } => (FileType::RegularFile, size, mtime, 0o644, 1),
            Node::Dir => (FileType::Directory, 0, SystemTime::now(), 0o755, 2),
        };
        FileAttr {
            ino,
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

    fn stat(&mut self, path: &str) -> Result<FileAttr, c_int> {
        let node = self.node(path)?;
        let ino = self.inodes.ino(path);
        Ok(self.attr(ino, &node))
    }

    /// Writes a writer's buffer as the name's new version.
    fn commit(&mut self, fh: u64) -> Result<(), c_int> {
        self.check_alive()?;
        let Some(Handle::Writer(w)) = self.handles.get(fh) else {
            return Ok(());
        };
        if !w.dirty || w.unlinked {
            return Ok(());
        }
        let (ino, shared) = (w.ino, w.shared);
        let result = self
            .client
            .put_named(&w.path, &w.buf, b"", None, self.space_wait_ms);
        match result {
            Ok(id) => {
                if let Some(Handle::Writer(w)) = self.handles.get_mut(fh) {
                    w.dirty = false;
                }
                // The kernel's cache of this inode holds what was just
                // written (write-through): a reader may keep it, unless
                // another writer's bytes are in it too.
                if shared {
                    self.cached.remove(&ino);
                } else {
                    self.cached.insert(ino, id);
                }
                Ok(())
            }
            Err(err) => Err(self.fail(&err)),
        }
    }

    /// Opens `path` for writing: its current bytes unless truncated.
    fn open_writer_handle(&mut self, path: String, ino: u64, truncate: bool) -> Result<u64, c_int> {
        let buf = if truncate {
            Vec::new()
        } else if let Some(w) = self.open_writer(&path) {
            w.buf.clone()
        } else {
            match self.client.get_named(&path, 0) {
                Ok((entry, located)) => {
                    let bytes = self.client.located_ptr(located).map(|ptr| {
                        // SAFETY: referenced (the get) until the release below.
                        unsafe { std::slice::from_raw_parts(ptr, entry.data_size as usize) }
                            .to_vec()
                    });
                    let _ = self.client.release(&[entry.id]);
                    bytes.map_err(|e| self.fail(&e))?
                }
                Err(err) if errno(&err) == libc::ENOENT && !daemon_gone(&err) => Vec::new(),
                Err(err) => return Err(self.fail(&err)),
            }
        };
        let mut writer = Writer::new(path, ino, buf, truncate);
        for other in self.handles.writers_mut().filter(|w| w.ino == ino) {
            other.shared = true;
            writer.shared = true;
        }
        Ok(self.handles.insert(Handle::Writer(writer)))
    }

    /// Opens the object bound to `path` for reading; `keep_cache` when it
    /// is the one the inode's page cache holds.
    fn open_reader(&mut self, path: &str, ino: u64) -> Result<(u64, bool), c_int> {
        let (entry, located) = self.client.get_named(path, 0).map_err(|e| self.fail(&e))?;
        let ptr = match self.client.located_ptr(located) {
            Ok(ptr) => ptr,
            Err(err) => {
                let _ = self.client.release(&[entry.id]);
                return Err(self.fail(&err));
            }
        };
        // SAFETY: `ptr` is the object's data in our mapping, referenced by
        // the get above until the handle's release.
        let sealed = unsafe { Sealed::new(entry.id, ptr, entry.data_size as usize) };
        let keep = self.cached.insert(ino, entry.id) == Some(entry.id);
        Ok((self.handles.insert(Handle::Reader(sealed)), keep))
    }

    fn truncate_path(&mut self, path: &str, ino: u64, size: u64) -> Result<(), c_int> {
        let fh = self.open_writer_handle(path.to_owned(), ino, false)?;
        let max = self.max_file;
        let resized = match self.handles.get_mut(fh) {
            Some(Handle::Writer(w)) => w.truncate(size, max),
            _ => unreachable!("just opened a writer"),
        };
        let result = resized.and_then(|()| self.commit(fh));
        self.handles.remove(fh);
        result
    }

    fn rename_paths(&mut self, from: &str, to: &str, flags: u32) -> Result<(), c_int> {
        self.check_alive()?;
        if flags & libc::RENAME_EXCHANGE != 0 {
            return Err(libc::EINVAL);
        }
        let source = self.node(from)?;
        let target = match self.node(to) {
            Ok(node) => Some(node),
            Err(libc::ENOENT) => None,
            Err(e) => return Err(e),
        };
        if flags & libc::RENAME_NOREPLACE != 0 && target.is_some() {
            return Err(libc::EEXIST);
        }
        match (&source, &target) {
            (Node::File { .. }, Some(Node::Dir)) => return Err(libc::EISDIR),
            (Node::Dir, Some(Node::File { .. })) => return Err(libc::ENOTDIR),
            (Node::Dir, Some(Node::Dir)) if !self.list(to)?.is_empty() => {
                return Err(libc::ENOTEMPTY)
            }
            _ => {}
        }
        if matches!(source, Node::Dir) && names::is_under(to, from) {
            return Err(libc::EINVAL);
        }
        let stored = match source {
            Node::File { .. } => self.resolve(from)?.is_some(),
            Node::Dir => !self.list(from)?.is_empty(),
        };
        if stored {
            self.client.rename(from, to).map_err(|e| self.fail(&e))?;
        }
        // Directories made here, writers and inode numbers follow.
        let made: Vec<String> = self
            .dirs
            .iter()
            .filter(|d| d.as_str() == from || names::is_under(d, from))
            .cloned()
            .collect();
        for d in made {
            self.dirs.remove(&d);
            self.dirs.insert(format!("{to}{}", &d[from.len()..]));
        }
        self.dirs.remove(to);
        if matches!(source, Node::Dir) {
            self.dirs.insert(to.to_owned());
        }
        for w in self.handles.writers_mut() {
            if w.path == from || names::is_under(&w.path, from) {
                w.path = format!("{to}{}", &w.path[from.len()..]);
            }
        }
        self.inodes.rename(from, to);
        Ok(())
    }

    /// The entries of directory `dir`: (name, kind), sorted.
    fn children(&mut self, dir: &str) -> Result<BTreeMap<String, FileType>, c_int> {
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
        for entry in self.list(dir)? {
            if let Some(rest) = strip(&entry.name) {
                add(rest, true);
            }
        }
        for d in &self.dirs {
            if let Some(rest) = strip(d) {
                add(rest, false);
            }
        }
        for w in self.handles.writers().filter(|w| !w.unlinked) {
            if let Some(rest) = strip(&w.path) {
                add(rest, true);
            }
        }
        Ok(out)
    }
}

impl Filesystem for ShoalFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), c_int> {
        // Large writes and read-ahead: a 1 MiB block is one request.
        let _ = config.set_max_write(BLOCK);
        let _ = config.set_max_readahead(BLOCK);
        let _ = config.add_capabilities(consts::FUSE_BIG_WRITES);
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name).and_then(|p| self.stat(&p)) {
            Ok(attr) => reply.entry(&TTL, &attr, 0),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.path_of(ino).and_then(|p| self.stat(&p)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let result = (|| {
            self.check_alive()?;
            let path = self.path_of(ino)?;
            if let Some(size) = size {
                let max = self.max_file;
                let writer =
                    fh.filter(|fh| matches!(self.handles.get(*fh), Some(Handle::Writer(_))));
                match writer {
                    Some(fh) => match self.handles.get_mut(fh) {
                        Some(Handle::Writer(w)) => w.truncate(size, max)?,
                        _ => unreachable!("filtered to writers"),
                    },
                    None => {
                        // A truncate by path while writers have it open
                        // resizes what they will write.
                        let mut resized = false;
                        for w in self.handles.writers_mut() {
                            if w.path == path && !w.unlinked {
                                w.truncate(size, max)?;
                                resized = true;
                            }
                        }
                        if !resized {
                            self.truncate_path(&path, ino, size)?;
                        }
                    }
                }
            }
            self.stat(&path)
        })();
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let result = self.child(parent, name).and_then(|path| {
            match self.node(&path) {
                Ok(_) => return Err(libc::EEXIST),
                Err(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
            self.dirs.insert(path.clone());
            self.stat(&path)
        });
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, 0),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let result = self.child(parent, name).and_then(|path| {
            self.check_alive()?;
            let mut open = false;
            for w in self.handles.writers_mut().filter(|w| w.path == path) {
                w.unlinked = true;
                open = true;
            }
            match self.client.unlink(&path) {
                Ok(()) => Ok(()),
                Err(err) if open && errno(&err) == libc::ENOENT => Ok(()),
                Err(err) => Err(self.fail(&err)),
            }
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let result = self.child(parent, name).and_then(|path| {
            match self.node(&path)? {
                Node::File { .. } => return Err(libc::ENOTDIR),
                Node::Dir => {}
            }
            if !self.children(&path)?.is_empty() {
                return Err(libc::ENOTEMPTY);
            }
            self.dirs.remove(&path);
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        let result = self.child(parent, name).and_then(|from| {
            let to = self.child(newparent, newname)?;
            self.rename_paths(&from, &to, flags)
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        let result = (|| {
            self.check_alive()?;
            let path = self.path_of(ino)?;
            if flags & libc::O_ACCMODE == libc::O_RDONLY {
                if let Some(w) = self.open_writer(&path) {
                    // Written here and not closed yet: read what it holds.
                    let buf = w.buf.clone();
                    let fh = self
                        .handles
                        .insert(Handle::Writer(Writer::new(path, ino, buf, false)));
                    return Ok((fh, 0));
                }
                let (fh, keep) = self.open_reader(&path, ino)?;
                Ok((fh, if keep { consts::FOPEN_KEEP_CACHE } else { 0 }))
            } else {
                if matches!(self.node(&path)?, Node::Dir) {
                    return Err(libc::EISDIR);
                }
                let fh = self.open_writer_handle(path, ino, flags & libc::O_TRUNC != 0)?;
                Ok((fh, 0))
            }
        })();
        match result {
            Ok((fh, open_flags)) => reply.opened(fh, open_flags),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let result = (|| {
            self.check_alive()?;
            let path = self.child(parent, name)?;
            let existing = match self.node(&path) {
                Ok(Node::Dir) => return Err(libc::EISDIR),
                Ok(Node::File { .. }) if flags & libc::O_EXCL != 0 => return Err(libc::EEXIST),
                Ok(Node::File { .. }) => true,
                Err(libc::ENOENT) => false,
                Err(e) => return Err(e),
            };
            let ino = self.inodes.ino(&path);
            // A new file is dirty from the start: closing it empty still
            // makes it exist.
            let truncate = !existing || flags & libc::O_TRUNC != 0;
            let fh = self.open_writer_handle(path.clone(), ino, truncate)?;
            let attr = self.stat(&path)?;
            Ok((attr, fh))
        })();
        match result {
            Ok((attr, fh)) => reply.created(&TTL, &attr, 0, fh, 0),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        if let Err(e) = self.check_alive() {
            return reply.error(e);
        }
        match self.handles.get(fh) {
            Some(Handle::Reader(sealed)) => reply.data(slice_at(sealed.bytes(), offset, size)),
            Some(Handle::Writer(w)) => reply.data(slice_at(&w.buf, offset, size)),
            None => reply.error(libc::EBADF),
        }
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        if let Err(e) = self.check_alive() {
            return reply.error(e);
        }
        let max = self.max_file;
        match self.handles.get_mut(fh) {
            Some(Handle::Writer(w)) if offset >= 0 => match w.write(offset as u64, data, max) {
                Ok(n) => reply.written(n as u32),
                Err(e) => reply.error(e),
            },
            Some(Handle::Writer(_)) => reply.error(libc::EINVAL),
            _ => reply.error(libc::EBADF),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _owner: u64, reply: ReplyEmpty) {
        // close(2) hears this one: a full store is its ENOSPC.
        match self.commit(fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // The seal waits for the node's default durability.
        match self.commit(fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Writes after the last flush (a shared mmap written back late).
        let result = self.commit(fh);
        match self.handles.remove(fh) {
            Some(Handle::Reader(sealed)) if self.alive.load(Ordering::SeqCst) => {
                if let Err(err) = self.client.release(&[sealed.id]) {
                    self.fail(&err);
                }
            }
            _ => {}
        }
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let result = (|| {
            self.check_alive()?;
            let dir = self.path_of(ino)?;
            if !matches!(self.node(&dir)?, Node::Dir) {
                return Err(libc::ENOTDIR);
            }
            let children = self.children(&dir)?;
            let parent = match dir.rsplit_once('/') {
                Some((up, _)) => self.inodes.ino(up),
                None => FUSE_ROOT_ID,
            };
            let mut entries = vec![
                (ino, FileType::Directory, ".".to_owned()),
                (parent, FileType::Directory, "..".to_owned()),
            ];
            for (name, kind) in children {
                let path = if dir.is_empty() {
                    name.clone()
                } else {
                    format!("{dir}/{name}")
                };
                entries.push((self.inodes.ino(&path), kind, name));
            }
            Ok(entries)
        })();
        match result {
            Ok(entries) => {
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(ino, i as i64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        if let Err(e) = self.check_alive() {
            return reply.error(e);
        }
        match self.client.stats() {
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
            Err(err) => reply.error(self.fail(&err)),
        }
    }
}

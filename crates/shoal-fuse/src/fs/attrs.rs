//! What a path or an inode is (a name's version, a file being written
//! here, a directory) and the attributes the kernel is told of it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};
use libc::c_int;
use shoal_client::NameEntry;
use shoal_core::names;

use super::op::{Node, Op};
use crate::handles::lock;
use crate::inodes::{Content, Version};
use crate::session::BLOCK;

/// Every file's and directory's mode (names have no mode of their own).
pub(super) const FILE_PERM: u16 = 0o644;
pub(super) const DIR_PERM: u16 = 0o755;

fn mtime_of(entry: &NameEntry) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(entry.mtime_ms)
}

pub(super) fn version_of(entry: &NameEntry) -> Version {
    Version {
        id: entry.id,
        size: entry.data_size,
        mtime: mtime_of(entry),
    }
}

impl Op<'_> {
    fn file_attr(&self, ino: u64, size: u64, mtime: SystemTime) -> FileAttr {
        self.attr(ino, &Node::File { size, mtime })
    }

    pub(super) fn attr(&self, ino: u64, node: &Node) -> FileAttr {
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
            uid: self.fs.uid,
            gid: self.fs.gid,
            rdev: 0,
            blksize: BLOCK,
            flags: 0,
        }
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

    pub(super) fn is_dir(&self, path: &str) -> Result<bool, c_int> {
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
    pub(super) fn node(&self, path: &str) -> Result<Node, c_int> {
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
    pub(super) fn lookup(&mut self, path: &str) -> Result<(u64, FileAttr), c_int> {
        self.fs.check_alive()?;
        if let Some(ino) = self.st.inodes.current(path) {
            match self.st.inodes.get(ino).map(|n| n.content) {
                Some(Content::Draft) => {
                    if let Some(len) = self.writer_len(ino) {
                        return Ok((ino, self.file_attr(ino, len, SystemTime::now())));
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
                return Ok((ino, self.file_attr(ino, version.size, version.mtime)));
            }
        }
        if self.is_dir(path)? {
            let ino = self.st.inodes.dir(path);
            return Ok((ino, self.attr(ino, &Node::Dir)));
        }
        Err(libc::ENOENT)
    }

    fn reserved_attr(&self, ino: u64, version: Option<Version>) -> FileAttr {
        match version {
            Some(v) => self.file_attr(ino, v.size, v.mtime),
            None => self.file_attr(ino, 0, SystemTime::now()),
        }
    }

    /// The attributes of inode `ino`: those of what it holds, so that the
    /// kernel's size of it stays its version's (files open on it read
    /// that version's pages up to that size).
    pub(super) fn getattr(&mut self, ino: u64) -> Result<FileAttr, c_int> {
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
                Ok(self.file_attr(ino, v.size, v.mtime))
            }
            Content::Draft if self.writer_len(ino).is_some() => {
                let (len, mtime) = self
                    .newest_writer_attrs(|w| w.ino == ino)
                    .unwrap_or((0, SystemTime::now()));
                Ok(self.file_attr(ino, len, mtime))
            }
            Content::Reserved { version, .. } => Ok(self.reserved_attr(ino, version)),
            Content::Dir | Content::Draft | Content::Stale => {
                let node = self.node(&path)?;
                Ok(self.attr(ino, &node))
            }
        }
    }

    /// `attr` with the mode chmod gave its name, if any.
    pub(super) fn moded(&self, mut attr: FileAttr) -> FileAttr {
        if let Some(path) = self.st.inodes.path(attr.ino.0) {
            if let Some(&perm) = self.st.modes.get(path) {
                attr.perm = perm;
            }
        }
        attr
    }
}

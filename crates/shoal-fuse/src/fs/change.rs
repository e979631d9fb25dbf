//! Changes to files and names: setattr's (owner and mode, modification
//! time, size), rename and unlink.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileHandle, RenameFlags, TimeOrNow};
use libc::c_int;
use shoal_core::names;

use super::attrs::{DIR_PERM, FILE_PERM};
use super::op::{Node, Op};
use crate::errno::errno;
use crate::handles::{lock, Handle, Writer};
use crate::inodes::Content;

impl Op<'_> {
    /// Files are owned by the mounting user: a change of owner is refused
    /// (EPERM), never answered with a success that changes nothing. A mode
    /// is kept by the mount, per name (rsync makes its files 0600 while
    /// writing them, then gives them the source's mode).
    pub(super) fn set_owner_and_mode(
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

    /// Sets the modification time of the file at `path` (inode `ino`):
    /// the name's, kept by the daemon. A file being written here takes it
    /// at its next seal (a write after it would set the seal time anyway).
    pub(super) fn set_mtime(
        &mut self,
        ino: u64,
        path: &str,
        mtime: TimeOrNow,
    ) -> Result<(), c_int> {
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

    /// Truncates the file at `path` (inode `ino`) to `size` for thread
    /// `by` (setattr's size): through handle `fh` when it is a writer's;
    /// else the writers here that have it open resize what they will
    /// write, or, with none, a new version of the kept bytes
    /// (`truncate_path`). Then the inode's attributes.
    pub(super) fn truncate(
        mut self,
        ino: u64,
        path: &str,
        size: u64,
        fh: Option<FileHandle>,
        by: u32,
    ) -> Result<FileAttr, c_int> {
        let fs = self.fs;
        let max = fs.max_file;
        let writer = fh
            .and_then(|fh| self.st.handles.get(fh.0))
            .filter(|h| matches!(h.as_ref(), Handle::Writer(_)));
        match writer.as_deref() {
            Some(Handle::Writer(w)) => {
                // Without the state: a truncate that grows the
                // file may wait for room.
                drop(self);
                w.change(by, |d| d.truncate(fs, size, max))?;
                return Op::new(fs).getattr(ino);
            }
            _ => {
                // A truncate by path while writers have it open
                // resizes what they will write.
                let mut resized = false;
                for writer in self.st.handles.writers() {
                    let open = {
                        let w = lock(&writer.info);
                        w.path == path && !w.unlinked
                    };
                    if open {
                        writer.change(by, |d| d.truncate(fs, size, max))?;
                        resized = true;
                    }
                }
                if !resized {
                    return self.truncate_path(path, ino, size, by);
                }
            }
        }
        self.getattr(ino)
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

    pub(super) fn rename_paths(
        &mut self,
        from: &str,
        to: &str,
        flags: RenameFlags,
    ) -> Result<(), c_int> {
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

    /// Unlinks the file at `path`: the name goes from the store; writers
    /// here that have it open write nothing when closed.
    pub(super) fn unlink(&mut self, path: &str) -> Result<(), c_int> {
        self.fs.check_alive()?;
        let mut open = false;
        for writer in self.st.handles.writers() {
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
        let unlinked = lock(&self.fs.client).unlink(path);
        match unlinked {
            Ok(()) => {
                self.st.inodes.unlinked(path);
                self.st.modes.remove(path);
                Ok(())
            }
            Err(err) if open && errno(&err) == libc::ENOENT => Ok(()),
            Err(err) => Err(self.fs.fail(&err)),
        }
    }
}

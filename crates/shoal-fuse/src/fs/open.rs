//! Opening files: a reader gets the name's version (through the page
//! cache when its inode holds that version), a writer a draft and an inode
//! of its own (ESTALE and a fresh inode when others have its inode open),
//! `create` a new file's writer.

use std::time::{Duration, Instant};

use fuser::{FileAttr, FopenFlags};
use libc::c_int;

use super::attrs::version_of;
use super::op::{Node, Op};
use crate::draft::{Draft, Held};
use crate::errno::{daemon_gone, errno};
use crate::handles::{lock, Handle, Sealed, Writer};
use crate::inodes::{Content, Version};

/// An open for writing this soon after a lookup answered with the inode is
/// not refused with ESTALE again (it may be the kernel's one retry).
const RETRY_WINDOW: Duration = Duration::from_millis(50);
/// How long an inode made for a writer's retry waits for it.
const RESERVED_FOR: Duration = Duration::from_secs(1);

impl Op<'_> {
    /// Whether a handle open for writing on this mount has inode `ino`.
    fn writing(&self, ino: u64) -> bool {
        self.st.handles.writers().any(|w| lock(&w.info).ino == ino)
    }

    /// Whether handles open for writing on `ino` exist and each was closed
    /// (a flush) since its last write: their releases are on the way.
    pub(super) fn writers_closing(&self, ino: u64) -> bool {
        let mut writers = self
            .st
            .handles
            .writers()
            .filter(|w| lock(&w.info).ino == ino)
            .peekable();
        writers.peek().is_some() && writers.all(|w| lock(&w.info).closing)
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

    /// Opens inode `ino` (at `path`) for writing by thread `opener`
    /// (`truncate`: `O_TRUNC`): its handle, and the flags the kernel is
    /// told (past the page cache when the writer writes around it).
    pub(super) fn open_writer(
        &mut self,
        ino: u64,
        path: &str,
        opener: u32,
        truncate: bool,
    ) -> Result<(u64, FopenFlags), c_int> {
        // The kernel's entry for a name another client removed is
        // up to a TTL old: ESTALE makes it look the name up again,
        // and an O_CREAT open then creates the file.
        let node = self.node(path).map_err(|e| match e {
            libc::ENOENT => libc::ESTALE,
            e => e,
        })?;
        if matches!(node, Node::Dir) {
            return Err(libc::EISDIR);
        }
        let fh = self.open_writer_handle(ino, opener, truncate)?;
        let direct = matches!(
            self.st.handles.get(fh).as_deref(),
            Some(Handle::Writer(w)) if lock(&w.info).direct
        );
        let flags = if direct {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        };
        Ok((fh, flags))
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

    /// Creates the file at `path` (`create`: an open with `O_CREAT`) for
    /// thread `creator`, `O_EXCL` and `O_TRUNC` as `excl` and `trunc`: a
    /// writer on an inode of its own. Its attributes (with its mode) and
    /// handle.
    pub(super) fn create(
        &mut self,
        path: String,
        excl: bool,
        trunc: bool,
        creator: u32,
    ) -> Result<(FileAttr, u64), c_int> {
        let existing = match self.node(&path) {
            Ok(Node::Dir) => return Err(libc::EISDIR),
            Ok(Node::File { .. }) if excl => return Err(libc::EEXIST),
            Ok(Node::File { .. }) => true,
            Err(libc::ENOENT) => false,
            Err(e) => return Err(e),
        };
        // A new file is dirty from the start: closing it empty still
        // makes it exist.
        let truncate = !existing || trunc;
        let (draft, base) = if truncate {
            (Draft::default(), None)
        } else {
            self.draft_of_current(&path)?
        };
        // An inode of its own: the kernel has none for the name (its
        // entry was negative), files open elsewhere keep theirs.
        let ino = self.st.inodes.fresh(&path, Content::Draft);
        let writer = Writer::new(path, ino, draft, truncate);
        {
            let mut info = lock(&writer.info);
            info.sealed = base;
            if truncate {
                info.changers.changed_by(creator);
            }
            info.changers.opened_by(creator);
        }
        let fh = self.insert_open(Handle::Writer(Box::new(writer)), ino, true);
        let attr = self.getattr(ino)?;
        let attr = self.moded(attr);
        self.st.inodes.looked_up(ino);
        Ok((attr, fh))
    }

    /// A draft starting from the version bound to `path` (empty if none),
    /// and that version: a reference to it, taken on a drafts connection
    /// (the draft lets it go there), copied only when the file is changed.
    pub(super) fn draft_of_current(&self, path: &str) -> Result<(Draft, Option<Version>), c_int> {
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
    pub(super) fn open_reader(&mut self, ino: u64) -> Result<(u64, FopenFlags), c_int> {
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
}

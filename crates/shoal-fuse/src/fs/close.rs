//! The end of writing and of open files: a writer's commit (its draft
//! sealed as the name's new version, at flush, fsync and release) and a
//! handle's release (what it held given back, its inode's opens counted
//! down).

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::FileHandle;
use libc::c_int;

use super::ShoalFs;
use crate::draft::Draft;
use crate::handles::{lock, Handle, Writer};
use crate::inodes::{Content, Version};

impl ShoalFs {
    /// Seals a writer's draft as the name's new version. Holds only the
    /// writer (and the client for each call): other files go on meanwhile.
    /// `closer`: the thread whose close(2) this is (a flush); it commits
    /// only what its process wrote (writers.rs).
    pub(super) fn commit(&self, fh: FileHandle, closer: Option<u32>) -> Result<(), c_int> {
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
    pub(super) fn finish_writer(&self, writer: &Writer) {
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

    /// The kernel's release of handle `fh` (the last close of its open
    /// file): what is left is committed, and the handle leaves the table,
    /// giving back what it held. The commit's result.
    pub(super) fn release_handle(&self, fh: FileHandle) -> Result<(), c_int> {
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
        result
    }
}

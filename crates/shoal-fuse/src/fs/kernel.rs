//! The kernel's entry points (`fuser::Filesystem`): each hands its request
//! to the operation that answers it (`Op`, or `ShoalFs` for a handle) and
//! replies with what that gives, or with its errno.

use std::ffi::OsStr;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    BsdFileFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};
use libc::c_int;
use shoal_core::names;

use super::op::Op;
use super::ShoalFs;
use crate::handles::{lock, slice_at, Handle};
use crate::session::{configure_kernel, BLOCK};

/// How long the kernel may trust an answer about a name. Short: other
/// clients rename and rewrite names behind the mount's back.
const TTL: Duration = Duration::from_secs(1);

/// How long an open for writing waits for another writer's handle to be
/// released before it is refused (EBUSY, with the write-back cache).
const RELEASE_WAIT: Duration = Duration::from_millis(200);

/// Replies with `errno`.
fn errno_of(e: c_int) -> Errno {
    Errno::from_i32(e)
}

/// A kernel reply that can answer with an errno (fuser's reply types each
/// have their own `error`, under no common trait).
trait Refuse {
    fn refuse(self, e: c_int);
}

macro_rules! refuse {
    ($($reply:ty),*) => {$(
        impl Refuse for $reply {
            fn refuse(self, e: c_int) {
                self.error(errno_of(e));
            }
        }
    )*};
}

refuse!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyEmpty,
    ReplyEntry,
    ReplyOpen,
    ReplyStatfs,
    ReplyWrite
);

/// Replies `ok` with the value `result` holds, or with its errno.
fn answer<R: Refuse, T>(reply: R, result: Result<T, c_int>, ok: impl FnOnce(R, T)) {
    match result {
        Ok(value) => ok(reply, value),
        Err(e) => reply.refuse(e),
    }
}

impl Filesystem for ShoalFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        configure_kernel(config, self.writeback_cache);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut op = Op::new(self);
        let result = op.child(parent, name).and_then(|p| op.lookup(&p));
        answer(reply, result, |reply, (ino, attr)| {
            op.st.inodes.looked_up(ino);
            reply.entry(&TTL, &op.moded(attr), Generation(0));
        });
    }

    // fuser's batch_forget calls this for each inode.
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        lock(&self.state).inodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut op = Op::new(self);
        let result = op.getattr(ino.0);
        answer(reply, result, |reply, attr| {
            reply.attr(&TTL, &op.moded(attr));
        });
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
            match size {
                Some(size) => op.truncate(ino.0, &path, size, fh, req.pid()),
                None => op.getattr(ino.0),
            }
        })();
        answer(reply, result, |reply, attr| {
            reply.attr(&TTL, &Op::new(self).moded(attr));
        });
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
        let result = op.child(parent, name).and_then(|path| op.mkdir(&path));
        answer(reply, result, |reply, (ino, attr)| {
            op.st.inodes.looked_up(ino);
            reply.entry(&TTL, &attr, Generation(0));
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut op = Op::new(self);
        let result = op.child(parent, name).and_then(|path| op.unlink(&path));
        answer(reply, result, |reply, ()| reply.ok());
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut op = Op::new(self);
        let result = op.child(parent, name).and_then(|path| op.rmdir(&path));
        answer(reply, result, |reply, ()| reply.ok());
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
        answer(reply, result, |reply, ()| reply.ok());
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let result = (|| {
            self.check_alive()?;
            let waited = Instant::now();
            loop {
                let mut op = Op::new(self);
                let path = op.path_of(ino)?;
                if flags.acc_mode() == OpenAccMode::O_RDONLY {
                    return op.open_reader(ino.0);
                }
                let truncate = flags.0 & libc::O_TRUNC != 0;
                match op.open_writer(ino.0, &path, req.pid(), truncate) {
                    // A writer's close returns before the kernel sends its
                    // RELEASE: a program that closes and opens again for
                    // writing would find its own old handle still writing.
                    // Wait for that release (another session thread takes
                    // it) before refusing a second writer; a writer still
                    // open is refused at once.
                    Err(libc::EBUSY)
                        if waited.elapsed() < RELEASE_WAIT && op.writers_closing(ino.0) =>
                    {
                        drop(op);
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    opened => return opened,
                }
            }
        })();
        answer(reply, result, |reply, (fh, open_flags)| {
            reply.opened(FileHandle(fh), open_flags);
        });
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
            let (excl, trunc) = (flags & libc::O_EXCL != 0, flags & libc::O_TRUNC != 0);
            op.create(path, excl, trunc, req.pid())
        })();
        answer(reply, result, |reply, (attr, fh)| {
            reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            );
        });
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
            return reply.refuse(e);
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
            return reply.refuse(e);
        }
        match self.handle(fh).as_deref() {
            Some(Handle::Writer(w)) => {
                let written = w.change(req.pid(), |d| d.write(self, offset, data, self.max_file));
                answer(reply, written, |reply, n| reply.written(n as u32));
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
        let closer = req.pid();
        let handle = self.handle(fh);
        let writer = match handle.as_deref() {
            Some(Handle::Writer(w)) => Some(w),
            _ => None,
        };
        // The opener's own close, not a forked child's copy closed at its
        // exec (which leaves the writer open), nor one whose process is
        // gone before its origin could be read.
        let own = writer.is_some_and(|w| lock(&w.info).changers.is_opener(closer));
        let committed = self.commit(fh, Some(closer));
        if let (Some(w), true) = (writer, own) {
            lock(&w.info).closing = true;
        }
        answer(reply, committed, |reply, ()| reply.ok());
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
        let committed = self.commit(fh, None);
        answer(reply, committed, |reply, ()| reply.ok());
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
        let released = self.release_handle(fh);
        answer(reply, released, |reply, ()| reply.ok());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let result = (|| {
            self.check_alive()?;
            Op::new(self).dir_entries(ino)
        })();
        answer(reply, result, |mut reply, entries| {
            let skip = usize::try_from(offset).unwrap_or(usize::MAX);
            for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(skip) {
                if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                    break;
                }
            }
            reply.ok();
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        if let Err(e) = self.check_alive() {
            return reply.refuse(e);
        }
        let stats = lock(&self.client).stats();
        let stats = stats.map_err(|err| self.fail(&err));
        answer(reply, stats, |reply, s| {
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
        });
    }
}

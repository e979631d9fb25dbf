//! The FUSE transport's ceiling on this kernel: a file system that does
//! the least any FUSE file system keeping its files in memory must do, and
//! nothing else. Each write copies its bytes once into memory that is
//! already faulted in; each read replies from such memory; files are names
//! and sizes in one flat directory. It runs with the same session threads,
//! mount options and kernel settings as `shoal mount` (`session.rs`).
//!
//! It keeps no file's contents (the bytes land in a per-thread scratch
//! arena and are overwritten), so it is a measuring instrument, not a
//! file system: `bench/fuse/fio_matrix.py` mounts it beside the store's
//! mount to tell what the kernel's FUSE path itself costs here from what
//! shoal adds (examples/fuse_ceiling.rs is its command).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::session::{configure_kernel, session_config, BLOCK};

/// Each session thread's scratch memory: as large as several requests, so
/// copies land in memory the size of a store's working set, not in cache.
const ARENA: usize = 64 << 20;
const TTL: Duration = Duration::from_secs(1);

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's arena, made and faulted in on first use.
fn with_arena<T>(f: impl FnOnce(&mut [u8]) -> T) -> T {
    SCRATCH.with(|cell| {
        let mut arena = cell.borrow_mut();
        if arena.is_empty() {
            // Touch every page now: the ceiling is not a page-fault benchmark.
            arena.resize(ARENA, 1);
        }
        f(&mut arena)
    })
}

/// The arena's range for `len` bytes at file offset `offset`.
fn arena_range(offset: u64, len: usize) -> std::ops::Range<usize> {
    let len = len.min(ARENA);
    let start = (offset % (ARENA - len + 1) as u64) as usize;
    start..start + len
}

#[derive(Default)]
struct Files {
    by_name: HashMap<String, u64>,
    /// ino → (name, size).
    by_ino: HashMap<u64, (String, u64)>,
    next_ino: u64,
}

impl Files {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = if ino == INodeNo::ROOT.0 {
            (FileType::Directory, 0, 0o755, 2)
        } else {
            let (_, size) = self.by_ino.get(&ino)?;
            (FileType::RegularFile, *size, 0o644, 1)
        };
        let now = SystemTime::now();
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind,
            perm,
            nlink,
            // SAFETY: getuid/getgid cannot fail.
            uid: unsafe { libc::getuid() },
            // SAFETY: as above.
            gid: unsafe { libc::getgid() },
            rdev: 0,
            blksize: BLOCK,
            flags: 0,
        })
    }

    fn create(&mut self, name: &str) -> u64 {
        if let Some(&ino) = self.by_name.get(name) {
            return ino;
        }
        self.next_ino = self.next_ino.max(INodeNo::ROOT.0) + 1;
        let ino = self.next_ino;
        self.by_name.insert(name.to_owned(), ino);
        self.by_ino.insert(ino, (name.to_owned(), 0));
        ino
    }
}

/// The ceiling's file system (see the module's doc).
pub struct CeilingFs {
    files: Mutex<Files>,
    writeback_cache: bool,
}

impl CeilingFs {
    pub fn new(writeback_cache: bool) -> Self {
        Self {
            files: Mutex::new(Files::default()),
            writeback_cache,
        }
    }

    fn files(&self) -> std::sync::MutexGuard<'_, Files> {
        crate::handles::lock(&self.files)
    }
}

/// Mounts the ceiling on `mountpoint` with `threads` session threads.
pub fn mount_ceiling(
    mountpoint: &Path,
    threads: usize,
    writeback_cache: bool,
) -> std::io::Result<BackgroundSession> {
    let config = session_config("shoal-ceiling", threads, false);
    fuser::spawn_mount(CeilingFs::new(writeback_cache), mountpoint, &config)
}

impl Filesystem for CeilingFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        configure_kernel(config, self.writeback_cache);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let files = self.files();
        let ino = (parent == INodeNo::ROOT)
            .then(|| name.to_str().and_then(|n| files.by_name.get(n)))
            .flatten();
        match ino.and_then(|&ino| files.attr(ino)) {
            Some(attr) => reply.entry(&TTL, &attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.files().attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
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
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut files = self.files();
        if let (Some(size), Some((_, now))) = (size, files.by_ino.get_mut(&ino.0)) {
            *now = size;
        }
        match files.attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
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
        let Some(name) = name.to_str().filter(|_| parent == INodeNo::ROOT) else {
            return reply.error(Errno::EINVAL);
        };
        let mut files = self.files();
        let ino = files.create(name);
        if flags & libc::O_TRUNC != 0 {
            if let Some((_, size)) = files.by_ino.get_mut(&ino) {
                *size = 0;
            }
        }
        match files.attr(ino) {
            Some(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(ino),
                FopenFlags::empty(),
            ),
            None => reply.error(Errno::EIO),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut files = self.files();
        match files.by_ino.get_mut(&ino.0) {
            Some((_, size)) => {
                if flags.0 & libc::O_TRUNC != 0 {
                    *size = 0;
                }
                reply.opened(FileHandle(ino.0), FopenFlags::empty())
            }
            None if ino == INodeNo::ROOT => reply.opened(FileHandle(0), FopenFlags::empty()),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(file_size) = self.files().by_ino.get(&ino.0).map(|&(_, s)| s) else {
            return reply.error(Errno::ENOENT);
        };
        let len = file_size.saturating_sub(offset).min(u64::from(size)) as usize;
        with_arena(|arena| reply.data(&arena[arena_range(offset, len)]));
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        with_arena(|arena| {
            let range = arena_range(offset, data.len());
            let n = range.len();
            arena[range].copy_from_slice(&data[..n]);
        });
        let end = offset.saturating_add(data.len() as u64);
        match self.files().by_ino.get_mut(&ino.0) {
            Some((_, size)) => {
                *size = (*size).max(end);
                reply.written(data.len() as u32)
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut files = self.files();
        let ino = (parent == INodeNo::ROOT)
            .then(|| name.to_str().and_then(|n| files.by_name.remove(n)))
            .flatten();
        match ino {
            Some(ino) => {
                files.by_ino.remove(&ino);
                reply.ok()
            }
            None => reply.error(Errno::ENOENT),
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
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let files = self.files();
        let mut entries = vec![
            (INodeNo::ROOT.0, FileType::Directory, ".".to_owned()),
            (INodeNo::ROOT.0, FileType::Directory, "..".to_owned()),
        ];
        let mut names: Vec<_> = files.by_name.iter().collect();
        names.sort();
        entries.extend(
            names
                .into_iter()
                .map(|(name, &ino)| (ino, FileType::RegularFile, name.clone())),
        );
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(skip) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = (64u64 << 30) / 4096;
        reply.statfs(blocks, blocks, blocks, 0, u64::MAX / 2, BLOCK, 255, 4096);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_ranges_stay_inside_and_keep_their_length() {
        assert_eq!(arena_range(0, 4096), 0..4096);
        for offset in [0, 1, ARENA as u64 - 1, ARENA as u64, u64::MAX] {
            for len in [0, 1, 4096, BLOCK as usize, ARENA, ARENA + 1] {
                let r = arena_range(offset, len);
                assert!(r.end <= ARENA, "{offset} {len} {r:?}");
                assert_eq!(r.len(), len.min(ARENA));
            }
        }
    }
}

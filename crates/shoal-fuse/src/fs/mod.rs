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
//!
//! Here: `ShoalFs`, its state and construction, and its calls to the
//! store. The rest, one thing a file: `drafts.rs` (where drafts get store
//! memory), `op.rs` (one metadata operation and the paths it names),
//! `attrs.rs` (what a path or an inode is, and its attributes), `dirs.rs`
//! (directories), `open.rs` (opening readers and writers), `close.rs`
//! (commits and the end of open files), `change.rs` (setattr's changes,
//! rename, unlink) and `kernel.rs` (the kernel's entry points).

mod attrs;
mod change;
mod close;
mod dirs;
mod drafts;
mod kernel;
mod op;
mod open;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use fuser::FileHandle;
use libc::c_int;
use shoal_client::{Client, NameEntry};
use shoal_core::error::ShoalError;
use shoal_core::region::Mapping;
use shoal_core::ObjectId;

use crate::errno::{daemon_gone, errno};
use crate::handles::{lock, Handle, Handles};
use crate::inodes::Inodes;

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

//! How a FUSE session is set up: mount options, session threads and what
//! the kernel is asked for at init. Shared by the store's file system
//! (`fs/`) and the transport's ceiling (`ceiling.rs`), so the two are
//! measured under the same settings.

use fuser::{InitFlags, KernelConfig, MountOption};

/// st_blksize, max_write and read-ahead: programs (cp, dd without bs) size
/// their I/O by st_blksize, and a 1 MiB block is one request.
pub const BLOCK: u32 = 1 << 20;

/// Two session threads per CPU, 4 to 16: a thread that is copying a reply
/// into the kernel or waiting for the daemon (a close waiting for memory or
/// durability) is not reading the next request, so one per CPU left small
/// writes of several programs queued (measured: 16 KiB random writes of 4
/// fio processes ~1.5x faster with 4 threads than with 2 on 2 CPUs).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| (2 * n.get()).clamp(4, 16))
}

/// The session: `threads` loops, each on its own clone of /dev/fuse.
pub fn session_config(fs_name: &str, threads: usize, allow_other: bool) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(fs_name.into()),
        MountOption::Subtype(fs_name.into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    config.n_threads = Some(threads.max(1));
    config.clone_fd = true;
    if allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config
}

/// Large writes and read-ahead, and the write-back cache when asked for
/// (logged and left off on a kernel without it).
pub fn configure_kernel(config: &mut KernelConfig, writeback_cache: bool) {
    let _ = config.set_max_write(BLOCK);
    let _ = config.set_max_readahead(BLOCK);
    let _ = config.add_capabilities(InitFlags::FUSE_BIG_WRITES);
    // An O_TRUNC open truncates in the open, not in a separate setattr by
    // path, which would reach every draft of the file open here: a file
    // another process still held open (a forked child's inherited copy)
    // was then committed empty at its release.
    if config
        .add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC)
        .is_err()
    {
        tracing::warn!("this kernel has no atomic O_TRUNC: truncating opens reach every writer");
    }
    if writeback_cache
        && config
            .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
            .is_err()
    {
        tracing::warn!("this kernel has no FUSE write-back cache: writes go through");
    }
}

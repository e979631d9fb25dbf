//! `shoal mount`'s arguments, apart from the FUSE view that reads them, so
//! that a build without it has the same command line.

use std::path::PathBuf;

/// Read by the FUSE view only.
#[derive(clap::Args, Debug)]
#[cfg_attr(not(feature = "fuse"), allow(dead_code))]
pub struct MountArgs {
    #[command(flatten)]
    pub socket: crate::args::SocketArg,
    /// An existing directory to mount on.
    pub mountpoint: PathBuf,
    /// Let other users use the mount (root, or `user_allow_other` in /etc/fuse.conf).
    #[arg(long)]
    pub allow_other: bool,
    /// How long a close waits for memory on a full store (the drain may free
    /// some) before it fails with ENOSPC, in ms.
    #[arg(long, default_value_t = 10_000)]
    pub space_wait_ms: u32,
    /// Session threads serving the mount (default: two per CPU, 4 to 16).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Let the kernel cache writes and hand them over in large batches
    /// (faster small writes; rules in docs/posix.md).
    #[arg(long)]
    pub writeback_cache: bool,
}

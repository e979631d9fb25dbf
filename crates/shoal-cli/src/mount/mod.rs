//! `shoal mount`: the store as a file system, in the foreground; `shoal
//! umount`. The FUSE view is the `fuse` feature: a build without it has the
//! same commands, which refuse, naming the feature.

use std::path::PathBuf;

#[cfg(feature = "fuse")]
mod fuse;
#[cfg(feature = "fuse")]
pub use fuse::{run, unmount};

#[cfg(not(feature = "fuse"))]
mod absent {
    use std::path::Path;

    /// Refuses: this build has no FUSE view.
    pub fn run(_args: super::MountArgs) -> anyhow::Result<()> {
        Err(crate::features::missing("fuse", "`shoal mount`"))
    }

    /// Refuses: this build has no FUSE view.
    pub fn unmount(_mountpoint: &Path) -> anyhow::Result<()> {
        Err(crate::features::missing("fuse", "`shoal umount`"))
    }
}
#[cfg(not(feature = "fuse"))]
pub use absent::{run, unmount};

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

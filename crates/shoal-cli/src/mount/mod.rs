//! `shoal mount`: the store as a file system, in the foreground; `shoal
//! umount`. The FUSE view is the `fuse` feature: a build without it has the
//! same commands, which refuse, naming the feature.

mod args;
pub use args::MountArgs;

#[cfg(feature = "fuse")]
mod fuse;
#[cfg(feature = "fuse")]
pub use fuse::{run, unmount};

#[cfg(not(feature = "fuse"))]
mod absent {
    use std::path::Path;

    /// Refuses: this build has no FUSE view.
    pub fn run(_args: super::args::MountArgs) -> anyhow::Result<()> {
        Err(crate::features::missing("fuse", "`shoal mount`"))
    }

    /// Refuses: this build has no FUSE view.
    pub fn unmount(_mountpoint: &Path) -> anyhow::Result<()> {
        Err(crate::features::missing("fuse", "`shoal umount`"))
    }
}
#[cfg(not(feature = "fuse"))]
pub use absent::{run, unmount};

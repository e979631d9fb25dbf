//! The POSIX view of a shoal store (`shoal mount`): names are files, name
//! prefixes are directories, through kernel FUSE with the `fuser` crate.
//! Design, semantics and limits: docs/posix.md.

mod ceiling;
mod draft;
mod errno;
mod fs;
mod handles;
mod inodes;
mod mount;
mod session;
mod writers;

pub use ceiling::{mount_ceiling, CeilingFs};
pub use mount::{mount, stop_on_signals, unmount, Ended, MountConfig, Mounted};
pub use session::default_threads;

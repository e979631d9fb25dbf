//! One metadata operation (`Op`): the mount's state locked for its whole
//! length, and the paths of the inodes it names. Also `Node`, what a path
//! is: attrs.rs answers it, the other parts act on it.

use std::ffi::OsStr;
use std::time::SystemTime;

use fuser::INodeNo;
use libc::c_int;
use shoal_core::names;

use super::{ShoalFs, State};
use crate::errno::errno;
use crate::handles::lock;

/// What a path is.
pub(super) enum Node {
    File { size: u64, mtime: SystemTime },
    Dir,
}

/// A metadata operation: the state locked for its whole length.
pub(super) struct Op<'a> {
    pub(super) fs: &'a ShoalFs,
    pub(super) st: std::sync::MutexGuard<'a, State>,
}

impl<'a> Op<'a> {
    pub(super) fn new(fs: &'a ShoalFs) -> Self {
        Self {
            fs,
            st: lock(&fs.state),
        }
    }

    pub(super) fn path_of(&self, ino: INodeNo) -> Result<String, c_int> {
        self.st
            .inodes
            .path(ino.0)
            .map(str::to_owned)
            .ok_or(libc::ENOENT)
    }

    /// The path of `name` in directory `parent`, checked as a name.
    pub(super) fn child(&self, parent: INodeNo, name: &OsStr) -> Result<String, c_int> {
        let dir = self.path_of(parent)?;
        let name = name.to_str().ok_or(libc::EINVAL)?;
        let path = if dir.is_empty() {
            name.to_owned()
        } else {
            format!("{dir}/{name}")
        };
        names::check(&path).map_err(|e| errno(&e))?;
        Ok(path)
    }
}

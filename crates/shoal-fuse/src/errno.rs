//! Store errors as the errno a program on the mount sees.

use libc::c_int;
use shoal_core::error::{ErrorKind, ShoalError};

/// The errno for `err`. Anything that means "the daemon is not there or
/// answered nonsense" is EIO, as a disk that went away.
pub fn errno(err: &ShoalError) -> c_int {
    match err.kind() {
        ErrorKind::ObjectNotFound => libc::ENOENT,
        // Only a rename of a directory onto a non-empty one says this.
        ErrorKind::ObjectExists => libc::ENOTEMPTY,
        ErrorKind::StoreFull => libc::ENOSPC,
        ErrorKind::ObjectTooLarge => libc::EFBIG,
        ErrorKind::InvalidArgument => libc::EINVAL,
        ErrorKind::NameTooLong => libc::ENAMETOOLONG,
        ErrorKind::PermissionDenied => libc::EACCES,
        ErrorKind::Timeout => libc::ETIMEDOUT,
        ErrorKind::ObjectInUse => libc::EBUSY,
        ErrorKind::ObjectNotSealed
        | ErrorKind::ObjectAlreadySealed
        | ErrorKind::NotOwner
        | ErrorKind::Protocol
        | ErrorKind::Io
        | ErrorKind::Disconnected
        | ErrorKind::VersionMismatch
        | ErrorKind::NodeUnavailable
        | ErrorKind::HomeUnavailable
        | ErrorKind::ObjectCorrupt => libc::EIO,
    }
}

/// Whether `err` means the daemon is gone: the mount answers EIO from now on.
pub fn daemon_gone(err: &ShoalError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Disconnected | ErrorKind::Io | ErrorKind::Protocol
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_errors_the_issue_names_map_as_promised() {
        let e = |kind| errno(&ShoalError::new(kind, "x"));
        assert_eq!(e(ErrorKind::StoreFull), libc::ENOSPC);
        assert_eq!(e(ErrorKind::ObjectTooLarge), libc::EFBIG);
        assert_eq!(e(ErrorKind::InvalidArgument), libc::EINVAL);
        assert_eq!(e(ErrorKind::NameTooLong), libc::ENAMETOOLONG);
        assert_eq!(e(ErrorKind::Disconnected), libc::EIO);
        assert!(daemon_gone(&ShoalError::new(ErrorKind::Disconnected, "x")));
        assert!(!daemon_gone(&ShoalError::new(ErrorKind::StoreFull, "x")));
    }
}

//! Why a local security check refused. Kept apart from the checks, with
//! no dependency of its own, so the crate's error type can convert it.

use std::path::PathBuf;

/// Why a local security check refused.
#[derive(Debug, thiserror::Error)]
pub enum LocalAuthError {
    /// A directory checked as trusted, one above it, or a symbolic link given as one,
    /// belongs to a user other than us and root; or a log file to a user other than us.
    #[error(
        "{path} is owned by uid {owner}, not by this user (uid {me}) or root: another user may \
         have made it to intercept the store; remove it or use another socket directory"
    )]
    ForeignOwner {
        /// The entry refused: a directory's resolved path, a link's or a log's as given.
        path: PathBuf,
        /// Its owner's uid.
        owner: u32,
        /// This process's effective uid.
        me: u32,
    },
    /// A directory checked as trusted (or one above it) that group or others may write,
    /// and not a root-owned sticky one (`/tmp`): another user could replace its entries.
    #[error(
        "{path} is writable by other users (mode {mode:o}), who could replace the store's socket \
         or plant links in it; run `chmod go-w {path}` or use another socket directory"
    )]
    WritableByOthers {
        /// The directory refused (resolved).
        path: PathBuf,
        /// Its permission bits (`mode & 0o7777`), shown in octal.
        mode: u32,
    },
    /// A path checked as a trusted directory names something else.
    #[error("{path} is not a directory")]
    NotADirectory {
        /// The path, resolved.
        path: PathBuf,
    },
    /// A log path is a symbolic link (`O_NOFOLLOW` refused it).
    #[error("{path} is a symbolic link; refusing to follow it (another user may have planted it)")]
    Symlink {
        /// The log's path as given.
        path: PathBuf,
    },
    /// A log path names something other than a regular file.
    #[error("{path} is not a regular file")]
    NotAFile {
        /// The log's path as given.
        path: PathBuf,
    },
    /// Client side: the daemon at the other end of the socket runs as another user than
    /// us or root (SO_PEERCRED).
    #[error(
        "the daemon on {socket} runs as uid {peer}, not as this user (uid {me}) or root: \
         refusing to hand it data (another user may be impersonating the store)"
    )]
    ForeignDaemon {
        /// The socket connected to.
        socket: PathBuf,
        /// The daemon's effective uid, as the kernel recorded it at connect.
        peer: u32,
        /// This process's effective uid.
        me: u32,
    },
    /// Daemon side: a client of a user the daemon does not serve (not its own user, root,
    /// or one of `--allow-uid`). The client is told in an `Error(PermissionDenied)` frame.
    #[error(
        "a client of uid {peer} is not allowed on this store (it runs as uid {me}; \
         `shoal serve --allow-uid {peer}` admits it)"
    )]
    ForeignClient {
        /// The client's effective uid, as the kernel recorded it at connect.
        peer: u32,
        /// The daemon's effective uid.
        me: u32,
    },
    /// SO_PEERCRED could not be read on the socket (an `Io` error, not a refusal).
    #[error("read the credentials of the socket's peer: {0}")]
    PeerCredentials(std::io::Error),
    /// A file-system call failed during a check (an `Io` error, not a refusal).
    #[error("{context} {path}: {source}")]
    Io {
        /// What was being done: `inspect`, `resolve`, `create`, `open`, `restrict`.
        context: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

//! Why a local security check refused. Kept apart from the checks, with
//! no dependency of its own, so the crate's error type can convert it.

use std::path::PathBuf;

/// Why a local security check refused.
#[derive(Debug, thiserror::Error)]
pub enum LocalAuthError {
    #[error(
        "{path} is owned by uid {owner}, not by this user (uid {me}) or root: another user may \
         have made it to intercept the store; remove it or use another socket directory"
    )]
    ForeignOwner { path: PathBuf, owner: u32, me: u32 },
    #[error(
        "{path} is writable by other users (mode {mode:o}), who could replace the store's socket \
         or plant links in it; run `chmod go-w {path}` or use another socket directory"
    )]
    WritableByOthers { path: PathBuf, mode: u32 },
    #[error("{path} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("{path} is a symbolic link; refusing to follow it (another user may have planted it)")]
    Symlink { path: PathBuf },
    #[error("{path} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error(
        "the daemon on {socket} runs as uid {peer}, not as this user (uid {me}) or root: \
         refusing to hand it data (another user may be impersonating the store)"
    )]
    ForeignDaemon { socket: PathBuf, peer: u32, me: u32 },
    #[error(
        "a client of uid {peer} is not allowed on this store (it runs as uid {me}; \
         `shoal serve --allow-uid {peer}` admits it)"
    )]
    ForeignClient { peer: u32, me: u32 },
    #[error("read the credentials of the socket's peer: {0}")]
    PeerCredentials(std::io::Error),
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

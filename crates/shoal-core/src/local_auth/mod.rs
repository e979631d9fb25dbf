//! Local access control: which users a store trusts on its own host.
//!
//! A store's socket grants read and write access to its whole region, so
//! both ends check who is on the other side (docs/security.md):
//!
//! - the directory a socket lives in (and every directory above it) must be
//!   one no other user can add, remove or rename entries in — owned by us or
//!   root and not writable by group or others, except root-owned sticky
//!   directories such as `/tmp` (the rule ssh-agent and tmux follow), so
//!   another user cannot squat the socket's name or plant a symbolic link
//!   for a log;
//! - a client refuses a daemon run by another user ([`check_daemon`]), and a
//!   daemon refuses clients of another user unless configured
//!   ([`admit_client`]), both through the kernel's SO_PEERCRED.
//!
//! Root counts as trusted everywhere: it can read and write any process's
//! memory anyway, so trusting it adds no exposure.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub mod error;

use crate::error::{ErrorKind, ShoalError};
use crate::protocol::Reply;

pub use error::LocalAuthError;

/// The superuser's uid.
pub const ROOT: u32 = 0;

/// A result whose error is a [`LocalAuthError`] unless said otherwise.
pub type Result<T, E = LocalAuthError> = std::result::Result<T, E>;

/// This process's effective uid: the owner of what it creates, and what
/// SO_PEERCRED reports of it to the other end of a socket.
pub fn my_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether `uid` may own what we rely on: ourselves or root.
pub fn is_trusted_uid(uid: u32) -> bool {
    uid == my_uid() || uid == ROOT
}

fn io_error(context: &'static str, path: &Path, source: std::io::Error) -> LocalAuthError {
    LocalAuthError::Io {
        context,
        path: path.to_path_buf(),
        source,
    }
}

/// Checks that only this user (and root) can change the entries of `dir` and
/// of every directory above it: each is owned by us or root and not writable
/// by group or others, except root-owned sticky directories (`/tmp`), where
/// nobody may remove or rename another user's entry. Every symbolic link on
/// the way, not only a last one, must be owned by us or root and sit in a
/// directory that passes the same rule: the path is resolved again at each
/// later use (bind, connect, open), and whoever could replace a link on it
/// could lead it elsewhere after the check.
pub fn check_trusted_dir(dir: &Path) -> Result<()> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let real = resolve_checking_links(dir)?;
    let meta = std::fs::metadata(&real).map_err(|e| io_error("inspect", &real, e))?;
    if !meta.is_dir() {
        return Err(LocalAuthError::NotADirectory { path: real });
    }
    // The directory itself, then each one above it: whoever may rename an
    // ancestor may swap the whole subtree.
    check_ancestors(&real)
}

/// Checks `real` (a path without symbolic links) and every directory above it.
fn check_ancestors(real: &Path) -> Result<()> {
    for path in real.ancestors() {
        let meta = std::fs::metadata(path).map_err(|e| io_error("inspect", path, e))?;
        check_dir_entry(path, meta.uid(), meta.mode())?;
    }
    Ok(())
}

/// Symbolic links followed at most while resolving a path (Linux's limit).
const MAX_LINKS: usize = 40;

/// `dir` resolved one component at a time, as the kernel does, into a path
/// without symbolic links; each link met on the way must be ours or root's,
/// in a directory that [`check_ancestors`] accepts.
fn resolve_checking_links(dir: &Path) -> Result<PathBuf> {
    let start = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        // The working directory as the kernel names it: no links in it.
        std::env::current_dir()
            .map_err(|e| io_error("resolve", dir, e))?
            .join(dir)
    };
    // Components still to resolve, the next one last.
    let mut pending: Vec<PathBuf> = start
        .components()
        .rev()
        .map(|c| PathBuf::from(c.as_os_str()))
        .collect();
    let mut real = PathBuf::from("/");
    let mut links = 0;
    while let Some(part) = pending.pop() {
        match part.to_str() {
            Some("/") => real = PathBuf::from("/"),
            Some(".") => {}
            // `real` has no links: its lexical parent is the real one.
            Some("..") => {
                real.pop();
            }
            _ => {
                let next = real.join(&part);
                let meta =
                    std::fs::symlink_metadata(&next).map_err(|e| io_error("inspect", &next, e))?;
                if !meta.file_type().is_symlink() {
                    real = next;
                    continue;
                }
                links += 1;
                if links > MAX_LINKS {
                    let looped = std::io::Error::from_raw_os_error(libc::ELOOP);
                    return Err(io_error("resolve", dir, looped));
                }
                if !is_trusted_uid(meta.uid()) {
                    return Err(LocalAuthError::ForeignOwner {
                        path: next,
                        owner: meta.uid(),
                        me: my_uid(),
                    });
                }
                // Whoever may change the link's directory may replace it.
                check_ancestors(&real)?;
                let target =
                    std::fs::read_link(&next).map_err(|e| io_error("resolve", &next, e))?;
                pending.extend(
                    target
                        .components()
                        .rev()
                        .map(|c| PathBuf::from(c.as_os_str())),
                );
            }
        }
    }
    Ok(real)
}

/// The rule [`check_trusted_dir`] applies to one directory.
fn check_dir_entry(path: &Path, owner: u32, mode: u32) -> Result<()> {
    if !is_trusted_uid(owner) {
        return Err(LocalAuthError::ForeignOwner {
            path: path.to_path_buf(),
            owner,
            me: my_uid(),
        });
    }
    let writable_by_others = mode & 0o022 != 0;
    let root_sticky = owner == ROOT && mode & libc::S_ISVTX != 0;
    if writable_by_others && !root_sticky {
        return Err(LocalAuthError::WritableByOthers {
            path: path.to_path_buf(),
            mode: mode & 0o7777,
        });
    }
    Ok(())
}

/// Creates `dir` (and missing parents) owner-only (0700) if it does not
/// exist, then checks it with [`check_trusted_dir`].
pub fn ensure_trusted_dir(dir: &Path) -> Result<()> {
    if !dir.as_os_str().is_empty() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io_error("create", dir, e))?;
    }
    check_trusted_dir(dir)
}

/// The socket `shoal serve` and `shoal.connect()` use when none is given:
/// `$XDG_RUNTIME_DIR/shoal/default.sock` when that directory is set and
/// trusted (ours, not writable by others), else `/tmp/shoal-$UID/default.sock`.
/// Either directory is checked again (and refused if another user made it)
/// before a daemon binds there.
pub fn default_socket() -> PathBuf {
    default_socket_dir().join("default.sock")
}

fn default_socket_dir() -> PathBuf {
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        if runtime.is_absolute() && check_trusted_dir(&runtime).is_ok() {
            return runtime.join("shoal");
        }
    }
    PathBuf::from(format!("/tmp/shoal-{}", my_uid()))
}

/// Makes sure the directory of `socket` exists and is trusted (see
/// [`ensure_trusted_dir`]) before a daemon binds or a client starts one there.
pub fn ensure_socket_dir(socket: &Path) -> Result<()> {
    ensure_trusted_dir(socket.parent().unwrap_or(Path::new(".")))
}

/// Opens the log at `path` for appending, creating it owner-only (0600).
/// Never follows a symbolic link (one planted there would make us append to
/// a file of its choosing) and refuses a file another user owns; an existing
/// log readable by others is made owner-only.
pub fn open_private_log(path: &Path) -> Result<File> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                LocalAuthError::Symlink {
                    path: path.to_path_buf(),
                }
            } else {
                io_error("open", path, e)
            }
        })?;
    let meta = file.metadata().map_err(|e| io_error("inspect", path, e))?;
    if !meta.is_file() {
        return Err(LocalAuthError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    if meta.uid() != my_uid() {
        return Err(LocalAuthError::ForeignOwner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            me: my_uid(),
        });
    }
    if meta.mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io_error("restrict", path, e))?;
    }
    Ok(file)
}

/// The effective uid of the process at the other end of a connected Unix
/// socket, as the kernel recorded it at connect (it cannot be forged).
pub fn peer_uid(socket: BorrowedFd<'_>) -> Result<u32> {
    nix::sys::socket::getsockopt(&socket, nix::sys::socket::sockopt::PeerCredentials)
        .map(|credentials| credentials.uid())
        .map_err(|errno| LocalAuthError::PeerCredentials(errno.into()))
}

/// Client side, right after connecting to `socket_path`: refuses a daemon
/// run by another user than us or root.
pub fn check_daemon(socket: BorrowedFd<'_>, socket_path: &Path) -> Result<()> {
    let peer = peer_uid(socket)?;
    if is_trusted_uid(peer) {
        Ok(())
    } else {
        Err(LocalAuthError::ForeignDaemon {
            socket: socket_path.to_path_buf(),
            peer,
            me: my_uid(),
        })
    }
}

/// Whether a daemon running as `me` serves a client running as `peer`:
/// its own user, root, and the uids it was configured to allow.
pub fn client_allowed(peer: u32, me: u32, allowed: &[u32]) -> bool {
    peer == me || peer == ROOT || allowed.contains(&peer)
}

/// Daemon side, on accept: refuses a client of a user the daemon does not
/// serve (see [`client_allowed`]). A refused client is told why in an error
/// frame (best effort, never blocking) before the caller drops it.
pub fn admit_client(socket: impl AsFd, allowed: &[u32]) -> Result<u32> {
    let fd = socket.as_fd();
    let peer = peer_uid(fd)?;
    let me = my_uid();
    if client_allowed(peer, me, allowed) {
        return Ok(peer);
    }
    let refusal = LocalAuthError::ForeignClient { peer, me };
    let mut frame = Vec::new();
    Reply::error(&ShoalError::new(
        ErrorKind::PermissionDenied,
        refusal.to_string(),
    ))
    .encode(&mut frame);
    // SAFETY: send reads `frame.len()` bytes of a live buffer from a
    // descriptor we borrow; MSG_DONTWAIT keeps a full socket from blocking
    // the accept loop, MSG_NOSIGNAL a closed one from raising SIGPIPE.
    unsafe {
        libc::send(
            fd.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        );
    }
    Err(refusal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    const NOBODY: u32 = 65534;

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().mode() & 0o7777
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Gives `path` to another user; only root may. `None` (with the reason
    /// printed) where the test cannot make a foreign-owned entry.
    fn give_away(path: &Path) -> Option<()> {
        if my_uid() != ROOT {
            eprintln!("skipped: making a file another user owns needs root");
            return None;
        }
        std::os::unix::fs::lchown(path, Some(NOBODY), Some(NOBODY)).unwrap();
        Some(())
    }

    #[test]
    fn a_private_directory_is_trusted() {
        let tmp = tempfile::tempdir().unwrap();
        chmod(tmp.path(), 0o700);
        check_trusted_dir(tmp.path()).unwrap();
        // Readable by others is fine: only who may change entries matters.
        chmod(tmp.path(), 0o755);
        check_trusted_dir(tmp.path()).unwrap();
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for mode in [0o777, 0o770, 0o707] {
            chmod(tmp.path(), mode);
            let err = check_trusted_dir(tmp.path()).unwrap_err();
            assert!(
                matches!(err, LocalAuthError::WritableByOthers { .. }),
                "{mode:o}: {err}"
            );
            assert!(err.to_string().contains(&tmp.path().display().to_string()));
        }
    }

    #[test]
    fn a_sticky_directory_is_trusted_only_when_root_owns_it() {
        // /tmp: root-owned, world-writable, sticky.
        check_trusted_dir(Path::new("/tmp")).unwrap();
        assert!(check_dir_entry(Path::new("/x"), ROOT, 0o41777).is_ok());
        if my_uid() != ROOT {
            let err = check_dir_entry(Path::new("/x"), my_uid(), 0o41777).unwrap_err();
            assert!(matches!(err, LocalAuthError::WritableByOthers { .. }));
        }
        let err = check_dir_entry(Path::new("/x"), ROOT, 0o40777).unwrap_err();
        assert!(matches!(err, LocalAuthError::WritableByOthers { .. }));
    }

    #[test]
    fn a_writable_ancestor_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        let inner = open.join("inner");
        std::fs::create_dir_all(&inner).unwrap();
        chmod(&open, 0o777);
        chmod(&inner, 0o700);
        match check_trusted_dir(&inner).unwrap_err() {
            LocalAuthError::WritableByOthers { path, .. } => {
                assert_eq!(path, open.canonicalize().unwrap())
            }
            err => panic!("{err}"),
        }
    }

    #[test]
    fn a_directory_another_user_owns_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let squatted = tmp.path().join("shoal-squatted");
        std::fs::create_dir(&squatted).unwrap();
        chmod(&squatted, 0o700);
        if give_away(&squatted).is_none() {
            return;
        }
        let err = check_trusted_dir(&squatted).unwrap_err();
        match &err {
            LocalAuthError::ForeignOwner { owner, .. } => assert_eq!(*owner, NOBODY),
            err => panic!("{err}"),
        }
        let text = err.to_string();
        assert!(
            text.contains("uid 65534") && text.contains("shoal-squatted"),
            "{text}"
        );
        // ensure_* never adopts it either.
        assert!(ensure_socket_dir(&squatted.join("default.sock")).is_err());
    }

    #[test]
    fn a_symlink_another_user_owns_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::create_dir(&target).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        // Our own link to our own directory is fine.
        check_trusted_dir(&link).unwrap();
        if give_away(&link).is_none() {
            return;
        }
        let err = check_trusted_dir(&link).unwrap_err();
        assert!(
            matches!(err, LocalAuthError::ForeignOwner { owner: NOBODY, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_symlink_anywhere_on_the_path_must_sit_in_a_trusted_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let safe = tmp.path().join("safe");
        std::fs::create_dir_all(safe.join("inner")).unwrap();
        chmod(&safe, 0o700);
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        let link = open.join("link");
        std::os::unix::fs::symlink(&safe, &link).unwrap();
        // Our own link to a private directory, in a directory anyone may
        // change: anyone may replace the link after the check, last on the
        // path or earlier.
        chmod(&open, 0o777);
        for dir in [link.clone(), link.join("inner")] {
            match check_trusted_dir(&dir).unwrap_err() {
                LocalAuthError::WritableByOthers { path, .. } => {
                    assert_eq!(path, open.canonicalize().unwrap())
                }
                err => panic!("{}: {err}", dir.display()),
            }
        }
        chmod(&open, 0o755);
        check_trusted_dir(&link).unwrap();
        check_trusted_dir(&link.join("inner")).unwrap();
        // Relative targets and `..` resolve as the kernel resolves them.
        let relative = open.join("relative");
        std::os::unix::fs::symlink("../safe/inner/..", &relative).unwrap();
        check_trusted_dir(&relative.join("inner")).unwrap();
        // A loop is an error, not a hang.
        std::os::unix::fs::symlink(open.join("b"), open.join("a")).unwrap();
        std::os::unix::fs::symlink(open.join("a"), open.join("b")).unwrap();
        let err = check_trusted_dir(&open.join("a")).unwrap_err();
        assert!(matches!(err, LocalAuthError::Io { .. }), "{err}");
    }

    #[test]
    fn a_missing_directory_is_created_owner_only() {
        let tmp = tempfile::tempdir().unwrap();
        // SAFETY: umask only changes this process's creation mask; tests in
        // this module create directories with explicit modes, so a race with
        // another test changes nothing they check.
        let old = unsafe { libc::umask(0o022) };
        let socket = tmp.path().join("a").join("b").join("default.sock");
        let result = ensure_socket_dir(&socket);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        result.unwrap();
        assert_eq!(mode_of(&tmp.path().join("a")), 0o700);
        assert_eq!(mode_of(&tmp.path().join("a").join("b")), 0o700);
        // An existing trusted directory is accepted as it is.
        ensure_socket_dir(&socket).unwrap();
    }

    #[test]
    fn a_socket_in_a_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("plain");
        std::fs::write(&file, b"").unwrap();
        let err = check_trusted_dir(&file).unwrap_err();
        assert!(matches!(err, LocalAuthError::NotADirectory { .. }), "{err}");
    }

    #[test]
    fn logs_are_created_owner_only() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("d.sock.log");
        let mut log = open_private_log(&path).unwrap();
        std::io::Write::write_all(&mut log, b"one\n").unwrap();
        assert_eq!(mode_of(&path), 0o600);
        // Appends; an old log readable by others is made private.
        chmod(&path, 0o644);
        let mut log = open_private_log(&path).unwrap();
        std::io::Write::write_all(&mut log, b"two\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
        assert_eq!(mode_of(&path), 0o600);
    }

    #[test]
    fn a_planted_log_symlink_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("precious");
        std::fs::write(&victim, b"keep me").unwrap();
        let path = tmp.path().join("d.sock.log");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let err = open_private_log(&path).unwrap_err();
        assert!(matches!(err, LocalAuthError::Symlink { .. }), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        // A dangling one would create the target: not either.
        let path = tmp.path().join("e.sock.log");
        std::os::unix::fs::symlink(tmp.path().join("created"), &path).unwrap();
        assert!(open_private_log(&path).is_err());
        assert!(!tmp.path().join("created").exists());
    }

    #[test]
    fn a_log_another_user_owns_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("d.sock.log");
        std::fs::write(&path, b"").unwrap();
        if give_away(&path).is_none() {
            return;
        }
        let err = open_private_log(&path).unwrap_err();
        assert!(
            matches!(err, LocalAuthError::ForeignOwner { owner: NOBODY, .. }),
            "{err}"
        );
    }

    #[test]
    fn the_peer_uid_is_the_connecting_process_s() {
        let (a, b) = UnixStream::pair().unwrap();
        assert_eq!(peer_uid(a.as_fd()).unwrap(), my_uid());
        check_daemon(b.as_fd(), Path::new("pair")).unwrap();
        assert_eq!(admit_client(&a, &[]).unwrap(), my_uid());
    }

    #[test]
    fn clients_of_other_users_need_to_be_allowed() {
        assert!(client_allowed(1000, 1000, &[]));
        assert!(client_allowed(ROOT, 1000, &[]));
        assert!(!client_allowed(1001, 1000, &[]));
        assert!(client_allowed(1001, 1000, &[1001]));
        assert!(!client_allowed(1002, 1000, &[1001]));
    }

    #[test]
    fn errors_are_permission_denied_with_the_path_and_owner() {
        let err: ShoalError = LocalAuthError::ForeignOwner {
            path: std::path::PathBuf::from("/tmp/shoal-1000"),
            owner: 1001,
            me: 1000,
        }
        .into();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(err.message().contains("/tmp/shoal-1000"));
        assert!(err.message().contains("uid 1001"));
    }
}

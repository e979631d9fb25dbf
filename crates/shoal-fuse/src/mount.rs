//! Mounting and unmounting, and ending the mount when its daemon goes.
//!
//! The session runs on fuser's background threads (`MountConfig::threads`). A watcher thread asks
//! the daemon for its stats every `watch_interval` on a connection of its
//! own; when that fails (or any operation on the mount sees the daemon
//! gone) every operation answers EIO at once and [`Mounted::wait`]
//! returns, so the caller unmounts. Unmounting is lazy (MNT_DETACH, or
//! `fusermount3 -u -z` without root): the mount point is free at once even
//! while programs still hold files open on it; those get EIO.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fuser::BackgroundSession;
use shoal_client::Client;
use shoal_core::error::{ErrorKind, Result, ShoalError};

use crate::fs::ShoalFs;
use crate::session::{default_threads, session_config};

#[derive(Debug, Clone)]
pub struct MountConfig {
    /// The daemon's socket.
    pub socket: PathBuf,
    pub mountpoint: PathBuf,
    /// Let other users use the mount (needs root or `user_allow_other` in
    /// /etc/fuse.conf).
    pub allow_other: bool,
    /// How long a close waits for memory on a full store before ENOSPC.
    pub space_wait_ms: u32,
    /// How often the watcher checks that the daemon is there.
    pub watch_interval: Duration,
    /// Session threads, each reading requests from its own clone of the
    /// /dev/fuse descriptor (so several programs' I/O runs at once).
    pub threads: usize,
    /// The kernel's write-back cache: writes land in the page cache and
    /// reach the mount in large batches (docs/posix.md, its rules).
    pub writeback_cache: bool,
}

impl MountConfig {
    pub fn new(socket: impl Into<PathBuf>, mountpoint: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            mountpoint: mountpoint.into(),
            allow_other: false,
            space_wait_ms: 10_000,
            watch_interval: Duration::from_millis(250),
            threads: default_threads(),
            writeback_cache: false,
        }
    }
}

/// Why [`Mounted::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The caller asked (a signal).
    Stopped,
    /// The daemon went away.
    DaemonGone,
    /// Someone unmounted it (`shoal umount`, `fusermount3 -u`).
    Unmounted,
}

/// A live mount; [`unmount`](Mounted::unmount) ends it.
pub struct Mounted {
    session: BackgroundSession,
    mountpoint: PathBuf,
    alive: Arc<AtomicBool>,
    stop_watching: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
}

/// Mounts the store of the daemon at `config.socket` on `config.mountpoint`.
pub fn mount(config: &MountConfig) -> Result<Mounted> {
    if !Path::new("/dev/fuse").exists() {
        return Err(ShoalError::new(
            ErrorKind::Io,
            "no /dev/fuse on this machine: load the fuse module (modprobe fuse) or run where FUSE is available",
        ));
    }
    let client = Client::connect(&config.socket)?;
    let mut watcher_client = Client::connect(&config.socket)?;
    let alive = Arc::new(AtomicBool::new(true));
    // One drafts connection per session thread, up to four (each maps the
    // region and holds a reference table at the daemon).
    let drafts = (0..config.threads.clamp(1, 4))
        .map(|_| Client::connect(&config.socket))
        .collect::<Result<Vec<_>>>()?;
    let fs = ShoalFs::new(
        client,
        drafts,
        config.space_wait_ms,
        alive.clone(),
        config.writeback_cache,
    );
    let fuse_config = session_config("shoal", config.threads, config.allow_other);
    let session = fuser::spawn_mount(fs, &config.mountpoint, &fuse_config)
        .map_err(|e| ShoalError::io(&format!("mount {} (FUSE)", config.mountpoint.display()), e))?;
    let stop_watching = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (alive, stop, every) = (alive.clone(), stop_watching.clone(), config.watch_interval);
        std::thread::Builder::new()
            .name("shoal-mount-watch".into())
            .spawn(move || {
                while !stop.load(Ordering::SeqCst) && alive.load(Ordering::SeqCst) {
                    if let Err(err) = watcher_client.stats() {
                        tracing::warn!(%err, "the daemon went away: ending the mount");
                        alive.store(false, Ordering::SeqCst);
                        break;
                    }
                    std::thread::sleep(every);
                }
            })
            .map_err(|e| ShoalError::io("start the mount's watcher thread", e))?
    };
    tracing::info!(mountpoint = %config.mountpoint.display(), "mounted");
    Ok(Mounted {
        session,
        mountpoint: config.mountpoint.clone(),
        alive,
        stop_watching,
        watcher: Some(watcher),
    })
}

impl Mounted {
    /// Blocks until `stop` is set, the daemon goes, or the mount is
    /// unmounted from outside.
    pub fn wait(&self, stop: &AtomicBool) -> Ended {
        loop {
            if stop.load(Ordering::SeqCst) {
                return Ended::Stopped;
            }
            if !self.alive.load(Ordering::SeqCst) {
                return Ended::DaemonGone;
            }
            if self.session.guard.is_finished() {
                return Ended::Unmounted;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts (lazily) and waits up to `grace` for the session to end.
    pub fn unmount(mut self, grace: Duration) -> Result<()> {
        self.stop_watching.store(true, Ordering::SeqCst);
        let result = if self.session.guard.is_finished() {
            Ok(())
        } else {
            unmount(&self.mountpoint)
        };
        let deadline = Instant::now() + grace;
        while !self.session.guard.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
        if result.is_ok() && self.session.guard.is_finished() {
            // Unmounted and served out: fuser's own unmount on drop would
            // only fail (and log an error) on the detached mount point.
            std::mem::forget(self.session);
        }
        result
    }
}

/// Unmounts a shoal mount lazily: the mount point is free at once.
pub fn unmount(mountpoint: &Path) -> Result<()> {
    let what = || format!("unmount {}", mountpoint.display());
    let path = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| ShoalError::invalid(format!("{}: path contains NUL", what())))?;
    // SAFETY: a valid NUL-terminated path; umount2 only reads it.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EPERM) {
        return Err(ShoalError::io(&what(), err));
    }
    // Not root: the setuid helper of Debian's fuse3.
    let status = std::process::Command::new("fusermount3")
        .args(["-u", "-z", "--"])
        .arg(mountpoint)
        .status()
        .map_err(|e| ShoalError::io(&format!("{} (run fusermount3)", what()), e))?;
    if status.success() {
        Ok(())
    } else {
        Err(ShoalError::new(
            ErrorKind::Io,
            format!("{}: fusermount3 -u failed ({status})", what()),
        ))
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// A flag set by SIGINT, SIGTERM or SIGHUP, for [`Mounted::wait`].
pub fn stop_on_signals() -> &'static AtomicBool {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(signal, on_signal as *const () as libc::sighandler_t) };
    }
    &STOP
}

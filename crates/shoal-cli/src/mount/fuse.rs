//! `shoal mount` and `shoal umount` through shoal-fuse (the `fuse` feature).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use shoal_fuse::{Ended, MountConfig};

use super::args::MountArgs;

/// Mounts and serves until stopped, unmounted or the daemon goes.
pub fn run(args: MountArgs) -> Result<()> {
    let mut config = MountConfig::new(args.socket.path(), &args.mountpoint);
    config.allow_other = args.allow_other;
    config.space_wait_ms = args.space_wait_ms;
    config.writeback_cache = args.writeback_cache;
    if let Some(threads) = args.threads {
        config.threads = threads;
    }
    let stop = shoal_fuse::stop_on_signals();
    let mounted = shoal_fuse::mount(&config)
        .with_context(|| format!("mount {}", args.mountpoint.display()))?;
    eprintln!(
        "shoal: {} mounted on {} (stop with Ctrl-C or `shoal umount`)",
        config.socket.display(),
        args.mountpoint.display()
    );
    let ended = mounted.wait(stop);
    mounted.unmount(Duration::from_secs(2))?;
    match ended {
        Ended::DaemonGone => anyhow::bail!(
            "the daemon at {} went away: unmounted {}",
            config.socket.display(),
            args.mountpoint.display()
        ),
        Ended::Stopped | Ended::Unmounted => Ok(()),
    }
}

/// Unmounts a `shoal mount` (lazily: the mount point is free at once).
pub fn unmount(mountpoint: &Path) -> Result<()> {
    shoal_fuse::unmount(mountpoint)?;
    Ok(())
}

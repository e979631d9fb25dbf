//! `shoal mount`: the store as a file system, in the foreground.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use shoal_fuse::{Ended, MountConfig};

#[derive(clap::Args, Debug)]
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

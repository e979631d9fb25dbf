//! `shoal top`: a live terminal view of a cluster's nodes (or of single
//! daemons), read from their `/metrics` once a second: memory, objects,
//! clients, operations and bytes sealed per second, the busiest clients and
//! the largest objects (from their `/top`), and each node's usage over the
//! last minutes as a sparkline. `q`, Esc or Ctrl-C quits.
//!
//! The terminal view is the `top` feature (ratatui, crossterm): a build
//! without it has the command, which refuses, naming the feature.

use std::net::SocketAddr;
use std::path::PathBuf;

#[cfg(feature = "top")]
mod terminal;
#[cfg(feature = "top")]
pub use terminal::run;

#[cfg(not(feature = "top"))]
mod absent {
    /// Refuses: this build has no terminal view.
    pub fn run(_args: super::TopArgs) -> anyhow::Result<()> {
        Err(crate::features::missing("top", "`shoal top`"))
    }
}
#[cfg(not(feature = "top"))]
pub use absent::run;

/// Read by the terminal view only.
#[derive(clap::Args, Debug)]
#[cfg_attr(not(feature = "top"), allow(dead_code))]
pub struct TopArgs {
    /// The cluster's directory (`cluster up --dir`) [default: cluster/ beside the default socket].
    #[arg(long)]
    pub(super) dir: Option<PathBuf>,
    /// A cluster file instead of a directory.
    #[arg(long, conflicts_with = "dir")]
    pub(super) file: Option<PathBuf>,
    /// Watch the daemon serving metrics at this address (repeatable)
    /// instead of a cluster's nodes (`shoal serve --metrics-addr`).
    #[arg(long = "metrics", value_name = "ADDRESS", conflicts_with_all = ["dir", "file"])]
    pub(super) addresses: Vec<SocketAddr>,
}

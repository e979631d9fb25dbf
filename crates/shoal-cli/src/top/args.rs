//! `shoal top`'s arguments, apart from the terminal view that reads them, so
//! that a build without it has the same command line.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Read by the terminal view only.
#[derive(clap::Args, Debug)]
#[cfg_attr(not(feature = "top"), allow(dead_code))]
pub struct TopArgs {
    /// The cluster's directory (`cluster up --dir`) [default: cluster/ beside the default socket].
    #[arg(long)]
    pub(in crate::top) dir: Option<PathBuf>,
    /// A cluster file instead of a directory.
    #[arg(long, conflicts_with = "dir")]
    pub(in crate::top) file: Option<PathBuf>,
    /// Watch the daemon serving metrics at this address (repeatable)
    /// instead of a cluster's nodes (`shoal serve --metrics-addr`).
    #[arg(long = "metrics", value_name = "ADDRESS", conflicts_with_all = ["dir", "file"])]
    pub(in crate::top) addresses: Vec<SocketAddr>,
}

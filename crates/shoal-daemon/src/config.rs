//! What a daemon serves. One typed struct; the CLI fills it from flags and
//! environment, libraries never read the environment themselves.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Unix socket clients connect to.
    pub socket: PathBuf,
    /// Region path. `None`: a fresh file in /dev/shm, removed on exit.
    /// `Some(path)`: an existing mmap-able path (hugetlbfs file, DAX device)
    /// used in place, or created if missing.
    pub region: Option<PathBuf>,
    /// Region length in bytes (also the largest capacity).
    pub region_size: u64,
    /// Bytes the store may use; defaults to the region size.
    pub capacity: Option<u64>,
    /// Objects are aligned and padded to this many bytes (64; 128 for POWER9 fabrics).
    pub line_size: u64,
    /// Eviction policy name (`lru`).
    pub policy: String,
    /// Fault the whole region in at start (in the background) so no client
    /// pays page faults on it.
    pub prefault: bool,
    /// Exit once no client has been connected for this long (the embedded
    /// store started by `shoal.connect()`); `None`: run until shut down.
    pub idle_exit: Option<Duration>,
    /// Stop cleanly on SIGINT/SIGTERM (the `shoal serve` process).
    pub stop_on_signals: bool,
    /// Run as one node of a cluster (`shoal serve --cluster FILE --node N`).
    pub cluster: Option<crate::cluster::ClusterConfig>,
    /// Users besides the daemon's own (and root) whose clients it serves
    /// (`shoal serve --allow-uid`); they also need access to the socket.
    pub allowed_uids: Vec<u32>,
    /// The tiers below memory (`None`: memory only; evicted objects are gone).
    pub tiers: Option<crate::tiers::TierConfig>,
    /// The elastic capacity controller (`shoal serve --elastic`): the store's
    /// capacity follows the node's free memory, with `capacity` as its
    /// ceiling. `None`: the capacity stays as configured.
    pub elastic: Option<crate::elastic::ElasticConfig>,
    /// Serve `/metrics` and the status page here (`shoal serve
    /// --metrics-addr`); `None`: no HTTP listener (metrics still counted).
    pub metrics: Option<std::net::SocketAddr>,
    /// Offer the fast path: sealed objects published in a shared index that
    /// clients read without a round trip (docs/fast-path.md). Off on a
    /// non-coherent cluster fabric, whatever this says.
    pub fast_reads: bool,
}

impl DaemonConfig {
    pub fn new(socket: impl Into<PathBuf>, region_size: u64) -> Self {
        Self {
            socket: socket.into(),
            region: None,
            region_size,
            capacity: None,
            line_size: 64,
            policy: "lru".into(),
            prefault: true,
            idle_exit: None,
            stop_on_signals: false,
            cluster: None,
            allowed_uids: Vec::new(),
            tiers: None,
            elastic: None,
            metrics: None,
            fast_reads: true,
        }
    }
}

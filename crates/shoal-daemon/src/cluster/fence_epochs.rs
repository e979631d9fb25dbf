//! The fence epochs a node keeps per peer (what `fencing.rs` acts on): a
//! leaf, so the cluster's state holds it without importing the behaviour.

use tokio::time::Instant;

/// Fence epochs, per node of the cluster.
#[derive(Debug)]
pub(crate) struct Fences {
    /// As an owner: how many times this node fenced each peer.
    pub given: Vec<u64>,
    /// As an owner: when each peer's quarantine began (`None`: none held).
    pub quarantined_since: Vec<Option<Instant>>,
    /// As a holder: the highest epoch each owner told this node.
    pub heard: Vec<u64>,
    /// As a holder: the epoch per owner up to which every fenced reference
    /// was let go (what heartbeats confirm).
    pub confirmed: Vec<u64>,
}

impl Fences {
    pub(crate) fn new(nodes: usize) -> Self {
        Self {
            given: vec![0; nodes],
            quarantined_since: vec![None; nodes],
            heard: vec![0; nodes],
            confirmed: vec![0; nodes],
        }
    }
}

//! One node of the cluster as `ClusterInfo` describes it.

/// One node as `ClusterInfo` describes it to a client on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRegion {
    pub node: u32,
    /// Its region can be mapped here (`false`: objects are pulled over the network).
    pub mapped: bool,
    pub alive: bool,
    pub region_size: u64,
    pub path: String,
}

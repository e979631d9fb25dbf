//! One node of the cluster as `ClusterInfo` describes it.

/// One node as `ClusterInfo` describes it to a client on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRegion {
    /// The node's id (0..n-1 in the cluster file): what `Objects` entries name.
    pub node: u32,
    /// Its region can be mapped here (`false`: objects are pulled over the network).
    pub mapped: bool,
    /// It answered the daemon's last heartbeat.
    pub alive: bool,
    /// Bytes of its region: the length to map, and the bound for offsets into it.
    pub region_size: u64,
    /// Its region file as seen from this host (a client maps it by path; its trailer carries
    /// the generation).
    pub path: String,
}

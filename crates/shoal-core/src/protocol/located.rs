//! Where a Get finds an object: the node whose region holds it, and where.

use crate::location::ObjectLocation;

/// An object as a Get answers it: which node's region holds it, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    /// The node whose region holds the object: the daemon's own (0 for a single daemon) or a
    /// peer's, mapped through `ClusterInfo`.
    pub node: u32,
    /// For an object on another node: the generation of that node's region
    /// (the incarnation of the daemon that answered), which the region file
    /// the client maps must carry. 0 for the daemon's own region.
    pub generation: u64,
    /// Where the object is in that node's region; the client checks it against the region's
    /// size before touching it.
    pub location: ObjectLocation,
    /// Set by the owner's daemon, on a non-coherent cluster, for an object of
    /// its own region that a client of another node wrote (remote
    /// allocation): this node's caches may still hold lines of that range
    /// from what it read or wrote there before, so a reader here must
    /// invalidate the range before its first read. Objects on other nodes
    /// never carry it: their readers always invalidate on such a fabric.
    pub invalidate: bool,
}

impl Located {
    /// An object in the daemon's own region (node `node`).
    pub fn local(node: u32, location: ObjectLocation) -> Self {
        Self {
            node,
            generation: 0,
            location,
            invalidate: false,
        }
    }
}

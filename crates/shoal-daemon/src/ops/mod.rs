//! The operations on objects, one file each, shared by everything that
//! serves requests: a local client's connection and a peer's calls run the
//! same create (with its wait for space), get, seal, abort, release,
//! delete and evict. Each works on the node, and on the cluster when this
//! daemon is a node of one.

mod abort;
mod create;
mod delete;
mod evict;
mod get;
mod pull;
mod release;
mod seal;

use std::rc::Rc;

use crate::cluster::Cluster;
use crate::node::Node;
use crate::supervisor::Supervisor;

pub struct Ops {
    pub node: Rc<Node>,
    /// This daemon as a node of a cluster (`None`: a single store).
    pub cluster: Option<Rc<Cluster>>,
    pub supervisor: Supervisor,
}

impl Ops {
    /// This node's id in its cluster (0 for a single store).
    pub fn me(&self) -> u32 {
        self.cluster.as_ref().map_or(0, |c| c.me)
    }
}

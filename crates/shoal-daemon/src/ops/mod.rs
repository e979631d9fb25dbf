//! The operations on objects, one file each, shared by everything that
//! serves requests: a local client's connection and a peer's calls run the
//! same create (with its wait for space), get (restoring from the tiers),
//! seal (with its durability), abort, resize, release, delete, evict, and the tier
//! operations (wait_durable, stage_in, stage_out). Each works on the node, and on the cluster when this
//! daemon is a node of one.

mod abort;
mod create;
mod delete;
mod durable;
mod evict;
mod get;
mod lent;
mod list;
mod names;
mod pull;
mod release;
mod resize;
mod restore;
mod seal;
mod stage;

use std::rc::{Rc, Weak};

use crate::cluster::Cluster;
use crate::elastic::Elastic;
use crate::node::Node;
use crate::supervisor::Supervisor;
use crate::tiers::Tiers;

pub(crate) struct Ops {
    pub node: Rc<Node>,
    /// This daemon as a node of a cluster (`None`: a single store).
    pub cluster: Option<Rc<Cluster>>,
    /// The tiers below memory (`None`: memory only, objects evicted are gone).
    pub tiers: Option<Rc<Tiers>>,
    /// The elastic capacity controller (`None`: a static capacity).
    pub elastic: Option<Rc<Elastic>>,
    pub supervisor: Supervisor,
    /// Itself, for tasks that outlive a request (restores).
    me: Weak<Ops>,
}

impl Ops {
    pub(crate) fn new(
        node: Rc<Node>,
        cluster: Option<Rc<Cluster>>,
        tiers: Option<Rc<Tiers>>,
        elastic: Option<Rc<Elastic>>,
        supervisor: Supervisor,
    ) -> Rc<Self> {
        Rc::new_cyclic(|me| Self {
            node,
            cluster,
            tiers,
            elastic,
            supervisor,
            me: me.clone(),
        })
    }

    fn rc(&self) -> Rc<Self> {
        self.me.upgrade().expect("ops outlive their requests")
    }

    /// This node's id in its cluster (0 for a single store).
    pub(crate) fn me(&self) -> u32 {
        self.cluster.as_ref().map_or(0, |c| c.me)
    }
}

//! What a node tells the subsystems that listen to it: the tiers, the
//! cluster, the capacity controller's prefetch and the metrics' counts. The
//! node calls its listeners; it never calls into a subsystem by name.

use shoal_core::event::ObjectEvent;
use shoal_core::ids::ClientId;
use shoal_store::store::{Verdict, Victim};

/// What listeners hear: what the store did to an object (the one event type
/// shared with the store and subscribers), or a change only the node sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeEvent {
    Object(ObjectEvent),
    /// A local client disconnected; its references here are already gone.
    ClientGone {
        client: ClientId,
    },
    CapacityChanged {
        capacity: u64,
    },
}

pub trait NodeListener {
    /// After a change, with the store free again: a listener may read or
    /// change the node (what it changes is told to every listener after
    /// this round). Never awaits: async work goes to the supervisor.
    fn on_event(&self, event: &NodeEvent);

    /// The store chose `victim` to leave memory; its bytes are still valid.
    /// `Hold` keeps its memory allocated until this listener calls
    /// `Node::finish_eviction` (a tier copying the bytes out). Called with
    /// the store borrowed: decide, never touch the node.
    fn on_evicting(&self, _victim: &Victim) -> Verdict {
        Verdict::Free
    }
}

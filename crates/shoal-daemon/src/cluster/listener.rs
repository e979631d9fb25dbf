//! What the cluster does when its node changes: ids evicted (with no tier
//! below to keep them) or aborted here leave their homes' directories, copies that went stop being copies, and
//! a local client that went gives back what it held on other nodes.
//! (Deletes unregister their ids themselves, after revoking loans and
//! before they answer: `ops::delete`.)

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use shoal_core::event::ObjectEvent;
use shoal_core::ObjectId;

use crate::cluster::state::Cluster;
use crate::node::{NodeEvent, NodeListener};

/// Weak: the node holds its listeners, and the cluster holds the node.
pub struct ClusterListener {
    cluster: Weak<Cluster>,
    /// Ids to unregister, sent as one batch by one task (an eviction of
    /// thousands of objects costs one call per home, not one per id).
    unregister: Rc<RefCell<Vec<ObjectId>>>,
}

impl ClusterListener {
    pub fn new(cluster: Weak<Cluster>) -> Self {
        Self {
            cluster,
            unregister: Rc::default(),
        }
    }

    fn unregister_later(&self, cluster: Rc<Cluster>, id: ObjectId) {
        let mut pending = self.unregister.borrow_mut();
        pending.push(id);
        if pending.len() > 1 {
            return; // the task spawned for the first one takes it too
        }
        let batch = self.unregister.clone();
        let supervisor = cluster.supervisor.clone();
        supervisor.spawn_local("unregister", async move {
            let ids = std::mem::take(&mut *batch.borrow_mut());
            cluster.unregister(&ids).await;
        });
    }
}

impl NodeListener for ClusterListener {
    fn on_event(&self, event: &NodeEvent) {
        let Some(cluster) = self.cluster.upgrade() else {
            return;
        };
        match *event {
            NodeEvent::Object(ObjectEvent::Removed { id, deleted }) => {
                let was_copy = !cluster.forget_copies(&[id]).is_empty();
                // (A copy was never registered: nothing to unregister. An
                // object evicted down a tier still lives here.)
                if !deleted && !was_copy && !cluster.node.held_below(&id) {
                    self.unregister_later(cluster, id);
                }
            }
            NodeEvent::Object(ObjectEvent::Aborted { id }) => {
                if cluster.is_stage(&id) {
                    return; // a staging buffer's id was never registered
                }
                cluster.forget_copies(&[id]);
                // (A restore that failed leaves the object on its tier.)
                if !cluster.node.held_below(&id) {
                    self.unregister_later(cluster, id);
                }
            }
            NodeEvent::ClientGone { client } => {
                let held = cluster.drop_client(client);
                cluster.peer_reads_gone(client);
                let supervisor = cluster.supervisor.clone();
                supervisor.spawn_local("client gone", async move {
                    // Aborted first: the creator's references go with the objects.
                    cluster.abort_creations_of(client).await;
                    cluster.release(held).await;
                });
            }
            NodeEvent::Object(ObjectEvent::Sealed { .. }) | NodeEvent::CapacityChanged { .. } => {}
        }
    }
}

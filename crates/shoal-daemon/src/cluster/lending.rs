//! As an owner: taking back the loans other nodes hold on this node's
//! objects (`loans` is the holder's side).
//!
//! - A delete revokes the loans of the deleted ids before it is answered
//!   and before the ids leave their homes' directories, so no get anywhere
//!   sees the old object once the delete returned, nor once the id was
//!   created anew.
//! - A create short of space asks the holders for their idle loans once
//!   before it waits (or fails): a loan is a reference, and referenced
//!   objects cannot be evicted.

use std::rc::Rc;

use shoal_core::ObjectId;

use super::peer_client;
use crate::server::Shared;

/// Nodes holding references here on `ids`, just deleted (node → ids). The
/// delete unregisters the ids after [`revoke`] (the store's removal event
/// of a delete unregisters nothing).
pub(crate) fn holders(shared: &Shared, ids: &[ObjectId]) -> Vec<(u32, Vec<ObjectId>)> {
    let Some(cluster) = &shared.cluster else {
        return Vec::new();
    };
    let store = shared.store.borrow();
    let mut out = Vec::new();
    for node in (0..cluster.topology.len() as u32).filter(|&n| n != cluster.me) {
        let client = peer_client(node);
        if !store.has_references(client) {
            continue;
        }
        let held: Vec<ObjectId> = ids
            .iter()
            .filter(|id| store.holds(client, id))
            .copied()
            .collect();
        if !held.is_empty() {
            out.push((node, held));
        }
    }
    out
}

/// Revokes the loans of deleted ids at the nodes holding references on them
/// ([`holders`]), and drops the references of the idle loans they gave up.
pub(crate) async fn revoke(shared: &Rc<Shared>, holders: Vec<(u32, Vec<ObjectId>)>) {
    let Some(cluster) = shared.cluster.clone() else {
        return;
    };
    if holders.is_empty() {
        return;
    }
    let given_up = cluster.revoke(holders).await;
    drop_given_up(shared, &given_up);
}

/// Asks the nodes holding references here to give up their idle loans;
/// returns whether any did (memory may be free now).
pub(crate) async fn take_back_idle(shared: &Rc<Shared>) -> bool {
    let Some(cluster) = shared.cluster.clone() else {
        return false;
    };
    let nodes: Vec<u32> = {
        let store = shared.store.borrow();
        (0..cluster.topology.len() as u32)
            .filter(|&n| n != cluster.me && store.has_references(peer_client(n)))
            .collect()
    };
    if nodes.is_empty() {
        return false;
    }
    let given_up = cluster.take_back_idle(nodes).await;
    drop_given_up(shared, &given_up);
    !given_up.is_empty()
}

/// The holders gave these loans up: their references here go.
fn drop_given_up(shared: &Shared, given_up: &[(u32, ObjectId)]) {
    if given_up.is_empty() {
        return;
    }
    {
        let mut store = shared.store.borrow_mut();
        for (node, id) in given_up {
            if let Err(err) = store.release(peer_client(*node), id) {
                tracing::debug!(node, %err, "loan given up, reference already gone");
            }
        }
    }
    shared.publish();
    shared.space.notify_waiters();
}

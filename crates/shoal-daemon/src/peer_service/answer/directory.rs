//! Calls on the home-node directory, and the heartbeats that carry a
//! peer's liveness, restarts and fencing.

use std::rc::Rc;

use shoal_cluster::proto::Statuses;
use shoal_core::error::ErrorKind;

use crate::cluster::Cluster;
use crate::peer_service::calls;

pub(super) fn heartbeat(cluster: &Rc<Cluster>, call: calls::Heartbeat) {
    // A restart first: it starts the peer's epochs again.
    cluster.heard_incarnation(call.from, call.incarnation);
    if let Some(in_touch) = call.membership_link {
        cluster.heard_membership_link(call.from, in_touch);
    }
    cluster.heard_fence(call.from, call.fence_epoch);
    cluster.fence_confirmed(call.from, call.fence_confirmed);
    let _ = call.reply.send(cluster.heartbeat_reply());
}

pub(super) fn register(cluster: &Rc<Cluster>, call: calls::Register) {
    // A restart of the owner is dealt with before it claims anything.
    cluster.heard_incarnation(call.owner, call.incarnation);
    let _ = call
        .reply
        .send(cluster.directory_register(&call.ids, call.owner));
}

/// A peer re-registers what it holds whose home is this (restarted) node.
pub(super) fn restore(cluster: &Rc<Cluster>, call: calls::Restore) {
    cluster.heard_incarnation(call.from, call.incarnation);
    let statuses = cluster.directory_restore(call.from, &call.sealed, &call.pending, &call.copies);
    let _ = call.reply.send(statuses);
}

pub(super) fn unregister(cluster: &Rc<Cluster>, call: calls::Unregister) {
    let stale = cluster.directory_unregister(&call.ids, call.owner);
    cluster.send_drops_later(stale);
}

/// Copies a peer made of objects homed here (after checking them).
pub(super) fn cached(cluster: &Rc<Cluster>, call: calls::Cached) {
    let accepted =
        cluster.directory_add_checked_copies(&call.ids, call.owner, &call.locations, call.from);
    let codes = accepted
        .into_iter()
        .map(|ok| {
            if ok {
                0
            } else {
                ErrorKind::ObjectNotFound.code() as u32
            }
        })
        .collect();
    let _ = call.reply.send(Statuses { codes });
}

pub(super) fn publish(cluster: &Rc<Cluster>, call: calls::Publish) {
    cluster.directory_publish(&call.ids, &call.locations, call.owner);
    let _ = call.reply.send(());
}

/// Refused while this node's directory is being rebuilt.
pub(super) fn lookup(cluster: &Rc<Cluster>, call: calls::Lookup) {
    let answer = cluster
        .local_lookup(&call.ids)
        .map_err(|e| tonic::Status::unavailable(e.message()));
    let _ = call.reply.send(answer);
}

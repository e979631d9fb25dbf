//! References peers take and drop on objects here, the loans of idle
//! objects (revoked, given back, copies dropped), and peers' fast-path
//! reads of this node's memory.

use std::rc::Rc;

use shoal_cluster::ids::{push_location, LOCATION_RECORD};
use shoal_cluster::proto::AcquireReply;

use crate::cluster::Cluster;
use crate::ops::Ops;
use crate::peer_service::calls;
use crate::principals;

/// Takes references for the peer on the ids in memory here; ids held only
/// on a tier are restored in the background and found when it asks again.
pub(super) fn acquire(ops: &Rc<Ops>, cluster: &Rc<Cluster>, call: calls::Acquire) {
    let calls::Acquire {
        ids,
        from,
        incarnation,
        seq,
        settled,
        reply,
    } = call;
    // References are taken for an incarnation this node has recorded: a
    // later restart of the caller then drops them.
    cluster.heard_incarnation(from, incarnation);
    cluster.peers.touch(from);
    // A copy of a call applied or undone already takes nothing.
    let admitted = cluster.admit_acquire(from, seq, settled);
    let client = principals::peer(from);
    let mut entries = Vec::with_capacity(ids.len() * LOCATION_RECORD);
    let mut below = Vec::new();
    let mut taken = Vec::new();
    if admitted {
        ops.node.mutate(|store| {
            for id in &ids {
                let location = store.get(client, id);
                if location.is_some() {
                    taken.push(*id);
                } else if ops.node.held_below(id) {
                    below.push(*id);
                }
                push_location(&mut entries, location);
            }
        });
        cluster.acquired(from, seq, taken);
    } else {
        for _ in &ids {
            push_location(&mut entries, None);
        }
    }
    if !below.is_empty() {
        ops.restore_in_background(below);
    }
    let _ = reply.send(AcquireReply {
        entries,
        incarnation: cluster.incarnation,
        revokes: cluster.revokes_sent(),
        fence_epoch: cluster.fence_epoch_for(from),
    });
}

/// Drops the peer's references, unless the call was meant for a previous
/// incarnation of this node or sent before this node fenced the peer.
pub(super) fn release(ops: &Ops, cluster: &Rc<Cluster>, call: calls::Release) {
    let calls::Release {
        ids,
        from,
        fence_epoch,
        seq,
        settled,
        undo,
        callee_incarnation,
    } = call;
    if callee_incarnation != 0 && callee_incarnation != cluster.incarnation {
        // Meant for a previous incarnation: its references are gone.
        tracing::debug!(from, "ignored a release meant for a previous incarnation");
    } else if cluster.release_counts(from, fence_epoch) {
        let (apply, undone) = cluster.ledger_release(from, seq, settled, &undo);
        if apply {
            ops.release(principals::peer(from), &ids);
        }
        if !undone.is_empty() {
            tracing::info!(
                from,
                references = undone.len(),
                "dropped the references of acquires whose answers the caller never got"
            );
            ops.release(principals::peer(from), &undone);
        }
    } else {
        // Sent before this node fenced `from`: those references are in
        // quarantine, and one `from` took since must stay.
        tracing::debug!(
            from,
            count = ids.len(),
            "ignored a release from before a fence"
        );
    }
}

/// The owner deleted these ids: stop lending them.
pub(super) fn revoke(cluster: &Rc<Cluster>, call: calls::Revoke) {
    let _ = call
        .reply
        .send(cluster.revoked(call.from, call.number, &call.ids));
}

/// The owner is short of space: give up idle loans.
pub(super) fn give_back(cluster: &Rc<Cluster>, call: calls::GiveBack) {
    let _ = call.reply.send(cluster.give_back_idle(call.from));
}

pub(super) fn drop_copies(ops: &Ops, cluster: &Rc<Cluster>, call: calls::Drop) {
    let cluster = cluster.clone();
    ops.supervisor.spawn_local("drop copies", async move {
        cluster.drop_copies(&call.ids).await;
    });
}

/// A peer's client counts references here.
pub(super) fn attach_reads(cluster: &Rc<Cluster>, call: calls::AttachReads) {
    let answer = cluster.attach_reads(call.from, call.incarnation, call.table, call.key);
    let _ = call.reply.send(answer);
}

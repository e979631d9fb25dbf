//! Answers peer calls on the store thread, with the same operations local
//! clients use (`ops`) and the cluster's own state. [`answer`] only
//! dispatches; each call has its function, in a file per concern:
//!
//! - `directory.rs`: the home-node directory (register, unregister,
//!   publish, lookup, cached copies, a restarted home's restore) and the
//!   heartbeats that carry liveness and fencing;
//! - `references.rs`: references peers take and drop here, the loans of
//!   idle objects (revoke, give back, drop copies), peers' fast-path reads;
//! - `objects.rs`: objects peers allocate, seal, abort and delete here, and
//!   this node's status and list;
//! - `names.rs`: this node's part of the cluster's namespace;
//! - `outcome.rs`: errors as the peer protocol carries them.
//!
//! Calls that wait (for peers, or for space) run as their own task; the
//! rest are answered before the next call is read.

mod directory;
mod names;
mod objects;
mod outcome;
mod references;

use std::rc::Rc;

use crate::ops::Ops;
use crate::peer_service::calls::PeerCall;

/// Answers one call.
pub(super) fn answer(ops: &Rc<Ops>, call: PeerCall) {
    let cluster = ops
        .cluster
        .as_ref()
        .expect("peer calls only in cluster mode");
    match call {
        PeerCall::Heartbeat(call) => directory::heartbeat(cluster, call),
        PeerCall::Register(call) => directory::register(cluster, call),
        PeerCall::Restore(call) => directory::restore(cluster, call),
        PeerCall::Restored(call) => cluster.restored_by(call.from, call.incarnation, call.epoch),
        PeerCall::Adopted(call) => {
            let cluster = cluster.clone();
            ops.supervisor.clone().spawn_local("adopted", async move {
                cluster
                    .adopted_at_peer(call.origin, call.from, call.objects)
                    .await;
            });
        }
        PeerCall::Witness(call) => {
            cluster.witness_received(call.from, call.epoch, call.reset, call.sealed, call.gone);
        }
        PeerCall::Unregister(call) => directory::unregister(cluster, call),
        PeerCall::Cached(call) => directory::cached(cluster, call),
        PeerCall::Publish(call) => directory::publish(cluster, call),
        PeerCall::Lookup(call) => directory::lookup(cluster, call),
        PeerCall::Acquire(call) => references::acquire(ops, cluster, call),
        PeerCall::Release(call) => references::release(ops, cluster, call),
        PeerCall::Revoke(call) => references::revoke(cluster, call),
        PeerCall::GiveBack(call) => references::give_back(cluster, call),
        PeerCall::Drop(call) => references::drop_copies(ops, cluster, call),
        PeerCall::AttachReads(call) => references::attach_reads(cluster, call),
        PeerCall::Allocate(call) => objects::allocate(ops, cluster, call),
        PeerCall::Seal(call) => objects::seal(ops, call),
        PeerCall::Abort(call) => objects::abort(ops, call),
        PeerCall::Delete(call) => objects::delete(ops, call),
        PeerCall::Status(call) => objects::status(ops, cluster, call),
        PeerCall::List(call) => objects::list(ops, call),
        PeerCall::Names(call) => names::names(ops, call),
        PeerCall::UnlinkName(call) => names::unlink(ops, call),
        PeerCall::RenameName(call) => names::rename(ops, call),
    }
}

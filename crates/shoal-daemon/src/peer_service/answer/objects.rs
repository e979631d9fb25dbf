//! Objects peers allocate, seal, abort and delete here (remote allocation,
//! deletes at the home), and what this node says of itself: its status
//! and its list.

use std::future::pending;
use std::rc::Rc;

use shoal_cluster::proto::{AllocateReply, ListReply, NodeStatus, ObjectRow};
use shoal_store::store::Placement;

use super::outcome::{outcome, statuses};
use crate::cluster::Cluster;
use crate::ops::Ops;
use crate::peer_service::calls;
use crate::principals;

/// Creates the objects in this node's memory for the peer (a task: it may
/// wait for space).
pub(super) fn allocate(ops: &Rc<Ops>, cluster: &Rc<Cluster>, call: calls::Allocate) {
    let calls::Allocate {
        specs,
        timeout_ms,
        from,
        incarnation,
        reply,
    } = call;
    cluster.heard_incarnation(from, incarnation);
    cluster.peers.touch(from);
    let ops = ops.clone();
    ops.supervisor
        .clone()
        .spawn_local("peer allocate", async move {
            let cluster = ops.cluster.as_ref().expect("cluster mode");
            let client = principals::peer(from);
            let answer = match ops
                .create(client, &specs, Placement::Packed, timeout_ms, pending())
                .await
            {
                Ok(locations) => AllocateReply {
                    code: 0,
                    message: String::new(),
                    offsets: locations.iter().map(|l| l.offset).collect(),
                    incarnation: cluster.incarnation,
                    fence_epoch: cluster.fence_epoch_for(from),
                },
                Err(err) => AllocateReply {
                    code: u32::from(err.kind().code()),
                    message: err.message().to_owned(),
                    offsets: Vec::new(),
                    incarnation: 0,
                    fence_epoch: cluster.fence_epoch_for(from),
                },
            };
            let _ = reply.send(answer);
        });
}

pub(super) fn seal(ops: &Rc<Ops>, call: calls::Seal) {
    let ops = ops.clone();
    ops.supervisor.clone().spawn_local("peer seal", async move {
        let result = ops
            .seal(principals::peer(call.from), &call.ids, call.release, None)
            .await;
        let _ = call.reply.send(outcome(result));
    });
}

pub(super) fn abort(ops: &Rc<Ops>, call: calls::Abort) {
    let ops = ops.clone();
    ops.supervisor
        .clone()
        .spawn_local("peer abort", async move {
            let result = ops.abort(principals::peer(call.from), &call.ids).await;
            let _ = call.reply.send(outcome(result));
        });
}

pub(super) fn delete(ops: &Rc<Ops>, call: calls::Delete) {
    let ops = ops.clone();
    ops.supervisor
        .clone()
        .spawn_local("peer delete", async move {
            let errors = ops.delete(&call.ids, false).await;
            let _ = call.reply.send(statuses(errors));
        });
}

pub(super) fn status(ops: &Ops, cluster: &Rc<Cluster>, call: calls::Status) {
    let stats = ops.node.read(|store| store.stats());
    let view = cluster.view();
    let (lost_objects, lost_ids) = cluster.lost_objects();
    let _ = call.reply.send(NodeStatus {
        node: cluster.me,
        capacity: stats.capacity,
        used: stats.used,
        objects: stats.objects,
        clients: ops.node.connected() as u64,
        region_size: stats.region_size,
        rebuilding: !cluster.directory_ready(),
        loans: cluster.loans_held() as u64,
        view_epoch: view.epoch(),
        view_members: view.members().to_vec(),
        membership_in_touch: cluster.membership_in_touch(),
        lost_objects,
        lost_ids: shoal_cluster::ids::pack(&lost_ids),
        adopted_objects: ops.tiers.as_ref().map_or(0, |t| t.adopted_objects()),
        learned: cluster.learned_records(),
    });
}

pub(super) fn list(ops: &Ops, call: calls::List) {
    let objects = ops
        .node
        .read(|store| store.list())
        .into_iter()
        .map(|o| ObjectRow {
            id: o.id.0.to_vec(),
            data_size: o.location.data_size,
            meta_size: o.location.meta_size,
            sealed: o.sealed,
            ref_count: o.refs,
        })
        .collect();
    let _ = call.reply.send(ListReply { objects });
}

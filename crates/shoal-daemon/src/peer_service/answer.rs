//! Answers peer calls on the store thread, with the same operations local
//! clients use (`ops`) and the cluster's own state.

use std::future::pending;
use std::rc::Rc;

use shoal_cluster::ids::{push_location, LOCATION_RECORD};
use shoal_cluster::proto::{
    AcquireReply, AllocateReply, ListReply, NameRow, NamesReply, NodeStatus, ObjectRow, Outcome,
    Statuses,
};
use shoal_core::error::{ErrorKind, Result};
use shoal_store::store::Placement;

use crate::ops::Ops;
use crate::peer_service::calls::PeerCall;
use crate::principals;

fn outcome(result: Result<()>) -> Outcome {
    match result {
        Ok(()) => Outcome::default(),
        Err(err) => Outcome {
            code: u32::from(err.kind().code()),
            message: err.message().to_owned(),
        },
    }
}

fn statuses(errors: Vec<Option<ErrorKind>>) -> Statuses {
    Statuses {
        codes: errors
            .into_iter()
            .map(|e| e.map_or(0, |k| u32::from(k.code())))
            .collect(),
    }
}

/// Answers one call. Calls that wait (for peers, or for space) run as
/// their own task; the rest are answered before the next call is read.
pub fn answer(ops: &Rc<Ops>, call: PeerCall) {
    let cluster = ops
        .cluster
        .as_ref()
        .expect("peer calls only in cluster mode");
    match call {
        PeerCall::Heartbeat {
            from,
            incarnation,
            fence_epoch,
            fence_confirmed,
            reply,
        } => {
            // A restart first: it starts the peer's epochs again.
            cluster.heard_incarnation(from, incarnation);
            cluster.heard_fence(from, fence_epoch);
            cluster.fence_confirmed(from, fence_confirmed);
            let _ = reply.send(cluster.heartbeat_reply());
        }
        PeerCall::Register {
            ids,
            owner,
            incarnation,
            reply,
        } => {
            // A restart of the owner is dealt with before it claims anything.
            cluster.heard_incarnation(owner, incarnation);
            let _ = reply.send(cluster.directory_register(&ids, owner));
        }
        PeerCall::Restore {
            from,
            incarnation,
            sealed,
            pending,
            copies,
            reply,
        } => {
            cluster.heard_incarnation(from, incarnation);
            let _ = reply.send(cluster.directory_restore(from, &sealed, &pending, &copies));
        }
        PeerCall::Restored { from, incarnation } => cluster.restored_by(from, incarnation),
        PeerCall::Unregister { ids, owner } => {
            let stale = cluster.directory_unregister(&ids, owner);
            cluster.send_drops_later(stale);
        }
        PeerCall::Cached {
            ids,
            owner,
            locations,
            from,
            reply,
        } => {
            let accepted = cluster.directory_add_checked_copies(&ids, owner, &locations, from);
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
            let _ = reply.send(Statuses { codes });
        }
        PeerCall::Drop { ids } => {
            let cluster = cluster.clone();
            ops.supervisor.spawn_local("drop copies", async move {
                cluster.drop_copies(&ids).await;
            });
        }
        PeerCall::Revoke {
            ids,
            number,
            from,
            reply,
        } => {
            let _ = reply.send(cluster.revoked(from, number, &ids));
        }
        PeerCall::AttachReads {
            from,
            incarnation,
            table,
            key,
            reply,
        } => {
            let _ = reply.send(cluster.attach_reads(from, incarnation, table, key));
        }
        PeerCall::GiveBack { from, reply } => {
            let _ = reply.send(cluster.give_back_idle(from));
        }
        PeerCall::Publish {
            ids,
            locations,
            owner,
            reply,
        } => {
            cluster.directory_publish(&ids, &locations, owner);
            let _ = reply.send(());
        }
        PeerCall::Lookup { ids, reply } => {
            let answer = cluster
                .local_lookup(&ids)
                .map_err(|e| tonic::Status::unavailable(e.message()));
            let _ = reply.send(answer);
        }
        PeerCall::Acquire {
            ids,
            from,
            incarnation,
            seq,
            settled,
            reply,
        } => {
            // References are taken for an incarnation this node has recorded:
            // a later restart of the caller then drops them.
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
            // On a tier only: restored now, found when the peer asks again.
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
        PeerCall::Release {
            ids,
            from,
            fence_epoch,
            seq,
            settled,
            undo,
            callee_incarnation,
        } => {
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
                // Sent before this node fenced `from`: those references are
                // in quarantine, and one `from` took since must stay.
                tracing::debug!(
                    from,
                    count = ids.len(),
                    "ignored a release from before a fence"
                );
            }
        }
        PeerCall::Delete { ids, reply } => {
            let ops = ops.clone();
            ops.supervisor
                .clone()
                .spawn_local("peer delete", async move {
                    let errors = ops.delete(&ids, false).await;
                    let _ = reply.send(statuses(errors));
                });
        }
        PeerCall::Allocate {
            specs,
            timeout_ms,
            from,
            incarnation,
            reply,
        } => {
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
        PeerCall::Seal {
            ids,
            release,
            from,
            reply,
        } => {
            let ops = ops.clone();
            ops.supervisor.clone().spawn_local("peer seal", async move {
                let result = ops.seal(principals::peer(from), &ids, release, None).await;
                let _ = reply.send(outcome(result));
            });
        }
        PeerCall::Abort { ids, from, reply } => {
            let ops = ops.clone();
            ops.supervisor
                .clone()
                .spawn_local("peer abort", async move {
                    let result = ops.abort(principals::peer(from), &ids).await;
                    let _ = reply.send(outcome(result));
                });
        }
        PeerCall::Status { reply } => {
            let stats = ops.node.read(|store| store.stats());
            let _ = reply.send(NodeStatus {
                node: cluster.me,
                capacity: stats.capacity,
                used: stats.used,
                objects: stats.objects,
                clients: ops.node.connected() as u64,
                region_size: stats.region_size,
                rebuilding: !cluster.directory_ready(),
                loans: cluster.loans_held() as u64,
            });
        }
        PeerCall::List { reply } => {
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
            let _ = reply.send(ListReply { objects });
        }
        PeerCall::Names {
            prefix,
            exact,
            reply,
        } => {
            // A malformed name from a peer: an empty answer (it has no
            // such name here either).
            let entries = ops
                .names_here(&prefix, exact)
                .unwrap_or_default()
                .into_iter()
                .map(|e| NameRow {
                    name: e.name,
                    id: e.id.0.to_vec(),
                    data_size: e.data_size,
                    meta_size: e.meta_size,
                    mtime_ms: e.mtime_ms,
                })
                .collect();
            let _ = reply.send(NamesReply { entries });
        }
        PeerCall::UnlinkName {
            name,
            older_than_ms,
            reply,
            ..
        } => {
            let ops = ops.clone();
            ops.supervisor
                .clone()
                .spawn_local("peer unlink name", async move {
                    let result = ops.unlink_here(&name, older_than_ms).await;
                    let _ = reply.send(outcome(result));
                });
        }
        PeerCall::RenameName {
            from, to, reply, ..
        } => {
            let ops = ops.clone();
            ops.supervisor
                .clone()
                .spawn_local("peer rename name", async move {
                    let result = ops.rename_here(&from, &to).await;
                    let _ = reply.send(outcome(result));
                });
        }
    }
}

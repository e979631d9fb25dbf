//! This node's part of the cluster's namespace (the namespace is the union
//! of every node's names).

use std::rc::Rc;

use shoal_cluster::proto::{NameRow, NamesReply};

use super::outcome::outcome;
use crate::ops::Ops;
use crate::peer_service::calls;

pub(super) fn names(ops: &Ops, call: calls::Names) {
    // A malformed name from a peer: an empty answer (it has no such name
    // here either).
    let entries = ops
        .names_here(&call.prefix, call.exact)
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
    let _ = call.reply.send(NamesReply { entries });
}

pub(super) fn unlink(ops: &Rc<Ops>, call: calls::UnlinkName) {
    let ops = ops.clone();
    ops.supervisor
        .clone()
        .spawn_local("peer unlink name", async move {
            let result = ops.unlink_here(&call.name, call.older_than_ms).await;
            let _ = call.reply.send(outcome(result));
        });
}

pub(super) fn rename(ops: &Rc<Ops>, call: calls::RenameName) {
    let ops = ops.clone();
    ops.supervisor
        .clone()
        .spawn_local("peer rename name", async move {
            let result = ops.rename_here(&call.from, &call.to).await;
            let _ = call.reply.send(outcome(result));
        });
}

//! The cluster's namespace (the POSIX view from any node): the union of
//! the nodes' names. Each node binds the names of the objects it owns
//! (`crate::names`); these calls ask the other nodes for theirs, or act on
//! a name where it is bound. Where two nodes bind one name (a file
//! rewritten on another node before the older binding was superseded, or
//! a node that was cut off meanwhile), the newest binding wins: ties go to
//! the larger object id, so every node picks the same one.

use shoal_cluster::proto::{NamesReply, NamesRequest, RenameNameRequest, UnlinkNameRequest};
use shoal_core::error::{ErrorKind, Result};
use shoal_core::protocol::NameEntry;
use shoal_core::ObjectId;

use crate::cluster::peers::{join_all, Reach};
use crate::cluster::remote_alloc::outcome_error;
use crate::cluster::state::Cluster;

/// `older_than_ms` that unlinks a name whatever it is bound to.
pub const UNLINK_ANY: u64 = u64::MAX;

/// Whether binding `a` wins over `b` for the same name.
pub fn newer(a: &NameEntry, b: &NameEntry) -> bool {
    (a.mtime_ms, a.id.0) > (b.mtime_ms, b.id.0)
}

impl Cluster {
    /// The names bound at every other node that answers: `prefix` itself
    /// (`exact`) or every name under it; with the node that binds each.
    /// Nodes that are down are skipped (their names are out of sight
    /// until they return).
    pub async fn peer_names(&self, prefix: &str, exact: bool) -> Vec<(u32, NameEntry)> {
        let calls = self.others().map(|node| {
            let request = NamesRequest {
                prefix: prefix.to_owned(),
                exact,
            };
            async move {
                let reply = self
                    .peers
                    .call(node, Reach::FailFast, "names", |mut p| async move {
                        p.names(request).await
                    })
                    .await;
                (node, reply)
            }
        });
        let mut found = Vec::new();
        for (node, reply) in join_all(calls).await {
            match reply {
                Ok(NamesReply { entries }) => {
                    for row in entries {
                        let Some(id) = ObjectId::from_slice(&row.id) else {
                            tracing::warn!(node, name = row.name, "a peer named a malformed id");
                            continue;
                        };
                        found.push((
                            node,
                            NameEntry {
                                name: row.name,
                                id,
                                data_size: row.data_size,
                                meta_size: row.meta_size,
                                mtime_ms: row.mtime_ms,
                            },
                        ));
                    }
                }
                Err(err) => tracing::debug!(node, %err, "names of a peer"),
            }
        }
        found
    }

    /// Unlinks `name` at every other node where it is bound to an object
    /// named before `older_than_ms` ([`UNLINK_ANY`]: whatever it is bound
    /// to). Whether any node unlinked it.
    pub async fn unlink_name_at_peers(&self, name: &str, older_than_ms: u64) -> bool {
        let calls = self.others().map(|node| {
            let request = UnlinkNameRequest {
                name: name.to_owned(),
                older_than_ms,
            };
            async move {
                let outcome = self
                    .peers
                    .call(node, Reach::FailFast, "unlink_name", |mut p| async move {
                        p.unlink_name(request).await
                    })
                    .await;
                match outcome {
                    Ok(outcome) if outcome.code == 0 => true,
                    Ok(_) => false,
                    Err(err) => {
                        tracing::debug!(node, %err, "unlink of a name at a peer");
                        false
                    }
                }
            }
        });
        join_all(calls).await.into_iter().any(|unlinked| unlinked)
    }

    /// Renames `from` (a name or a directory) at `node`, which binds it.
    pub async fn rename_name_at(&self, node: u32, from: &str, to: &str) -> Result<()> {
        let request = RenameNameRequest {
            from: from.to_owned(),
            to: to.to_owned(),
        };
        let outcome = self
            .peers
            .call(node, Reach::FailFast, "rename_name", |mut p| async move {
                p.rename_name(request).await
            })
            .await?;
        outcome_error(node, outcome)
    }

    /// Renames directory `from` at every other node (each moves the names
    /// it binds under it). Whether any node held names under it.
    pub async fn rename_dir_at_peers(&self, from: &str, to: &str) -> Result<bool> {
        let calls = self
            .others()
            .map(|node| async move { self.rename_name_at(node, from, to).await });
        let mut any = false;
        for outcome in join_all(calls).await {
            match outcome {
                Ok(()) => any = true,
                Err(err) if err.kind() == ErrorKind::ObjectNotFound => {}
                Err(err) if err.kind() == ErrorKind::NodeUnavailable => {}
                Err(err) => return Err(err),
            }
        }
        Ok(any)
    }
}

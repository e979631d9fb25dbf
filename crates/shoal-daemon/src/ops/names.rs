//! Names (the POSIX view): bind, resolve, list, rename, unlink. A name
//! moved off an object (rebound, renamed over, unlinked) deletes that
//! object: readers holding it keep it until they release it, as with any
//! delete, and nobody finds it by name or id afterwards.
//!
//! In a cluster the namespace is the union of the nodes' names
//! (`crate::cluster::names`): each node binds the names of the objects it
//! owns, a client's resolve and list see every node's, and the newest
//! binding of a name wins. Binding a name here unlinks older bindings of it
//! elsewhere (in the background: until then the newest already wins);
//! rename and unlink act where the name is bound. The `*_here` operations
//! answer other nodes and touch this node's names only.

use std::time::{SystemTime, UNIX_EPOCH};

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::names;
use shoal_core::protocol::NameEntry;
use shoal_core::ObjectId;

use crate::cluster::names::{newer, UNLINK_ANY};
use crate::names::Bound;
use crate::ops::Ops;

impl Ops {
    /// Names `id`: pending until its seal if it is still being written, at
    /// once if it is sealed (and in memory).
    pub(crate) async fn name(&self, id: ObjectId, name: String) -> Result<()> {
        names::check(&name)?;
        let replaced = {
            let (unsealed, location) = self.node.read(|s| (s.is_unsealed(&id), s.location(&id)));
            if unsealed {
                // Bound by whoever seals it: only its creator may.
                self.node.names().borrow_mut().set_pending(id, name);
                return Ok(());
            }
            let Some(location) = location else {
                return Err(ShoalError::not_found(&id));
            };
            let mtime_ms = now_ms();
            self.supersede_later(vec![(name.clone(), mtime_ms)]);
            self.node.names().borrow_mut().bind(
                name,
                Bound {
                    id,
                    data_size: location.data_size,
                    meta_size: location.meta_size,
                    mtime_ms,
                },
            )
        };
        self.delete_replaced(replaced.into_iter().collect()).await;
        Ok(())
    }

    /// Binds the pending names of objects just sealed.
    pub(super) async fn bind_sealed(&self, ids: &[ObjectId]) {
        let replaced = self.bind_pending(ids);
        self.delete_replaced(replaced).await;
    }

    /// Binds the pending names of objects just sealed, now; returns the
    /// objects those names leave, to delete.
    pub(super) fn bind_pending(&self, ids: &[ObjectId]) -> Vec<ObjectId> {
        let mut replaced = Vec::new();
        let mut bound = Vec::new();
        {
            let mut index = self.node.names().borrow_mut();
            for id in ids {
                let Some(name) = index.take_pending(id) else {
                    continue;
                };
                let Some(location) = self.node.read(|s| s.location(id)) else {
                    continue;
                };
                let mtime_ms = now_ms();
                bound.push((name.clone(), mtime_ms));
                replaced.extend(index.bind(
                    name,
                    Bound {
                        id: *id,
                        data_size: location.data_size,
                        meta_size: location.meta_size,
                        mtime_ms,
                    },
                ));
            }
        }
        self.supersede_later(bound);
        replaced
    }

    /// Names just bound here: other nodes unlink their older bindings of
    /// them (a file rewritten through another node's mount), in the
    /// background. Until they do, resolves pick the newest anyway.
    fn supersede_later(&self, bound: Vec<(String, u64)>) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        if bound.is_empty() {
            return;
        }
        self.supervisor.spawn_local("supersede names", async move {
            for (name, mtime_ms) in bound {
                cluster.unlink_name_at_peers(&name, mtime_ms).await;
            }
        });
    }

    /// The object `name` names (in a cluster: the newest binding of any
    /// node that answers).
    pub(crate) async fn resolve(&self, name: &str) -> Result<NameEntry> {
        names::check(name)?;
        Ok(self.resolve_where(name).await?.1)
    }

    /// Every name under directory `prefix` (`""`: all), sorted; in a
    /// cluster, every answering node's, the newest binding of each name.
    pub(crate) async fn list_names(&self, prefix: &str) -> Result<Vec<NameEntry>> {
        names::check_prefix(prefix)?;
        let mut merged: std::collections::BTreeMap<String, NameEntry> = self
            .names_here(prefix, false)?
            .into_iter()
            .map(|e| (e.name.clone(), e))
            .collect();
        if let Some(cluster) = &self.cluster {
            for (_, entry) in cluster.peer_names(prefix, false).await {
                match merged.get(&entry.name) {
                    Some(known) if !newer(&entry, known) => {}
                    _ => {
                        merged.insert(entry.name.clone(), entry);
                    }
                }
            }
        }
        Ok(merged.into_values().collect())
    }

    /// Renames a name or a directory wherever it is bound. A name is
    /// renamed by the node that binds its newest binding; a directory by
    /// every node that binds names under it (after the cluster-wide
    /// checks that it may: `to` is no name and no non-empty directory).
    pub(crate) async fn rename(&self, from: &str, to: &str) -> Result<()> {
        names::check(from)?;
        names::check(to)?;
        let Some(cluster) = &self.cluster else {
            return self.rename_here(from, to).await;
        };
        match self.resolve_where(from).await {
            Ok((node, _)) if node == cluster.me => return self.rename_here(from, to).await,
            Ok((node, _)) => return cluster.rename_name_at(node, from, to).await,
            Err(err) if err.kind() == ErrorKind::ObjectNotFound => {}
            Err(err) => return Err(err),
        }
        // Not a name: a directory, perhaps spread over several nodes.
        if from == to {
            return if self.list_names(from).await?.is_empty() {
                Err(no_name(from))
            } else {
                Ok(())
            };
        }
        if self.resolve_where(to).await.is_ok() {
            return Err(ShoalError::invalid(format!(
                "cannot rename directory {from:?} onto name {to:?}"
            )));
        }
        if !self.list_names(to).await?.is_empty() {
            return Err(ShoalError::new(
                ErrorKind::ObjectExists,
                format!("directory {to:?} is not empty"),
            ));
        }
        let here = match self.rename_here(from, to).await {
            Ok(()) => true,
            Err(err) if err.kind() == ErrorKind::ObjectNotFound => false,
            Err(err) => return Err(err),
        };
        let there = cluster.rename_dir_at_peers(from, to).await?;
        if here || there {
            Ok(())
        } else {
            Err(no_name(from))
        }
    }

    /// Unlinks `name` on every node that binds it.
    pub(crate) async fn unlink(&self, name: &str) -> Result<()> {
        names::check(name)?;
        let here = match self.unlink_here(name, UNLINK_ANY).await {
            Ok(()) => true,
            Err(err) if err.kind() == ErrorKind::ObjectNotFound => false,
            Err(err) => return Err(err),
        };
        let there = match &self.cluster {
            Some(cluster) => cluster.unlink_name_at_peers(name, UNLINK_ANY).await,
            None => false,
        };
        if here || there {
            Ok(())
        } else {
            Err(no_name(name))
        }
    }

    /// Sets the modification time `name` shows (utimens on a mount), on
    /// this node's binding of it; the next binding of the name sets the
    /// seal time again. Answered once the tiers' record of the object
    /// (if it has one yet; else its drain writes it) carries the time, so
    /// a restart shows it.
    pub(crate) async fn set_mtime(&self, name: &str, mtime_ms: u64) -> Result<()> {
        names::check(name)?;
        let id = self.node.names().borrow_mut().set_mtime(name, mtime_ms)?;
        if let Some(tiers) = &self.tiers {
            tiers.names_changed(&[id]).await?;
        }
        Ok(())
    }

    /// The newest binding of `name`, and the node that binds it.
    async fn resolve_where(&self, name: &str) -> Result<(u32, NameEntry)> {
        let me = self.cluster.as_ref().map_or(0, |c| c.me);
        let mut best = self.names_here(name, true)?.pop().map(|e| (me, e));
        if let Some(cluster) = &self.cluster {
            for (node, entry) in cluster.peer_names(name, true).await {
                if best.as_ref().is_none_or(|(_, known)| newer(&entry, known)) {
                    best = Some((node, entry));
                }
            }
        }
        best.ok_or_else(|| no_name(name))
    }

    /// This node's own bindings: of `prefix` itself (`exact`), or of every
    /// name under it.
    pub(crate) fn names_here(&self, prefix: &str, exact: bool) -> Result<Vec<NameEntry>> {
        let index = self.node.names();
        let mut entries = if exact {
            names::check(prefix)?;
            index.borrow().resolve(prefix).into_iter().collect()
        } else {
            names::check_prefix(prefix)?;
            index.borrow().list(prefix)
        };
        entries.retain(|e| self.still_here(&e.id));
        Ok(entries)
    }

    /// Renames a name or directory among this node's names. For a name,
    /// other nodes then drop their bindings of both names: `to` now means
    /// this object, and an older `from` elsewhere must not reappear.
    pub(crate) async fn rename_here(&self, from: &str, to: &str) -> Result<()> {
        names::check(from)?;
        names::check(to)?;
        let was_name = self.node.names().borrow().resolve(from).is_some();
        let renamed = self.node.names().borrow_mut().rename(from, to)?;
        self.delete_replaced(renamed.replaced).await;
        if let Some(tiers) = &self.tiers {
            // Answered once the records carry the new names: a restart
            // finds the files where the rename put them.
            tiers.names_changed(&renamed.moved).await?;
        }
        if let (Some(cluster), true) = (&self.cluster, was_name && from != to) {
            cluster.unlink_name_at_peers(to, UNLINK_ANY).await;
            cluster.unlink_name_at_peers(from, UNLINK_ANY).await;
        }
        Ok(())
    }

    /// Unlinks this node's binding of `name` if it was bound before
    /// `older_than_ms` ([`UNLINK_ANY`]: whatever it is bound to).
    pub(crate) async fn unlink_here(&self, name: &str, older_than_ms: u64) -> Result<()> {
        names::check(name)?;
        let id = {
            let mut index = self.node.names().borrow_mut();
            match index.resolve(name) {
                Some(bound) if older_than_ms == UNLINK_ANY || bound.mtime_ms < older_than_ms => {
                    index.unlink(name)?
                }
                Some(_) => {
                    return Err(ShoalError::new(
                        ErrorKind::ObjectNotFound,
                        format!("name {name:?} is bound to a newer object here"),
                    ))
                }
                None => return Err(no_name(name)),
            }
        };
        self.delete_replaced(vec![id]).await;
        Ok(())
    }

    pub(super) async fn delete_replaced(&self, ids: Vec<ObjectId>) {
        if ids.is_empty() {
            return;
        }
        warn_replaced(&ids, self.delete(&ids, true).await);
    }

    /// [`delete_replaced`](Self::delete_replaced) for a caller that cannot
    /// wait (the write poller's seal): the objects leave the store and the
    /// name index now, with the switch, so nothing asked after the seal
    /// finds the old version; tiers and peers are told in the background.
    pub(super) fn delete_replaced_soon(&self, ids: Vec<ObjectId>) {
        if ids.is_empty() {
            return;
        }
        let errors = self.delete_here(&ids, true);
        if !self.delete_waits() {
            warn_replaced(&ids, errors);
            return;
        }
        let ops = self.rc();
        self.supervisor.spawn_local("delete renamed", async move {
            let errors = ops.finish_delete(&ids, errors, true).await;
            warn_replaced(&ids, errors);
        });
    }

    /// Whether a named object still exists (in memory or below): without
    /// tiers an evicted object is gone, and so is its name.
    fn still_here(&self, id: &ObjectId) -> bool {
        self.node.read(|s| s.contains(id)) || self.node.held_below(id)
    }
}

/// Logs what deleting the objects names left failed with (one already gone
/// is fine).
fn warn_replaced(ids: &[ObjectId], errors: Vec<Option<ErrorKind>>) {
    for (id, err) in ids.iter().zip(errors) {
        if let Some(kind) = err.filter(|k| *k != ErrorKind::ObjectNotFound) {
            tracing::warn!(%id, %kind, "deleting the object a name left");
        }
    }
}

fn no_name(name: &str) -> ShoalError {
    ShoalError::new(ErrorKind::ObjectNotFound, format!("no name {name:?}"))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

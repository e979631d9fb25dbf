//! Names (the POSIX view): bind, resolve, list, rename, unlink. A name
//! moved off an object (rebound, renamed over, unlinked) deletes that
//! object: readers holding it keep it until they release it, as with any
//! delete, and nobody finds it by name or id afterwards.

use std::time::{SystemTime, UNIX_EPOCH};

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::names;
use shoal_core::protocol::NameEntry;
use shoal_core::ObjectId;

use crate::names::Bound;
use crate::ops::Ops;

impl Ops {
    /// Names `id`: pending until its seal if it is still being written, at
    /// once if it is sealed (and in memory).
    pub async fn name(&self, id: ObjectId, name: String) -> Result<()> {
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
            self.node.names().borrow_mut().bind(
                name,
                Bound {
                    id,
                    data_size: location.data_size,
                    meta_size: location.meta_size,
                    mtime_ms: now_ms(),
                },
            )
        };
        self.delete_replaced(replaced.into_iter().collect()).await;
        Ok(())
    }

    /// Binds the pending names of objects just sealed.
    pub(super) async fn bind_sealed(&self, ids: &[ObjectId]) {
        let mut replaced = Vec::new();
        {
            let mut index = self.node.names().borrow_mut();
            for id in ids {
                let Some(name) = index.take_pending(id) else {
                    continue;
                };
                let Some(location) = self.node.read(|s| s.location(id)) else {
                    continue;
                };
                replaced.extend(index.bind(
                    name,
                    Bound {
                        id: *id,
                        data_size: location.data_size,
                        meta_size: location.meta_size,
                        mtime_ms: now_ms(),
                    },
                ));
            }
        }
        self.delete_replaced(replaced).await;
    }

    pub fn resolve(&self, name: &str) -> Result<NameEntry> {
        names::check(name)?;
        self.node
            .names()
            .borrow()
            .resolve(name)
            .filter(|e| self.still_here(&e.id))
            .ok_or_else(|| ShoalError::new(ErrorKind::ObjectNotFound, format!("no name {name:?}")))
    }

    pub fn list_names(&self, prefix: &str) -> Result<Vec<NameEntry>> {
        names::check_prefix(prefix)?;
        let mut entries = self.node.names().borrow().list(prefix);
        entries.retain(|e| self.still_here(&e.id));
        Ok(entries)
    }

    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        names::check(from)?;
        names::check(to)?;
        let renamed = self.node.names().borrow_mut().rename(from, to)?;
        self.delete_replaced(renamed.replaced).await;
        if let Some(tiers) = &self.tiers {
            // Answered once the records carry the new names: a restart
            // finds the files where the rename put them.
            tiers.renamed(&renamed.moved).await?;
        }
        Ok(())
    }

    pub async fn unlink(&self, name: &str) -> Result<()> {
        names::check(name)?;
        let id = self.node.names().borrow_mut().unlink(name)?;
        self.delete_replaced(vec![id]).await;
        Ok(())
    }

    async fn delete_replaced(&self, ids: Vec<ObjectId>) {
        if ids.is_empty() {
            return;
        }
        for (id, err) in ids.iter().zip(self.delete(&ids, true).await) {
            if let Some(kind) = err.filter(|k| *k != ErrorKind::ObjectNotFound) {
                tracing::warn!(%id, %kind, "deleting the object a name left");
            }
        }
    }

    /// Whether a named object still exists (in memory or below): without
    /// tiers an evicted object is gone, and so is its name.
    fn still_here(&self, id: &ObjectId) -> bool {
        self.node.read(|s| s.contains(id)) || self.node.held_below(id)
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

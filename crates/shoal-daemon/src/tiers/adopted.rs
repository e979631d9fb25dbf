//! Backing stores of other nodes this node adopted (docs/cluster.md,
//! "Adoption"): each is served by an engine of its own, opened with the
//! removed node's identity and a manifest kept beside this node's, and its
//! objects are tracked like this node's tier objects with their `origin`:
//! gets restore them from there, deletes remove them there. Nothing is
//! drained to an adopted store, and nothing is copied out of it: every
//! object lives in exactly one backing store, so no copy of a deleted one
//! can come back.

use std::sync::Arc;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;
use shoal_tiers::TierEngine;

use super::Tiers;

/// What an adoption (or the reopening of one after a restart) left this
/// node serving.
#[derive(Debug, Default)]
pub(crate) struct AdoptedObjects {
    /// Objects now served from the adopted store, with their sizes (offset
    /// 0: they are below memory).
    pub(crate) objects: Vec<(ObjectId, ObjectLocation)>,
    /// Images there of ids this node already holds an object of: not
    /// served (and removed).
    pub(crate) shadowed: usize,
}

impl Tiers {
    /// The engine holding the tier copies of objects of `origin` (`None`:
    /// this node's own).
    pub(super) fn engine_for(&self, origin: Option<u32>) -> Arc<TierEngine> {
        origin
            .and_then(|o| self.adopted.borrow().get(&o).cloned())
            .unwrap_or_else(|| self.engine.clone())
    }

    /// The engine holding `id`'s tier copies.
    pub(super) fn engine_of(&self, id: &ObjectId) -> Arc<TierEngine> {
        let origin = self.index.borrow().get(id).and_then(|t| t.origin);
        self.engine_for(origin)
    }

    /// Whether this node can adopt `origin`'s backing store: its node's
    /// table (the file's, or its record) names one, and this node has a
    /// manifest directory.
    pub(crate) fn can_adopt(&self, origin: u32) -> bool {
        self.adoptable.borrow().contains_key(&origin)
            && self.config.adopted_manifest(origin).is_ok()
    }

    /// Notes the backing store of `node` (another node of the cluster file,
    /// or a member learned since) as one this node may adopt. One whose
    /// description does not parse here (an S3 store without credentials in
    /// this daemon's environment) is left out, with a warning.
    pub(crate) fn learn_adoptable(&self, node: &shoal_cluster::Node) {
        let Some(spec) = &node.tiers.backing else {
            return;
        };
        if node.id == self.owner.node || self.adoptable.borrow().contains_key(&node.id) {
            return;
        }
        let capacity = node.tiers.backing_capacity.unwrap_or(u64::MAX);
        match super::Backing::from_spec(spec, capacity, self.config.s3_endpoint.as_deref()) {
            Ok(backing) => {
                self.adoptable.borrow_mut().insert(node.id, backing);
            }
            Err(err) => tracing::warn!(
                node = node.id,
                %err,
                "this node cannot adopt that node's backing store"
            ),
        }
    }

    /// Objects served from adopted backing stores.
    pub fn adopted_objects(&self) -> u64 {
        self.index.borrow().adopted()
    }

    /// A clean stop with a membership: marks this node's backing store as
    /// expected back, so no survivor adopts it while it is away (a
    /// failure is logged: the store may then be adopted).
    pub(crate) async fn mark_stopped(&self) {
        if !self.config.shared_backing {
            return;
        }
        if let Some(backing) = self.engine.tier(shoal_tiers::TierLevel::Backing) {
            if let Err(err) = backing.mark_stopped(true).await {
                tracing::warn!(%err, "could not mark the backing store as stopped cleanly: a survivor may adopt it");
            }
        }
    }

    /// The node that adopted this node's own backing store, if one did
    /// (this node was removed from the cluster meanwhile), as its marker
    /// says now; `None` also without a backing store.
    pub(crate) async fn own_store_adopted_by(&self) -> Result<Option<u32>> {
        let Some(backing) = self.engine.tier(shoal_tiers::TierLevel::Backing) else {
            return Ok(None);
        };
        Ok(backing.marker().await?.and_then(|m| m.adopted_by))
    }

    /// Adopts the backing store of `origin`, removed from the cluster for
    /// good: takes it over (its marker names this node from then on) if
    /// `may_take` accepts its current adopter (`None`: nobody's), recovers
    /// what it holds, and tracks its objects. Adopting one this node serves
    /// already answers what it serves from it.
    pub(crate) async fn adopt(
        &self,
        origin: u32,
        may_take: impl Fn(Option<u32>) -> bool + Send + Sync + 'static,
    ) -> Result<AdoptedObjects> {
        if self.adopted.borrow().contains_key(&origin) {
            return Ok(self.objects_of(origin));
        }
        let backing = self
            .adoptable
            .borrow()
            .get(&origin)
            .cloned()
            .ok_or_else(|| {
                ShoalError::new(
                    ErrorKind::ObjectNotFound,
                    format!("node {origin}'s table names no backing store"),
                )
            })?;
        let adopter = shoal_tiers::TierIdentity::new(self.owner.cluster.clone(), origin)
            .adopted(self.owner.node);
        let (engine, report) = self
            .config
            .open_adopted(&backing, &adopter, may_take)
            .await?;
        let engine = Arc::new(engine);
        let mut shadowed = Vec::new();
        {
            let mut index = self.index.borrow_mut();
            index.reserve(report.records.len());
            for (id, record) in &report.records {
                if index.get(id).is_some() || self.node.read(|s| s.contains(id)) {
                    shadowed.push((*id, record.generation));
                } else {
                    index.recovered_from(Some(origin), *id, record);
                }
            }
        }
        // An image of an id this node holds another object of is an older
        // incarnation (one id, one owner at a time): never served.
        for (id, generation) in &shadowed {
            if let Err(err) = engine.delete(*id, *generation).await {
                tracing::warn!(%id, origin, %err, "a shadowed adopted image was not removed");
            }
        }
        self.adopted.borrow_mut().insert(origin, engine);
        self.changed.notify_waiters();
        let mut adopted = self.objects_of(origin);
        adopted.shadowed = shadowed.len();
        tracing::info!(
            origin,
            objects = adopted.objects.len(),
            shadowed = adopted.shadowed,
            "adopted the backing store of a node removed from the cluster"
        );
        Ok(adopted)
    }

    /// After a restart: opens again every backing store this node had
    /// adopted (manifests beside its own) that still names it. One another
    /// node took over since is forgotten here (its manifest removed). Per
    /// origin, what it serves or why it could not be opened (retry).
    pub(crate) async fn reopen_adopted(&self) -> Result<Vec<(u32, Result<AdoptedObjects>)>> {
        let mut out = Vec::new();
        for origin in self.config.adopted_origins()? {
            if self.adopted.borrow().contains_key(&origin) {
                continue;
            }
            // Only a store whose marker names this node: never a take-over.
            let opened = self.adopt(origin, |_| false).await;
            if let Err(err) = &opened {
                if err.kind() == ErrorKind::ObjectInUse {
                    tracing::warn!(
                        origin,
                        %err,
                        "another node adopted this backing store since: forgetting it here"
                    );
                    let path = self.config.adopted_manifest(origin)?;
                    if let Err(err) = std::fs::remove_file(&path) {
                        tracing::warn!(path = %path.display(), %err, "could not remove a stale manifest");
                    }
                }
            }
            out.push((origin, opened));
        }
        Ok(out)
    }

    /// Forgets objects of an adopted store that another owner holds at
    /// their homes (a newer object of the same id): their images go.
    pub(crate) async fn drop_adopted(&self, ids: &[ObjectId]) {
        for err in self.delete(ids).await.into_iter().flatten() {
            tracing::warn!(%err, "an adopted image another owner's object shadows was not removed");
        }
    }

    fn objects_of(&self, origin: u32) -> AdoptedObjects {
        let index = self.index.borrow();
        AdoptedObjects {
            objects: index
                .iter()
                .filter(|(_, t)| t.origin == Some(origin))
                .map(|(id, t)| {
                    (
                        *id,
                        ObjectLocation {
                            offset: 0,
                            data_size: t.sizes.data_size,
                            meta_size: t.sizes.meta_size,
                        },
                    )
                })
                .collect(),
            shadowed: 0,
        }
    }
}

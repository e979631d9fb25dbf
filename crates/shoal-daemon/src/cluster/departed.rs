//! Nodes removed from the view for good, as this home saw them leave
//! (docs/cluster.md, "Adoption"). The sealed objects a removed node owned
//! here wait for its backing store's adopter, which registers at their homes
//! what it found there and then says `Adopted`; the rest were only in that
//! node's memory or on its own burst buffer, and are reported lost by id: a
//! log line, the `shoal_objects_lost` gauge, `shoal cluster status`. A node
//! whose file entry names no backing store has nothing to adopt: its objects
//! are reported at its removal.

use std::collections::HashMap;
use std::rc::Rc;

use shoal_cluster::ids::pack;
use shoal_cluster::proto::{AdoptedRequest, RestoreRequest};
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

use crate::cluster::peers::Reach;
use crate::cluster::state::{to_proto, Cluster};

/// Lost ids named in one log line (the count goes on).
const LOST_LOGGED: usize = 8;

/// Ids per Restore call of an adoption.
const ADOPT_BATCH: usize = 16_384;

impl Cluster {
    /// `node` left the view (removed, or stopped) and this home forgot the
    /// sealed objects `ids` it owned here.
    pub(crate) fn departed(&self, node: u32, ids: Vec<ObjectId>) {
        let adopters = self.view().members().iter().any(|&m| self.has_tier(m));
        if !adopters {
            self.report_lost(node, ids, "no member has a tier to adopt its backing store");
        } else if self.adoptable(node) {
            self.departed.borrow_mut().wait_for_adoption(node, ids);
        } else {
            self.report_lost(node, ids, "its cluster file entry names no backing store");
        }
    }

    /// `node` is a member again before anyone adopted its backing store: it
    /// serves its objects itself.
    pub(crate) fn returned(&self, node: u32) {
        self.departed.borrow_mut().adopted(node);
    }

    /// Whether `node` can adopt a removed node's store: its file entry has a
    /// tier, so it has a place for the adopted manifest (`adoption.rs`).
    pub(crate) fn has_tier(&self, node: u32) -> bool {
        self.topology()
            .node(node)
            .is_ok_and(|n| n.tiers.burst.is_some() || n.tiers.backing.is_some())
    }

    /// Whether `node`'s objects can outlive it: its file entry names a
    /// backing store another node may adopt.
    pub(crate) fn adoptable(&self, node: u32) -> bool {
        self.topology()
            .node(node)
            .is_ok_and(|n| n.tiers.backing.is_some())
    }

    /// `by` adopted the backing store of `origin` (and registered what it
    /// found there): the objects `origin` owned here that no home knows an
    /// owner of now are lost. Ids whose home does not answer are not
    /// judged (logged).
    pub(crate) async fn adopted_at_peer(&self, origin: u32, by: u32, objects: u64) {
        let Some(ids) = self.departed.borrow_mut().adopted(origin) else {
            tracing::info!(
                origin,
                by,
                objects,
                "a removed node's backing store was adopted"
            );
            return;
        };
        let (owners, homes_down) = self.lookup(&ids).await;
        let homes_down: std::collections::HashSet<usize> = homes_down.into_iter().collect();
        let lost: Vec<ObjectId> = ids
            .iter()
            .zip(&owners)
            .enumerate()
            .filter(|(i, (_, owner))| owner.is_none() && !homes_down.contains(i))
            .map(|(_, (id, _))| *id)
            .collect();
        if !homes_down.is_empty() {
            tracing::warn!(
                origin,
                unchecked = homes_down.len(),
                "objects of a removed node whose homes did not answer: not reported"
            );
        }
        tracing::info!(
            origin,
            by,
            objects,
            lost = lost.len(),
            "a removed node's backing store was adopted"
        );
        self.report_lost(origin, lost, "they never reached its backing store");
    }

    fn report_lost(&self, node: u32, ids: Vec<ObjectId>, why: &str) {
        if ids.is_empty() {
            return;
        }
        let named: Vec<String> = ids.iter().take(LOST_LOGGED).map(|id| id.to_hex()).collect();
        tracing::error!(
            node,
            lost = ids.len(),
            first = named.join(","),
            "objects of a node removed from the cluster are lost: {why} \
             (every lost id: `shoal cluster status --json`)"
        );
        self.departed.borrow_mut().lost(ids);
    }

    /// Objects of removed nodes this home reported lost: how many, and the
    /// first 1,000 (`departed_records.rs`).
    pub fn lost_objects(&self) -> (u64, Vec<ObjectId>) {
        self.departed.borrow().lost_objects()
    }

    /// How many objects of removed nodes this home reported lost.
    pub fn lost_count(&self) -> u64 {
        self.departed.borrow().lost_count()
    }

    /// Registers at their homes objects this node adopted (sealed, on an
    /// adopted backing store), by the current view. Returns those another
    /// owner holds there (a newer object of the same id): not this node's
    /// to serve.
    pub(crate) async fn register_adopted(
        &self,
        entries: &[(ObjectId, ObjectLocation)],
    ) -> Result<Vec<ObjectId>> {
        let mut conflicts = Vec::new();
        for batch in entries.chunks(ADOPT_BATCH) {
            let refused = self
                .by_current_view(|| async {
                    let mut refused = Vec::new();
                    let mut by_home: HashMap<u32, Vec<(ObjectId, ObjectLocation)>> = HashMap::new();
                    for &(id, location) in batch {
                        by_home
                            .entry(self.home(&id))
                            .or_default()
                            .push((id, location));
                    }
                    for (home, group) in by_home {
                        let ids: Vec<ObjectId> = group.iter().map(|(id, _)| *id).collect();
                        let codes: Vec<u32> = if home == self.me {
                            self.directory_restore(self.me, &group, &[], &[]).codes
                        } else {
                            let request = RestoreRequest {
                                incarnation: self.peers.incarnation_of(home).unwrap_or(0),
                                caller_incarnation: self.incarnation,
                                sealed: pack(&ids),
                                locations: group.iter().map(|(_, l)| to_proto(l)).collect(),
                                pending: Vec::new(),
                                copies: Vec::new(),
                            };
                            self.peers
                                .call(home, Reach::Try, "restore", |mut p| async move {
                                    p.restore(request).await
                                })
                                .await?
                                .codes
                        };
                        if codes.len() != ids.len() {
                            return Err(ShoalError::protocol(format!(
                                "node {home} answered {} statuses for {} adopted ids",
                                codes.len(),
                                ids.len()
                            )));
                        }
                        refused.extend(
                            ids.iter()
                                .zip(&codes)
                                .filter(|(_, &c)| c == ErrorKind::ObjectExists.code() as u32)
                                .map(|(id, _)| *id),
                        );
                    }
                    Ok(refused)
                })
                .await?;
            conflicts.extend(refused);
        }
        Ok(conflicts)
    }

    /// Tells every member (this node included) that this node adopted
    /// `origin`'s backing store and registered the `objects` it serves from
    /// it: their homes report the rest of `origin`'s objects lost. A member
    /// that does not answer reports nothing (logged).
    pub(crate) async fn announce_adopted(self: &Rc<Self>, origin: u32, objects: u64) {
        self.adopted_at_peer(origin, self.me, objects).await;
        let members: Vec<u32> = self.view().members().to_vec();
        for node in members.into_iter().filter(|&n| n != self.me) {
            let request = AdoptedRequest { origin, objects };
            let told = self
                .peers
                .call(node, Reach::Try, "adopted", |mut p| async move {
                    p.adopted(request).await
                })
                .await;
            if let Err(err) = told {
                tracing::warn!(node, origin, %err, "could not tell a member of an adoption");
            }
        }
    }
}

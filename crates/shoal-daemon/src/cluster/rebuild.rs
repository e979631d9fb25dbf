//! Node restarts: the directory of a node that (re)started is rebuilt from
//! its peers, and its peers forget what its previous incarnation held
//! (`shoal_cluster::rebuild` has the logic without I/O; docs/cluster.md,
//! "Restarts", the design and what it guarantees).
//!
//! As the restarted node: `directory_ready` gates Register and Lookup (and
//! this node's own registrations and remote gets) until every live peer said
//! `Restored` for this incarnation, or a lease passed.
//!
//! As a peer that hears a new incarnation of node k (its heartbeat):
//! 1. if k restarted, forget its previous incarnation: directory entries it
//!    owned (telling their copy holders to drop them), owner-cache entries
//!    naming it, local clients' references on it (their Releases would only
//!    reach the new incarnation); its references here are reclaimed by the
//!    caller, as before;
//! 2. restore at k everything this node owns whose home is k, and the
//!    network copies it keeps of such ids, then correct what changed while
//!    restoring, then say `Restored`.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use shoal_cluster::ids::pack;
use shoal_cluster::proto::{Ids, Location, PublishRequest, RestoreRequest, RestoredRequest};
use shoal_cluster::rebuild::{corrections, Holding, Ready};
use shoal_core::error::{Result, ShoalError};
use shoal_core::ObjectId;
use tokio::time::Instant;

use crate::cluster::peers::{Reach, RPC_TIMEOUT};
use crate::cluster::state::{to_proto, Cluster, Progress, Told};
use crate::principals;

/// Ids per Restore call.
const RESTORE_BATCH: usize = 16_384;

/// How often a caller waiting for readiness looks again.
const READY_POLL: Duration = Duration::from_millis(5);

/// How often a restore waiting for registrations in flight looks again.
const REGISTRATIONS_POLL: Duration = Duration::from_millis(2);

impl Cluster {
    /// Whether this node's directory can be used: it registers ids and
    /// answers lookups. Evaluated on demand (and every heartbeat tick).
    pub fn directory_ready(&self) -> bool {
        let mut rebuild = self.rebuild.borrow_mut();
        if rebuild.readiness.is_ready() {
            return true;
        }
        let Some(how) = rebuild.readiness.check(std::time::Instant::now()) else {
            return false;
        };
        let orphans = self.directory.borrow_mut().orphan_copies();
        let entries = self.directory.borrow().len();
        match how {
            Ready::Restored => tracing::info!(
                entries,
                orphan_copies = orphans.len(),
                "directory ready: every live peer restored its ids"
            ),
            Ready::TimedOut { waiting_for } => tracing::warn!(
                entries,
                orphan_copies = orphans.len(),
                ?waiting_for,
                "directory ready after a lease: some live peers had not finished restoring"
            ),
        }
        rebuild.orphans.extend(orphans);
        true
    }

    /// Waits until this node's directory is ready (at most a lease after
    /// the start): a starting node claims ids and takes references only once
    /// its peers know of its new incarnation.
    pub async fn until_ready(&self) {
        while !self.directory_ready() {
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// At start, once the tiers recovered what a previous incarnation made
    /// durable, and when a new view gives this node homes: its own objects
    /// whose home is this node enter its own directory. Peers restore here
    /// what they hold; what this node holds itself nobody else would, so
    /// without this its own ids homed here would be found by no other node.
    pub fn restore_own(&self) {
        let (owned, _) = self.holdings(self.me);
        if owned.is_empty() {
            return;
        }
        let (ids, locations): (Vec<ObjectId>, Vec<Holding>) = owned.into_iter().unzip();
        let refused = self
            .directory
            .borrow_mut()
            .restore(&ids, &locations, self.me)
            .iter()
            .filter(|s| s.is_some())
            .count();
        tracing::info!(
            ids = ids.len(),
            refused,
            "this node's own objects whose home it is entered its directory"
        );
    }

    /// A new view gave this node homes (readiness `round`): its own objects
    /// homed here enter its directory, and only then may it be ready. Like a
    /// restore at a peer, after the registrations it began under the old
    /// view ended: one the old home accepted is claimed, so restored here (its
    /// later Publish, sent here, finds the entry); one that failed is not. A
    /// snapshot taken at once would miss an id whose Register the old home
    /// (a member that left) was still answering, and this home would answer
    /// "unknown" for that object for good.
    pub(crate) fn restore_own_for_view(self: &Rc<Self>, round: u64) {
        let mark = self.rebuild.borrow().claims.watermark();
        if !self.rebuild.borrow().claims.in_flight_before(mark) {
            self.restore_own();
            self.rebuild.borrow_mut().readiness.restored_own(round);
            return;
        }
        tracing::debug!(
            "this node's own ids homed here enter its directory once the registrations it \
             began under the old view end"
        );
        let cluster = self.clone();
        self.supervisor.spawn_local("restore own", async move {
            cluster.registrations_before(mark).await;
            cluster.restore_own();
            cluster.rebuild.borrow_mut().readiness.restored_own(round);
            cluster.directory_ready();
        });
    }

    /// Waits until every registration with a ticket below `mark` ended (at
    /// most two RPC timeouts: each of their calls ends within one).
    async fn registrations_before(&self, mark: u64) {
        let deadline = Instant::now() + 2 * RPC_TIMEOUT;
        while self.rebuild.borrow().claims.in_flight_before(mark) && Instant::now() < deadline {
            tokio::time::sleep(REGISTRATIONS_POLL).await;
        }
    }

    /// `from` finished restoring for our incarnation `incarnation`, by the
    /// view numbered `epoch` (`None`: a static file's, which never changes).
    pub fn restored_by(&self, from: u32, incarnation: u64, epoch: Option<u64>) {
        if incarnation == self.incarnation && epoch.is_none_or(|e| e == self.epoch.get()) {
            self.rebuild.borrow_mut().readiness.restored(from);
            tracing::debug!(node = from, "peer restored its ids here");
        }
        self.directory_ready();
    }

    /// A heartbeat tick: readiness is re-evaluated; copies orphaned by the
    /// rebuild are dropped.
    pub fn rebuild_tick(self: &Rc<Self>) {
        self.directory_ready();
        let orphans = std::mem::take(&mut self.rebuild.borrow_mut().orphans);
        self.send_drops_later(orphans);
    }

    /// `node` restarted (or left the view): what it held is gone.
    pub(crate) fn forget_incarnation(self: &Rc<Self>, node: u32) {
        // Before anything is restored at it: those copies are not re-announced.
        self.drop_copies_of_restarted(node);
        let (entries, stale) = self.directory.borrow_mut().forget_owner(node);
        self.owners.borrow_mut().retain(|_, owner| *owner != node);
        let references = self.loans.borrow_mut().forget_owner(node);
        self.forget_fences_of(node);
        self.journal.borrow_mut().forget(node);
        tracing::warn!(
            node,
            entries,
            references,
            copies = stale.len(),
            "node {node} restarted or left: forgot what its previous incarnation held"
        );
        self.send_drops_later(stale);
    }

    /// A heartbeat from `node` at `incarnation` (its references here were
    /// already reclaimed if it restarted). On a new incarnation — first
    /// contact or a restart — restores at it what this node holds whose home
    /// it is; a restore that failed is tried again on the next heartbeat.
    pub fn heard(self: &Rc<Self>, node: u32, incarnation: u64) {
        let epoch = self.epoch.get();
        let previous = {
            let rebuild = self.rebuild.borrow();
            let Some(told) = rebuild.told.get(node as usize) else {
                return;
            };
            if told.incarnation == incarnation
                && told.epoch == epoch
                && told.progress != Progress::Failed
            {
                return;
            }
            told.incarnation
        };
        if previous != 0 && previous != incarnation {
            self.forget_incarnation(node);
        }
        self.restore_for_view(node, incarnation);
    }

    /// Restores at `node` (incarnation `incarnation`) what this node holds
    /// whose home it is by the current view, in the background; a newer
    /// incarnation or view supersedes it, a failure is tried again on the
    /// next heartbeat.
    pub(crate) fn restore_for_view(self: &Rc<Self>, node: u32, incarnation: u64) {
        let epoch = self.epoch.get();
        {
            let mut rebuild = self.rebuild.borrow_mut();
            let Some(told) = rebuild.told.get_mut(node as usize) else {
                return;
            };
            *told = Told {
                incarnation,
                epoch,
                progress: Progress::Running,
            };
        }
        let cluster = self.clone();
        self.supervisor.spawn_local("restore", async move {
            let outcome = cluster.restore(node, incarnation, epoch).await;
            if let Err(err) = &outcome {
                tracing::warn!(node, %err, "restoring ids at a (re)started node or a new home failed; retrying");
            }
            let mut rebuild = cluster.rebuild.borrow_mut();
            let told = &mut rebuild.told[node as usize];
            if told.incarnation == incarnation && told.epoch == epoch {
                told.progress = if outcome.is_ok() {
                    Progress::Done
                } else {
                    Progress::Failed
                };
            }
        });
    }

    /// Whether a restore for `incarnation` of `node`, by the view numbered
    /// `epoch`, is still wanted.
    fn current(&self, node: u32, incarnation: u64, epoch: u64) -> bool {
        let told = self.rebuild.borrow().told[node as usize];
        told.incarnation == incarnation && told.epoch == epoch && self.epoch.get() == epoch
    }

    /// What this node holds whose home is `node`: owned ids (sealed with
    /// their location, or pending: being written, or registered and not
    /// created yet) and ids of network copies.
    fn holdings(&self, node: u32) -> (HashMap<ObjectId, Holding>, Vec<ObjectId>) {
        let mut owned = HashMap::new();
        let mut copies = Vec::new();
        self.node.read(|store| {
            for object in store.list() {
                if self.home(&object.id) != node {
                    continue;
                }
                if self.is_copy(&object.id) {
                    copies.push(object.id);
                } else if object.sealed {
                    owned.insert(object.id, Some(object.location));
                } else if !store.holds(principals::COPY, &object.id)
                    && !store.holds(principals::STAGE, &object.id)
                {
                    // (A copy being pulled, or a staging buffer, is not ours to register.)
                    owned.insert(object.id, None);
                }
            }
        });
        // Objects only on a tier below: sealed here, restored on Acquire
        // (the location is a hint; Acquire answers where they are then).
        for (id, location) in self.node.held_only_below() {
            if self.home(&id) == node {
                owned.entry(id).or_insert(Some(location));
            }
        }
        for id in self.rebuild.borrow().claims.claimed() {
            if self.home(id) == node {
                owned.entry(*id).or_insert(None);
            }
        }
        (owned, copies)
    }

    /// Restores at `node` (incarnation `incarnation`) what this node holds
    /// whose home it is by the view numbered `epoch`. `Ok` also when
    /// superseded by a newer incarnation or view.
    async fn restore(&self, node: u32, incarnation: u64, epoch: u64) -> Result<()> {
        // Registrations begun before we heard the new incarnation end first: one
        // the previous incarnation accepted is restored, one that failed is not.
        let mark = self.rebuild.borrow().claims.watermark();
        self.registrations_before(mark).await;
        let (sent, copies) = self.holdings(node);
        let mut entries: Vec<(ObjectId, Holding)> = sent.iter().map(|(id, h)| (*id, *h)).collect();
        entries.sort_unstable_by_key(|(id, _)| *id);
        let mut conflicts = Vec::new();
        let batches = entries
            .len()
            .div_ceil(RESTORE_BATCH)
            .max(copies.len().div_ceil(RESTORE_BATCH));
        for batch in 0..batches {
            if !self.current(node, incarnation, epoch) {
                return Ok(());
            }
            let range = |len: usize| {
                (batch * RESTORE_BATCH).min(len)..((batch + 1) * RESTORE_BATCH).min(len)
            };
            let chunk = &entries[range(entries.len())];
            let (sealed, pending): (Vec<_>, Vec<_>) = chunk.iter().partition(|(_, h)| h.is_some());
            let ids: Vec<ObjectId> = sealed.iter().chain(&pending).map(|(id, _)| *id).collect();
            let request = RestoreRequest {
                incarnation,
                caller_incarnation: self.incarnation,
                sealed: pack(&sealed.iter().map(|(id, _)| *id).collect::<Vec<_>>()),
                locations: sealed
                    .iter()
                    .map(|(_, h)| to_proto(h.as_ref().expect("sealed")))
                    .collect(),
                pending: pack(&pending.iter().map(|(id, _)| *id).collect::<Vec<_>>()),
                copies: pack(&copies[range(copies.len())]),
            };
            let codes = self
                .peers
                .call(node, Reach::Try, "restore", |mut p| async move {
                    p.restore(request).await
                })
                .await?
                .codes;
            if codes.len() != ids.len() {
                return Err(ShoalError::protocol(format!(
                    "node {node} answered {} statuses for {} restored ids",
                    codes.len(),
                    ids.len()
                )));
            }
            conflicts.extend(
                ids.iter()
                    .zip(&codes)
                    .filter(|(_, &c)| c != 0)
                    .map(|(id, _)| *id),
            );
        }
        // Deletes and seals whose Unregister or Publish reached the home before
        // the Restore did were lost there: tell it again.
        let (now, _) = self.holdings(node);
        let (gone, sealed) = corrections(&sent, &now);
        if !gone.is_empty() {
            let request = Ids { ids: pack(&gone) };
            self.peers
                .call(node, Reach::Try, "unregister", |mut p| async move {
                    p.unregister(request).await
                })
                .await?;
        }
        if !sealed.is_empty() {
            let ids: Vec<ObjectId> = sealed.iter().map(|(id, _)| *id).collect();
            let locations: Vec<Location> = sealed.iter().map(|(_, l)| to_proto(l)).collect();
            let request = PublishRequest {
                ids: pack(&ids),
                locations,
            };
            self.peers
                .call(node, Reach::Try, "publish", |mut p| async move {
                    p.publish(request).await
                })
                .await?;
        }
        if !self.current(node, incarnation, epoch) {
            return Ok(());
        }
        let request = RestoredRequest { incarnation };
        self.peers
            .call(node, Reach::Try, "restored", |mut p| async move {
                p.restored(request).await
            })
            .await?;
        if !conflicts.is_empty() {
            tracing::warn!(
                node,
                conflicts = conflicts.len(),
                first = %conflicts[0],
                "ids this node owns are registered to another owner at their home; \
                 they stay readable here but not from other nodes"
            );
        }
        if sent.is_empty() && copies.is_empty() {
            tracing::debug!(node, "nothing to restore at a node that started");
        } else {
            tracing::info!(
                node,
                ids = sent.len(),
                copies = copies.len(),
                corrected = gone.len() + sealed.len(),
                "restored the directory entries of a node that started"
            );
        }
        Ok(())
    }
}

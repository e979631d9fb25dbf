//! Adoption: the backing store of a node removed from the cluster for good
//! is served by a survivor (docs/cluster.md, "Adoption"; a membership
//! service only).
//!
//! When a view removes node `x`, one member adopts `x`'s backing store (the
//! cluster file's `backing` for `x`): the member of the view that can adopt
//! (its file entry has a tier, so it has a place for the adopted manifest)
//! with the highest rendezvous weight for `x`, so every member picks the same
//! one without a word. It takes the store over (its marker names the adopter
//! from then on: `x`, back, is refused, and no second node adopts it while
//! the adopter is a member), recovers what is there (`tiers/adopted.rs`),
//! registers those objects at their homes, and tells every member
//! (`Adopted`): their homes report the rest of `x`'s objects lost
//! (`cluster/departed.rs`). The stores `x` had adopted itself go to the same
//! member. A failed adoption (the store unreachable) is tried again every
//! [`RETRY`] while `x` stays out of the view. After a restart the adopter
//! opens again what it had adopted.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use shoal_cluster::view::{id_hash, weight};
use shoal_cluster::View;
use shoal_core::error::ErrorKind;
use shoal_core::ObjectId;

use crate::cluster::Cluster;
use crate::shutdown::Shutdown;
use crate::supervisor::Supervisor;
use crate::tiers::adopted::AdoptedObjects;
use crate::tiers::Tiers;

/// How soon an adoption that failed (its store unreachable, its objects not
/// registered) is tried again.
const RETRY: Duration = Duration::from_secs(2);

/// Whose store an adoption may take over, by the marker's current adopter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Take {
    /// The node was removed: its own store (not adopted), or one whose
    /// adopter is not a member of the view.
    Removed,
    /// A store the removed node `0` had adopted: only if it still names it.
    AdoptedBy(u32),
}

/// Starts following the views, if the cluster keeps a membership and this
/// node has tiers.
pub(crate) fn start(
    cluster: &Rc<Cluster>,
    tiers: &Rc<Tiers>,
    supervisor: &Supervisor,
    shutdown: &Shutdown,
) {
    if cluster.topology().membership.is_none() {
        return;
    }
    let follow = follow(cluster.clone(), tiers.clone(), shutdown.clone());
    supervisor.spawn_local("adoption", follow);
}

/// The member of `view` that adopts `origin`'s backing store: of those whose
/// file entry has a tier, the one with the highest rendezvous weight.
pub(crate) fn adopter(cluster: &Cluster, origin: u32, view: &View) -> Option<u32> {
    let mut key = [0u8; 20];
    key[..12].copy_from_slice(b"shoal-adopt/");
    key[12..16].copy_from_slice(&origin.to_be_bytes());
    let hash = id_hash(&ObjectId(key));
    view.members()
        .iter()
        .copied()
        .filter(|&m| cluster.has_tier(m))
        .max_by_key(|&m| weight(hash, m))
}

async fn follow(cluster: Rc<Cluster>, tiers: Rc<Tiers>, shutdown: Shutdown) {
    let me = cluster.me;
    // Stores to adopt (tried again every RETRY), and stores adopted whose
    // origin the members are not told of yet: the homes judge what is lost
    // once every store that may hold a node's objects is registered (its
    // own, and those it had adopted).
    let mut pending: BTreeMap<u32, Take> = BTreeMap::new();
    let mut done: BTreeMap<u32, u64> = BTreeMap::new();
    // What this node adopted before a restart.
    let mut reopen = true;
    let mut views = cluster.views();
    let mut before = views.borrow_and_update().clone();
    loop {
        if reopen {
            let (again, unregistered) = reopen_adopted(&cluster, &tiers).await;
            reopen = again;
            // Adopted already: a second try only registers them.
            pending.extend(unregistered.into_iter().map(|o| (o, Take::Removed)));
        }
        let view = views.borrow_and_update().clone();
        if view.epoch() > before.epoch() {
            // Members absent from the cluster file, learned from their
            // records before the view that has them was adopted.
            for node in &cluster.topology().nodes {
                tiers.learn_adoptable(node);
            }
            let missed = view.epoch() > before.epoch() + 1;
            if before.epoch() > 0 && (missed || !before.contains(me)) && view.contains(me) {
                if let Some(by) = adopted_meanwhile(&tiers).await {
                    tracing::error!(
                        by,
                        "this node's backing store was adopted by node {by} while this node \
                         was out of the cluster: stopping (start it again with an empty \
                         backing store: a new directory or bucket prefix)"
                    );
                    shutdown.trigger();
                    return;
                }
            }
            if before.epoch() > 0 {
                for left in before.members().iter().copied() {
                    if left == me
                        || view.contains(left)
                        || adopter(&cluster, left, &view) != Some(me)
                    {
                        continue;
                    }
                    pending.insert(left, Take::Removed);
                    for other in cluster.others().filter(|&n| n != left && !view.contains(n)) {
                        if cluster.adoptable(other) && tiers.can_adopt(other) {
                            pending.entry(other).or_insert(Take::AdoptedBy(left));
                        }
                    }
                }
            }
            before = view.clone();
        }
        // A node back in the view serves its own store (or finds it adopted
        // and stops, above).
        pending.retain(|origin, _| !view.contains(*origin));
        let due: Vec<(u32, Take)> = pending.iter().map(|(o, t)| (*o, *t)).collect();
        for (origin, take) in due {
            if let Some(served) = adopt(&cluster, &tiers, origin, take, &view).await {
                pending.remove(&origin);
                done.insert(origin, served);
            }
        }
        let ready: Vec<(u32, u64)> = done
            .iter()
            .filter(|(origin, _)| !pending.values().any(|t| *t == Take::AdoptedBy(**origin)))
            .map(|(o, n)| (*o, *n))
            .collect();
        for (origin, served) in ready {
            done.remove(&origin);
            cluster.announce_adopted(origin, served).await;
        }
        let retry = reopen || !pending.is_empty();
        tokio::select! {
            changed = views.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(RETRY), if retry => {}
        }
    }
}

/// Back in the view after a removal (or after views it did not see), this
/// node reads its own store's marker: a survivor may have adopted it
/// meanwhile, and then serves its objects. The adopter, if one did.
async fn adopted_meanwhile(tiers: &Tiers) -> Option<u32> {
    match tiers.own_store_adopted_by().await {
        Ok(by) => by,
        Err(err) => {
            tracing::warn!(%err, "could not read this node's backing store marker");
            None
        }
    }
}

/// One adoption: `None` to try again later (the store unreachable, or not
/// this node's to take now: its node stopped cleanly and is expected back,
/// or a member serves it), else how many objects it serves now (0: nothing
/// to adopt).
async fn adopt(
    cluster: &Rc<Cluster>,
    tiers: &Tiers,
    origin: u32,
    take: Take,
    view: &View,
) -> Option<u64> {
    if !cluster.adoptable(origin) {
        return Some(0); // its file entry names no backing store
    }
    if !tiers.can_adopt(origin) {
        tracing::warn!(
            origin,
            "cannot adopt this node's backing store: no place for its manifest here"
        );
        return Some(0);
    }
    let members = view.members().to_vec();
    let may_take = move |by: Option<u32>| match take {
        Take::Removed => by.is_none_or(|b| !members.contains(&b)),
        Take::AdoptedBy(gone) => by == Some(gone),
    };
    match tiers.adopt(origin, may_take).await {
        Ok(adopted) => {
            if cluster.view().contains(origin) {
                // It came back while this node took its store over: it stops
                // when it reads the marker; this node serves the store.
                tracing::warn!(
                    origin,
                    "a node came back while its backing store was adopted"
                );
            }
            enter(cluster, tiers, origin, adopted).await
        }
        Err(err) if err.kind() == ErrorKind::ObjectNotFound && take == Take::Removed => {
            tracing::warn!(origin, %err, "a removed node's backing store is not there to adopt");
            Some(0)
        }
        Err(err) if err.kind() == ErrorKind::ObjectInUse => {
            // Stopped cleanly (expected back), or served by a member that
            // tells the others itself: nothing is lost, nothing to say.
            tracing::debug!(origin, %err, "not adopted");
            None
        }
        Err(err) if err.kind() == ErrorKind::ObjectNotFound => {
            tracing::debug!(origin, %err, "not adopted");
            Some(0)
        }
        Err(err) => {
            tracing::warn!(origin, %err, "adopting a removed node's backing store failed; retrying");
            None
        }
    }
}

/// Registers what an adoption serves at the objects' homes; how many it
/// serves, or `None` to try again.
async fn enter(
    cluster: &Rc<Cluster>,
    tiers: &Tiers,
    origin: u32,
    adopted: AdoptedObjects,
) -> Option<u64> {
    match cluster.register_adopted(&adopted.objects).await {
        Ok(conflicts) => {
            if !conflicts.is_empty() {
                tracing::warn!(
                    origin,
                    conflicts = conflicts.len(),
                    "adopted objects whose ids another owner holds now: not served"
                );
                tiers.drop_adopted(&conflicts).await;
            }
            Some((adopted.objects.len() - conflicts.len()) as u64)
        }
        Err(err) => {
            tracing::warn!(origin, %err, "registering adopted objects failed; retrying");
            None
        }
    }
}

/// Opens again what this node had adopted before a restart, registers it
/// and tells the members. Returns whether some store is still to be opened,
/// and the origins whose objects are still to be registered.
async fn reopen_adopted(cluster: &Rc<Cluster>, tiers: &Tiers) -> (bool, Vec<u32>) {
    let reopened = match tiers.reopen_adopted().await {
        Ok(reopened) => reopened,
        Err(err) => {
            tracing::warn!(%err, "could not list the backing stores this node adopted");
            return (true, Vec::new());
        }
    };
    let mut again = false;
    let mut unregistered = Vec::new();
    for (origin, opened) in reopened {
        match opened {
            Ok(adopted) => match enter(cluster, tiers, origin, adopted).await {
                Some(served) => cluster.announce_adopted(origin, served).await,
                None => unregistered.push(origin),
            },
            Err(err) if err.kind() == ErrorKind::ObjectInUse => {}
            Err(err) => {
                tracing::warn!(origin, %err, "an adopted backing store did not open; retrying");
                again = true;
            }
        }
    }
    (again, unregistered)
}

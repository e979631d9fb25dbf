//! Gets of objects other nodes own: from this node's loans when it holds
//! one, else one Lookup per home (for ids whose owner is not cached) and one
//! Acquire per owner, which takes a reference there for this node.

use std::collections::HashMap;

use shoal_cluster::ids::pack;
use shoal_cluster::proto::{AcquireReply, AcquireRequest, Ids};
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ClientId;
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

use crate::cluster::loans::{Grant, Loan};
use crate::cluster::peers::{by_node, join_all, Reach};
use crate::cluster::ref_journal::RefJournal;
use crate::cluster::state::{remember_owner, Cluster, Remote};

/// An owner's answer to Acquire.
struct Granted {
    /// The owner's incarnation (its region's generation).
    generation: u64,
    /// Revokes the owner had sent when it answered (`loans`).
    revokes: u64,
    /// Per id, where it is sealed (now referenced by this node), or `None`.
    locations: Vec<Option<ObjectLocation>>,
    /// Granted before a fence this node has heard of since (`fencing`): the
    /// owner holds these references in quarantine.
    fenced: bool,
}

/// What a remote get found: per id the object, or `None`; and for ids not
/// found, the node that could not be reached to find them (their owner, or
/// their home when no live node had them), if that is why.
pub struct RemoteFound {
    pub found: Vec<Option<Remote>>,
    pub unreachable: Vec<Option<u32>>,
}

impl Cluster {
    /// Finds ids on other nodes and takes a reference on each for `client`.
    /// `None` for ids not sealed anywhere (yet), with the node that could not
    /// be reached where that is why.
    pub async fn get(&self, client: ClientId, ids: &[ObjectId]) -> Result<RemoteFound> {
        // A starting node takes no references before its peers heard it
        // started (they drop the references of its previous incarnation).
        self.until_ready().await;
        let mut found = self.borrow_loans(client, ids);
        let mut owners: Vec<Option<u32>> = {
            let cache = self.owners.borrow();
            ids.iter()
                .zip(&found)
                .map(|(id, f)| f.is_none().then(|| cache.get(id).copied()).flatten())
                .collect()
        };
        let mut unreachable: Vec<Option<u32>> = vec![None; ids.len()];
        for attempt in 0..2 {
            let unknown: Vec<usize> = (0..ids.len())
                .filter(|&i| owners[i].is_none() && found[i].is_none())
                .collect();
            if !unknown.is_empty() {
                let wanted: Vec<ObjectId> = unknown.iter().map(|&i| ids[i]).collect();
                let (lookups, homes_down) = self.lookup(&wanted).await;
                for (&i, owner) in unknown.iter().zip(lookups) {
                    owners[i] = owner.filter(|&o| o != self.me);
                }
                if !homes_down.is_empty() {
                    // Their home is down, but the owner may be alive: ask
                    // every live peer (only the owner has it).
                    let orphans: Vec<usize> = homes_down.iter().map(|&k| unknown[k]).collect();
                    self.search_live_peers(client, ids, &orphans, &mut found)
                        .await;
                    for &i in &orphans {
                        if found[i].is_none() {
                            unreachable[i] = Some(self.home(&ids[i]));
                        }
                    }
                }
            }
            let wanted: Vec<usize> = (0..ids.len())
                .filter(|&i| found[i].is_none() && owners[i].is_some())
                .collect();
            if wanted.is_empty() {
                break;
            }
            let mut groups: HashMap<u32, Vec<usize>> = HashMap::new();
            for &i in &wanted {
                groups
                    .entry(owners[i].expect("wanted"))
                    .or_default()
                    .push(i);
            }
            let calls = groups.into_iter().map(|(owner, slots)| {
                let group: Vec<ObjectId> = slots.iter().map(|&i| ids[i]).collect();
                async move {
                    let reply = self.acquire(owner, &group).await;
                    (owner, slots, group, reply)
                }
            });
            let mut stale = false;
            for (owner, slots, group, reply) in join_all(calls).await {
                // An owner that is down: its objects stay missing, the rest are found.
                let granted = match reply {
                    Ok(granted) => granted,
                    Err(err) if err.kind() == ErrorKind::NodeUnavailable => {
                        tracing::debug!(%err, "acquire");
                        for &slot in &slots {
                            owners[slot] = None;
                            unreachable[slot] = Some(owner);
                        }
                        continue;
                    }
                    Err(err) => return Err(err),
                };
                // A descriptor outside the owner's region is refused before
                // anything uses it; the references the reply took go back.
                if let Some(bad) = granted
                    .locations
                    .iter()
                    .flatten()
                    .find(|l| self.check_location(owner, l).is_err())
                {
                    let taken: Vec<(u32, ObjectId)> = group
                        .iter()
                        .zip(&granted.locations)
                        .filter(|(_, l)| l.is_some())
                        .map(|(id, _)| (owner, *id))
                        .collect();
                    self.release(taken).await;
                    return Err(ShoalError::protocol(format!(
                        "node {owner} sent a descriptor outside its region: {bad:?}"
                    )));
                }
                let network = self.is_network(owner);
                let mut cache = self.owners.borrow_mut();
                let mut loans = self.loans.borrow_mut();
                for (k, (&slot, id)) in slots.iter().zip(&group).enumerate() {
                    match granted.locations.get(k).copied().flatten() {
                        Some(location) => {
                            found[slot] = Some(Remote {
                                owner,
                                generation: granted.generation,
                                location,
                                network,
                            });
                            unreachable[slot] = None;
                            remember_owner(&mut cache, *id, owner);
                            let grant = Grant {
                                owner,
                                generation: granted.generation,
                                location,
                                revokes: granted.revokes,
                                fenced: granted.fenced,
                            };
                            loans.acquired(client, *id, grant, !network);
                        }
                        None => {
                            // Deleted there, or not sealed yet: ask the home again.
                            cache.remove(id);
                            owners[slot] = None;
                            stale = true;
                        }
                    }
                }
            }
            if !stale || attempt == 1 {
                break;
            }
        }
        for (slot, f) in unreachable.iter_mut().zip(&found) {
            if f.is_some() {
                *slot = None;
            }
        }
        Ok(RemoteFound { found, unreachable })
    }

    /// Ids served from this node's loans (one more user each): only loans
    /// of owners not known to be down (a missed heartbeat), at the
    /// incarnation that lent them.
    fn borrow_loans(&self, client: ClientId, ids: &[ObjectId]) -> Vec<Option<Remote>> {
        let mut loans = self.loans.borrow_mut();
        if loans.len() == 0 {
            return vec![None; ids.len()];
        }
        let usable = |loan: &Loan| {
            !self.peers.known_down(loan.owner)
                && self
                    .peers
                    .incarnation_of(loan.owner)
                    .is_some_and(|i| i == 0 || i == loan.generation)
        };
        loans
            .borrow(client, ids, usable)
            .into_iter()
            .map(|loan| {
                loan.map(|loan| Remote {
                    owner: loan.owner,
                    generation: loan.generation,
                    location: loan.location,
                    network: false,
                })
            })
            .collect()
    }

    /// Takes references on ids whose home is down by asking every live peer.
    async fn search_live_peers(
        &self,
        client: ClientId,
        ids: &[ObjectId],
        slots: &[usize],
        found: &mut [Option<Remote>],
    ) {
        let wanted: Vec<ObjectId> = slots.iter().map(|&i| ids[i]).collect();
        let live: Vec<u32> = self.others().filter(|&n| self.is_alive(n)).collect();
        let calls = live.into_iter().map(|node| {
            let wanted = &wanted;
            async move { (node, self.acquire(node, wanted).await) }
        });
        let mut surplus = Vec::new();
        for (node, reply) in join_all(calls).await {
            let Ok(granted) = reply else {
                continue;
            };
            let (generation, network) = (granted.generation, self.is_network(node));
            for (k, location) in granted.locations.into_iter().enumerate() {
                let Some(location) = location else { continue };
                if found[slots[k]].is_some() || self.check_location(node, &location).is_err() {
                    // Another node also had it (a network copy): give its reference back.
                    surplus.push((node, wanted[k]));
                    continue;
                }
                found[slots[k]] = Some(Remote {
                    owner: node,
                    generation,
                    location,
                    network,
                });
                remember_owner(&mut self.owners.borrow_mut(), wanted[k], node);
                let grant = Grant {
                    owner: node,
                    generation,
                    location,
                    revokes: granted.revokes,
                    fenced: granted.fenced,
                };
                self.loans
                    .borrow_mut()
                    .acquired(client, wanted[k], grant, !network);
            }
        }
        if !surplus.is_empty() {
            self.release(surplus).await;
        }
    }

    /// Owner of each id per its home (`None` where unknown or not sealed),
    /// and the positions of ids whose home did not answer.
    pub(crate) async fn lookup(&self, ids: &[ObjectId]) -> (Vec<Option<u32>>, Vec<usize>) {
        let mut owners = vec![None; ids.len()];
        let mut homes_down = Vec::new();
        let view = self.view_attempt();
        // Positions in `ids` still to ask; those a view change overtook are
        // asked again at their new homes.
        let mut asking: Vec<usize> = (0..ids.len()).collect();
        while !asking.is_empty() {
            let wanted: Vec<ObjectId> = asking.iter().map(|&i| ids[i]).collect();
            let groups = by_node(&wanted, |id| self.home(id));
            let calls = groups.into_iter().map(|(home, positions)| {
                let group: Vec<ObjectId> = positions.iter().map(|&k| wanted[k]).collect();
                let positions: Vec<usize> = positions.iter().map(|&k| asking[k]).collect();
                async move {
                    let reply = if home == self.me {
                        self.local_lookup(&group)
                    } else {
                        let request = Ids { ids: pack(&group) };
                        self.peers
                            .call(home, Reach::FailFast, "lookup", |mut p| async move {
                                p.lookup(request).await
                            })
                            .await
                    };
                    (positions, reply)
                }
            });
            let mut again = Vec::new();
            for (positions, reply) in join_all(calls).await {
                let reply = match reply {
                    Ok(reply) => reply,
                    Err(err) if self.ask_again(&err, &view).await => {
                        again.extend(positions);
                        continue;
                    }
                    Err(err) => {
                        tracing::debug!(%err, "lookup failed");
                        homes_down.extend(positions);
                        continue;
                    }
                };
                for (&i, entry) in positions.iter().zip(reply.entries) {
                    if entry.known && entry.sealed {
                        owners[i] = Some(entry.owner);
                    }
                }
            }
            asking = again;
        }
        (owners, homes_down)
    }

    /// References `ids` at `owner`: per id its location if it is sealed there.
    async fn acquire(&self, owner: u32, ids: &[ObjectId]) -> Result<Granted> {
        // Numbered once it is sent (not when refused before): an answer
        // that is lost leaves references at the owner, undone by number.
        let sent: std::cell::RefCell<Option<SentAcquire>> = Default::default();
        let fence_epoch = self.fence_heard_from(owner);
        let answer = self
            .peers
            .call(owner, Reach::FailFast, "acquire", |mut p| {
                let numbered = self.journal.borrow_mut().begin(owner);
                *sent.borrow_mut() = Some(SentAcquire {
                    journal: &self.journal,
                    owner,
                    seq: numbered.seq,
                    fence_epoch,
                });
                let request = AcquireRequest {
                    ids: pack(ids),
                    incarnation: self.incarnation,
                    seq: numbered.seq,
                    settled: numbered.settled,
                };
                async move { p.acquire(request).await }
            })
            .await;
        // An answer that cannot be read counts as lost (its references are
        // undone too).
        let answer = answer.and_then(|reply| {
            let locations = shoal_cluster::ids::locations(&reply.entries, ids.len())
                .map_err(|s| ShoalError::protocol(format!("node {owner}: {}", s.message())))?;
            Ok((reply, locations))
        });
        if let Some(sent) = sent.take() {
            match &answer {
                Ok(_) => sent.answered(),
                Err(err) => {
                    tracing::debug!(owner, %err, "acquire failed; undone when the owner answers");
                    // (Dropping it records the failure.)
                    drop(sent);
                }
            }
        }
        let (
            AcquireReply {
                incarnation,
                revokes,
                fence_epoch,
                ..
            },
            locations,
        ) = answer?;
        // It heard us just now: our lease there runs from here too.
        self.peers.answered(owner);
        Ok(Granted {
            generation: incarnation,
            revokes,
            locations,
            fenced: self.heard_grant(owner, fence_epoch),
        })
    }

    /// Deletes ids owned elsewhere at their owners; per-id error kinds.
    pub async fn delete_remote(&self, ids: &[ObjectId]) -> Vec<Option<ErrorKind>> {
        self.until_ready().await;
        let (mut owners, homes_down) = self.lookup(ids).await;
        let mut results = vec![Some(ErrorKind::ObjectNotFound); ids.len()];
        // A home that does not answer cannot say who owns its ids: the owner
        // cached here is asked, or one whose index publishes it (its
        // clients' gets read it there), else the delete cannot be done now.
        for &i in &homes_down {
            let cached = self.owners.borrow().get(&ids[i]).copied();
            owners[i] = cached.or_else(|| self.owner_by_index(&ids[i]));
            if owners[i].is_none() {
                results[i] = Some(ErrorKind::NodeUnavailable);
            }
        }
        let known: Vec<usize> = (0..ids.len()).filter(|&i| owners[i].is_some()).collect();
        let mut by_owner: HashMap<u32, Vec<usize>> = HashMap::new();
        for i in known {
            by_owner
                .entry(owners[i].expect("known"))
                .or_default()
                .push(i);
        }
        for (owner, positions) in by_owner {
            if owner == self.me {
                continue; // not here any more (the local delete found nothing)
            }
            let request = Ids {
                ids: pack(&positions.iter().map(|&i| ids[i]).collect::<Vec<_>>()),
            };
            let reply = self
                .peers
                .call(owner, Reach::FailFast, "delete", |mut p| async move {
                    p.delete(request).await
                })
                .await;
            match reply {
                Ok(reply) => {
                    for (&i, code) in positions.iter().zip(reply.codes) {
                        results[i] = ErrorKind::from_code(code as u16);
                        self.owners.borrow_mut().remove(&ids[i]);
                    }
                }
                Err(_) => {
                    for &i in &positions {
                        results[i] = Some(ErrorKind::NodeUnavailable);
                    }
                }
            }
        }
        results
    }
}

/// An Acquire that was sent and is not settled yet. Dropped unanswered —
/// it failed, or the get waiting on it went away (its client hung up) —
/// it is recorded to be undone when the owner answers again.
struct SentAcquire<'a> {
    journal: &'a std::cell::RefCell<RefJournal>,
    owner: u32,
    seq: u64,
    fence_epoch: u64,
}

impl SentAcquire<'_> {
    fn answered(self) {
        self.journal.borrow_mut().answered(self.owner, self.seq);
        std::mem::forget(self);
    }
}

impl Drop for SentAcquire<'_> {
    fn drop(&mut self) {
        self.journal
            .borrow_mut()
            .acquire_failed(self.owner, self.seq, self.fence_epoch);
    }
}

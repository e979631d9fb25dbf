//! As an owner: claiming ids at their homes before creating them,
//! publishing where they are sealed, and giving them up when they go.

use std::cell::RefCell;

use shoal_cluster::ids::pack;
use shoal_cluster::proto::{Ids, PublishRequest, RegisterRequest};
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

use crate::cluster::peers::{by_node, join_all, Reach};
use crate::cluster::state::{to_proto, Cluster};

impl Cluster {
    /// Registers ids for this node at their homes, all or none.
    pub async fn register(&self, ids: &[ObjectId]) -> Result<()> {
        // All or none: a failed attempt gave back what it claimed, so one a
        // view change overtook is asked again by the newer view.
        let result = self
            .by_current_view(|| async {
                // A starting node claims nothing before its peers heard it started.
                self.until_ready().await;
                let ticket = self.rebuild.borrow_mut().claims.begin();
                let result = self.register_at_homes(ids).await;
                let claimed = if result.is_ok() { ids } else { &[] };
                self.rebuild.borrow_mut().claims.end(ticket, claimed);
                result
            })
            .await;
        match result {
            // Refused for the view (a home on a newer one, or this node's
            // own directory while cut off): no other id would do.
            Err(err) if !self.acts_as_home() && err.kind().is_node_unavailable() => {
                Err(self.out_of_touch(&err))
            }
            other => other,
        }
    }

    async fn register_at_homes(&self, ids: &[ObjectId]) -> Result<()> {
        let groups = by_node(ids, |id| self.home(id));
        let calls = groups.iter().map(|(home, positions)| {
            let group: Vec<ObjectId> = positions.iter().map(|&i| ids[i]).collect();
            async move {
                let codes = if *home == self.me {
                    self.directory_register(&group, self.me).codes
                } else {
                    let request = RegisterRequest {
                        ids: pack(&group),
                        owner: self.me,
                        incarnation: self.incarnation,
                    };
                    let reply = self
                        .peers
                        .call(*home, Reach::FailFast, "register", |mut p| async move {
                            p.register(request).await
                        })
                        .await;
                    match reply {
                        Ok(reply) => reply.codes,
                        Err(err) => return Err((*home, group, err)),
                    }
                };
                Ok::<_, (u32, Vec<ObjectId>, ShoalError)>((*home, group, codes))
            }
        });
        let mut failure = None;
        let mut registered = Vec::new();
        for result in join_all(calls).await {
            match result {
                Ok((home, group, codes)) => {
                    if let Some(pos) = codes.iter().position(|&c| c != 0) {
                        let kind = ErrorKind::from_code(codes[pos] as u16)
                            .unwrap_or(ErrorKind::ObjectExists);
                        let id = group[pos];
                        failure.get_or_insert(match kind {
                            k if k.is_node_unavailable() => ShoalError::new(
                                ErrorKind::HomeUnavailable,
                                format!(
                                    "the home of object {id}, node {home}, is rebuilding its \
                                     directory after a restart"
                                ),
                            ),
                            // The home's code for an id whose old copies are not
                            // all dropped yet: the id is still taken.
                            ErrorKind::ObjectInUse => ShoalError::new(
                                ErrorKind::ObjectExists,
                                format!(
                                    "object {id} was deleted, but node {home} (its home) has not \
                                     yet told every node keeping a network copy of it to drop \
                                     the copy (one is unreachable); it can be created again \
                                     once they are told"
                                ),
                            ),
                            _ => ShoalError::new(
                                kind,
                                format!("object {id} already exists in the cluster"),
                            ),
                        });
                    } else {
                        // Claimed anew: an unregister it missed must not free them.
                        if let Some(missed) = self.unregister_later.borrow_mut().get_mut(&home) {
                            for id in &group {
                                missed.remove(id);
                            }
                        }
                        registered.extend(group);
                    }
                }
                Err((home, group, err)) => {
                    // Failed, or only its answer was lost: the home may hold
                    // the claim. It is told to forget it when it answers a
                    // heartbeat (ids this node holds by then are kept).
                    let first = group[0];
                    let mut later = self.unregister_later.borrow_mut();
                    later.entry(home).or_default().extend(group);
                    // A home whose TLS handshake failed (its certificate refused
                    // here, or ours there) is out of reach for this node as much as
                    // one that is down: the create may go on under another id.
                    let unreachable = err.kind().is_node_unavailable()
                        || err.kind() == ErrorKind::PermissionDenied;
                    failure.get_or_insert(if unreachable {
                        ShoalError::new(
                            ErrorKind::HomeUnavailable,
                            format!(
                                "the home of object {first}, node {home}, is unreachable: {}",
                                err.message()
                            ),
                        )
                    } else {
                        err
                    });
                }
            }
        }
        match failure {
            None => Ok(()),
            Some(err) => {
                self.unregister(&registered).await;
                Err(err)
            }
        }
    }

    /// Unregisters ids this node no longer holds (a home that does not
    /// answer is told again when it answers a heartbeat).
    pub async fn unregister(&self, ids: &[ObjectId]) {
        if ids.is_empty() {
            return;
        }
        self.rebuild.borrow_mut().claims.settle(ids);
        let view = self.view_attempt();
        let mut asking = ids.to_vec();
        while !asking.is_empty() {
            // Groups a view change overtook, asked again at their new homes.
            let again = RefCell::new(Vec::new());
            let groups = by_node(&asking, |id| self.home(id));
            let calls = groups.into_iter().map(|(home, positions)| {
                let group: Vec<ObjectId> = positions.iter().map(|&i| asking[i]).collect();
                let (again, view) = (&again, &view);
                async move {
                    if home == self.me {
                        let stale = self.directory_unregister(&group, self.me);
                        self.send_drops(stale).await;
                        return;
                    }
                    let request = Ids { ids: pack(&group) };
                    let outcome = self
                        .peers
                        .call(home, Reach::FailFast, "unregister", |mut p| async move {
                            p.unregister(request).await
                        })
                        .await;
                    if let Err(err) = outcome {
                        if self.ask_again(&err, view).await {
                            again.borrow_mut().extend(group);
                            return;
                        }
                        tracing::debug!(home, %err, "unregister failed; sent again when the home answers");
                        let mut later = self.unregister_later.borrow_mut();
                        later.entry(home).or_default().extend(group);
                    }
                }
            });
            join_all(calls).await;
            asking = again.into_inner();
        }
    }

    /// Sends `home` the unregisters it missed (kept for the next heartbeat
    /// if it fails again).
    pub async fn unregister_missed(&self, home: u32) {
        let Some(ids) = self.unregister_later.borrow_mut().remove(&home) else {
            return;
        };
        // Not an id this node holds now (created since, or a claim whose
        // register answer was lost while this node already held the id). A
        // deleted object that references still keep here (a peer cut off
        // when it was deleted, its references quarantined) is not held: its
        // id leaves the home now, as a delete's does when the home answers.
        // Counting it as held dropped the unregister for good whenever the
        // home answered a heartbeat before the fence was confirmed: the id
        // stayed taken and the home's copy of it kept serving.
        let ids: Vec<ObjectId> = {
            let rebuild = self.rebuild.borrow();
            self.node.read(|store| {
                ids.into_iter()
                    .filter(|id| {
                        (!store.knows(id) || store.is_deleted(id))
                            && !self.node.held_below(id)
                            && !rebuild.claims.is_claimed(id)
                    })
                    .collect()
            })
        };
        if ids.is_empty() {
            return;
        }
        let request = Ids { ids: pack(&ids) };
        let outcome = self
            .peers
            .call(home, Reach::Try, "unregister", |mut p| async move {
                p.unregister(request).await
            })
            .await;
        match outcome {
            Ok(_) => tracing::info!(
                home,
                ids = ids.len(),
                "sent a home the unregisters it missed (ids freed, or claims whose answers were lost)"
            ),
            Err(err) => {
                tracing::debug!(home, %err, "unregister failed again");
                let mut later = self.unregister_later.borrow_mut();
                later.entry(home).or_default().extend(ids);
            }
        }
    }

    /// Tells the homes where sealed ids live; done when every home has it.
    pub async fn publish(&self, ids: &[ObjectId], locations: &[ObjectLocation]) -> Result<()> {
        self.rebuild.borrow_mut().claims.settle(ids);
        // Publishing again is harmless: asked again whole by a newer view.
        self.by_current_view(|| self.publish_at_homes(ids, locations))
            .await
    }

    async fn publish_at_homes(&self, ids: &[ObjectId], locations: &[ObjectLocation]) -> Result<()> {
        let groups = by_node(ids, |id| self.home(id));
        let calls = groups.into_iter().map(|(home, positions)| {
            let group: Vec<ObjectId> = positions.iter().map(|&i| ids[i]).collect();
            let locs: Vec<ObjectLocation> = positions.iter().map(|&i| locations[i]).collect();
            async move {
                if home == self.me {
                    self.directory_publish(&group, &locs, self.me);
                    return Ok(());
                }
                let request = PublishRequest {
                    ids: pack(&group),
                    locations: locs.iter().map(to_proto).collect(),
                };
                self.peers
                    .call(home, Reach::Try, "publish", |mut p| async move {
                        p.publish(request).await
                    })
                    .await
                    .map(|_| ())
            }
        });
        join_all(calls).await.into_iter().collect()
    }

    /// Tells the homes where just-sealed objects live; done before the seal
    /// is answered, so a get on any node afterwards finds them.
    pub async fn announce_sealed(&self, ids: &[ObjectId]) {
        let (ids, locations): (Vec<_>, Vec<_>) = self.node.read(|store| {
            ids.iter()
                .filter_map(|id| store.location(id).map(|l| (*id, l)))
                .unzip()
        });
        if let Err(err) = self.publish(&ids, &locations).await {
            tracing::warn!(%err, "sealed, but a home node did not hear of it");
        }
    }
}

//! Membership changes (docs/cluster.md, "Membership"): the view this node
//! acts on, what a newer one changes, and calls on homes that a view change
//! overtook.
//!
//! When this node adopts a view (numbered: only a newer one is taken):
//! 1. the peer calls it sends and answers carry the new epoch
//!    (`shoal_cluster::epoch`): a node still on the old view is refused and
//!    catches up before it asks again;
//! 2. as a home, the entries of ids now homed elsewhere go: their owners
//!    restore them at the new homes, and a later view that brings an id back
//!    must not find an entry its delete never reached;
//! 3. if the view gives this node homes (it joined, or a member left), its
//!    directory waits again, as after a restart, until every live peer
//!    restored here for this view (or a lease passed), and until its own
//!    objects homed here entered it, after the registrations it began under
//!    the old view ended: no id it does not know yet is claimed, no lookup
//!    answers "unknown" for one that exists;
//! 4. what members that left held is forgotten, as a restarted node's is
//!    (directory entries they owned, copies of their objects, references);
//! 5. as an owner, it restores at every other member what is homed there
//!    now (the restart rebuild's batches, `rebuild.rs`), then says
//!    `Restored` for this view.
//!
//! Calls on homes that a view change overtook (the home refused the epoch,
//! or is rebuilding) are asked again by the newer view, within a lease:
//! creates, gets and deletes keep succeeding while homes move.

use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

use shoal_cluster::View;
use shoal_core::error::{Result, ShoalError};
use shoal_core::ObjectId;

use crate::cluster::peers::VIEW_CHANGED;
use crate::cluster::state::Cluster;

/// How soon a home call overtaken by a view change is asked again.
const RETRY_PAUSE: Duration = Duration::from_millis(5);

/// How long a call whose home did not answer waits for a newer view (the
/// home left or was removed) before it fails. etcd's watch brings a view
/// within milliseconds of its change.
const UNREACHABLE_WAIT: Duration = Duration::from_millis(100);

/// How often a call that waits for this node to be back in touch with the
/// membership service looks.
const IN_TOUCH_POLL: Duration = Duration::from_millis(10);

/// One call on homes, as view changes overtake it: until when it is asked
/// again, and the epoch its latest try chose homes by.
pub(crate) struct ViewAttempt {
    deadline: Instant,
    epoch: std::cell::Cell<u64>,
}

/// Whether `err` says a view change overtook the call: the views of caller
/// and callee differed, or the home is rebuilding its directory (after a
/// view change or a restart). Such a call is asked again.
pub(crate) fn overtaken(err: &ShoalError) -> bool {
    err.kind().is_node_unavailable()
        && (err.message().contains(VIEW_CHANGED)
            || err.message().contains("rebuilding its directory")
            || err.message().contains("is not the home of")
            || err
                .message()
                .contains("lost the cluster's membership service"))
}

impl Cluster {
    /// The view this node acts on.
    pub fn view(&self) -> View {
        self.view.borrow().clone()
    }

    /// Every view this node adopts from now on (the current one first).
    pub fn views(&self) -> tokio::sync::watch::Receiver<View> {
        self.views.subscribe()
    }

    /// Takes `view` if it is newer than this node's (an older or equal one
    /// is ignored), and does what it changes (the module's steps 1–5).
    pub fn adopt_view(self: &Rc<Self>, view: View) {
        let before = {
            let mut current = self.view.borrow_mut();
            if view.epoch() <= current.epoch() {
                return;
            }
            std::mem::replace(&mut *current, view.clone())
        };
        self.epoch.raise(view.epoch());
        self.witness_view_changed();
        let me = self.me;
        let member = view.contains(me);
        // Homes come to this node when it joins and when a member leaves;
        // after views it missed (cut off from etcd meanwhile), anything
        // may have moved here and back, deleted on the way.
        let missed = before.epoch() > 0 && view.epoch() > before.epoch() + 1;
        // The file's provisional view (epoch 0) lists only the nodes the
        // file knows: members it lacks may own ids homed here now, and the
        // start's wait was not for them.
        let unknown_at_start =
            before.epoch() == 0 && view.members().iter().any(|m| !before.contains(*m));
        let gains = member
            && (missed
                || unknown_at_start
                || !before.contains(me)
                || before.members().iter().any(|m| !view.contains(*m)));
        // What members that left owned here (before the entries go below):
        // adopted from their backing stores, or reported lost (`departed`).
        let leavers: Vec<(u32, Vec<ObjectId>)> = if before.epoch() > 0 {
            let directory = self.directory.borrow();
            before
                .members()
                .iter()
                .filter(|&&n| n != me && !view.contains(n))
                .map(|&n| {
                    // And those it was home of itself, as witnessed here.
                    let mut ids = directory.sealed_of(n);
                    ids.extend(self.witnessed_of(n));
                    (n, ids)
                })
                .collect()
        } else {
            Vec::new()
        };
        // Owners restore at every member everything homed there: a home that
        // gains ids starts again from what they restore, as after a restart
        // (an entry kept from before could be one whose delete went to
        // another home meanwhile).
        let moved_away = self
            .directory
            .borrow_mut()
            .keep_homed(|id| member && !gains && view.home(id) == me);
        if gains {
            let round = self
                .rebuild
                .borrow_mut()
                .readiness
                .again(Instant::now(), view.members());
            // Its own objects homed here now: nobody else restores those.
            self.restore_own_for_view(round);
        }
        // What members that left held is gone for the cluster, as a
        // restarted node's is (its entries here, copies of its objects,
        // references on them). Not for the file's provisional view a
        // member starts with (epoch 0): nobody held anything yet.
        for (left, ids) in leavers {
            self.forget_incarnation(left);
            self.departed(left, ids);
        }
        if before.epoch() > 0 {
            for &back in view.members().iter().filter(|&&n| !before.contains(n)) {
                self.returned(back);
            }
        }
        tracing::info!(
            %view,
            %before,
            entries_dropped = moved_away,
            waits_for_restores = gains,
            "adopted the cluster's view"
        );
        for node in view.members().iter().copied().filter(|&n| n != me) {
            // A member not heard from yet is restored at on its first
            // heartbeat (`heard`), by the view of then.
            if let Some(incarnation) = self.peers.incarnation_of(node).filter(|&i| i != 0) {
                self.restore_for_view(node, incarnation);
            }
        }
        self.views.send_replace(view.clone());
        // Unregisters owed to a node that is no longer a member go to the
        // ids' homes now.
        let owed: Vec<ObjectId> = {
            let mut later = self.unregister_later.borrow_mut();
            let gone: Vec<u32> = later
                .keys()
                .copied()
                .filter(|&home| !view.contains(home))
                .collect();
            gone.into_iter()
                .filter_map(|home| later.remove(&home))
                .flatten()
                .collect()
        };
        for id in owed {
            let home = self.home(&id);
            self.unregister_later
                .borrow_mut()
                .entry(home)
                .or_default()
                .insert(id);
        }
    }

    /// Whether this node is in touch with its membership service, as its
    /// lease renewals say (the membership's roster).
    pub fn set_membership_link(&self, in_touch: bool) {
        if self.epoch.in_touch() != in_touch {
            if in_touch {
                tracing::info!("in touch with the membership service again");
            } else {
                tracing::warn!(
                    "lost the membership service (no lease renewal for nearly its TTL): this \
                     node acts as a home only while its peers have lost it too"
                );
            }
        }
        self.epoch.set_in_touch(in_touch);
    }

    /// Whether this node is in touch with its membership service (always,
    /// with a static file).
    pub fn membership_in_touch(&self) -> bool {
        self.epoch.in_touch()
    }

    /// A heartbeat of `node` said whether it is in touch with the
    /// membership service.
    pub fn heard_membership_link(&self, node: u32, in_touch: bool) {
        if let Some(slot) = self.peers_in_touch.borrow_mut().get_mut(node as usize) {
            *slot = in_touch.then(std::time::Instant::now);
        }
    }

    /// Whether this node keeps a directory and answers for the ids it is
    /// home for. Without the membership service it may be out of the view
    /// the others follow (removed after its TTL, its homes moved): it acts
    /// as a home only with proof that the service is down for everyone — a
    /// member heard from within a lease, and none that said it is in touch
    /// — or as the view's only member. A static file's nodes always do.
    pub fn acts_as_home(&self) -> bool {
        if self.topology().membership.is_none() || self.epoch.in_touch() {
            return true;
        }
        let lease = self.topology().lease;
        // Any node of the file that says it is in touch, member or not: the
        // service is up and this node is the one cut off. Its view may be
        // stale (a watch stuck on a dead etcd member kept one node on the
        // view of only itself while the others moved on).
        let in_touch = self.peers_in_touch.borrow();
        if self.others().any(|n| {
            let said_in_touch = in_touch.get(n as usize).copied().flatten();
            said_in_touch.is_some_and(|t| t.elapsed() < lease)
        }) {
            return false;
        }
        let view = self.view.borrow();
        if view.members() == [self.me] {
            return true;
        }
        view.members()
            .iter()
            .filter(|&&m| m != self.me)
            .any(|&m| self.peers.heard_within(m, lease))
    }

    /// Waits until `deadline` for this node to act as a home again
    /// ([`Self::acts_as_home`]); whether it does. Polls: only a node cut off
    /// from the membership service waits here.
    async fn back_in_touch(&self, deadline: Instant) -> bool {
        while !self.acts_as_home() {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(IN_TOUCH_POLL).await;
        }
        true
    }

    /// The error of a call on homes that this node cannot make while it is
    /// cut off from the membership service and its peers are not
    /// ([`Self::acts_as_home`]): its view may be stale, so no id's home is
    /// known. About the node, not one id's home (`NodeUnavailable`, not
    /// `HomeUnavailable`): a create that swaps ids whose home is unreachable
    /// must not try others.
    pub(crate) fn out_of_touch(&self, err: &ShoalError) -> ShoalError {
        ShoalError::new(
            shoal_core::error::ErrorKind::NodeUnavailable,
            format!(
                "node {} lost the cluster's membership service while its peers did not: it \
                 registers no object until it is back in touch (its view, epoch {}, may be \
                 stale; {})",
                self.me,
                self.epoch.get(),
                err.message()
            ),
        )
    }

    /// A call on homes starts now: asked again while view changes overtake
    /// it, for at most a lease.
    pub(crate) fn view_attempt(&self) -> ViewAttempt {
        ViewAttempt {
            deadline: Instant::now() + self.topology().lease,
            epoch: std::cell::Cell::new(self.epoch.get()),
        }
    }

    /// Whether a call on homes that failed with `err` is asked again (by
    /// the view of then, after a short pause); only where views change (a
    /// membership service), only before the attempt's deadline:
    /// - a view change overtook it (the home refused our epoch, or is
    ///   rebuilding after one);
    /// - the home did not answer and a newer view comes within
    ///   [`UNREACHABLE_WAIT`] (it left, or was removed, as we called it).
    pub(crate) async fn ask_again(&self, err: &ShoalError, attempt: &ViewAttempt) -> bool {
        if self.topology().membership.is_none() || Instant::now() >= attempt.deadline {
            return false;
        }
        // Cut off from the membership service while its peers are not, this
        // node gets no newer view to ask again by until it is back in touch:
        // an etcd election or a broken watch passes within a second or so.
        if !self.back_in_touch(attempt.deadline).await {
            return false;
        }
        let again = if overtaken(err) {
            tokio::time::sleep(RETRY_PAUSE).await;
            true
        } else if err.kind().is_node_unavailable() {
            self.epoch
                .reach(attempt.epoch.get() + 1, UNREACHABLE_WAIT)
                .await
        } else {
            false
        };
        if again {
            tracing::debug!(%err, "a view change overtook a call on homes; asking again");
            attempt.epoch.set(self.epoch.get());
        }
        again
    }

    /// Runs `attempt` (a call on homes, which picks them by the current
    /// view) again while a view change overtakes it ([`Self::ask_again`]).
    pub(crate) async fn by_current_view<T, F, Fut>(&self, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let view = self.view_attempt();
        loop {
            match attempt().await {
                Err(err) if self.ask_again(&err, &view).await => {}
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use shoal_core::error::ErrorKind;
    use shoal_core::location::ObjectLocation;

    use super::*;
    use crate::cluster::state::ClusterConfig;

    /// Node 0 of three, on `view`, ready (its peers restored for it), with
    /// nobody to call: no peer is ever heard from.
    fn node_0(dir: &std::path::Path, view: View) -> Rc<Cluster> {
        node_0_with(dir, view, false)
    }

    /// [`node_0`], its cluster's membership in an etcd (never reached) with
    /// `membership`.
    fn node_0_with(dir: &std::path::Path, view: View, membership: bool) -> Rc<Cluster> {
        const SIZE: u64 = 1 << 20;
        let mut topology = shoal_testing::loopback_topology("views", 3, SIZE, Duration::ZERO, dir);
        if membership {
            topology.membership = Some(shoal_cluster::MembershipConfig {
                url: "etcd://127.0.0.1:1/shoal/views".parse().unwrap(),
                ttl: Duration::from_secs(1),
                grace: Duration::ZERO,
                max_nodes: shoal_cluster::topology::DEFAULT_MAX_NODES,
            });
        }
        let region = shoal_core::region::Region::create(&dir.join("region"), SIZE).unwrap();
        let store = shoal_store::store::Store::new(
            SIZE,
            SIZE,
            64,
            Box::new(shoal_store::eviction::Lru::default()),
        );
        let node = crate::node::Node::new(store, region, false);
        let config = ClusterConfig { topology, node: 0 };
        let epoch = view.epoch();
        let cluster = Rc::new(
            Cluster::new(&config, node, crate::supervisor::Supervisor::new(), 1, view).unwrap(),
        );
        for peer in [1, 2] {
            cluster.restored_by(peer, cluster.incarnation, Some(epoch));
        }
        assert!(cluster.directory_ready());
        cluster
    }

    /// A create on node 0 registered its id at node 2, the id's home by
    /// view 5; before the answer came back node 2 left (view 6) and the id's
    /// home is node 0 itself. Node 0 restores its own ids (no peer restores
    /// them here) only once that registration ended, and is not ready (no
    /// lookup answered, no id claimed) until then: a snapshot taken when the
    /// view came had missed the id, its Publish found no entry here, and
    /// every get of the object from another node answered "not found".
    /// Out of touch with the membership service, a node acts as a home only
    /// with proof that the service is down for everyone: not while any node
    /// of the file says it is in touch, even one its (perhaps stale) view
    /// does not list; alone in its view and hearing no such node, it goes on
    /// (a one-node cluster whose etcd is down).
    #[test]
    fn a_node_out_of_touch_is_no_home_while_any_node_says_it_is_in_touch() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _in_runtime = runtime.enter();
        let dir = tempfile::tempdir().unwrap();
        let cluster = node_0_with(dir.path(), View::new(1, [0]).unwrap(), true);
        assert!(cluster.acts_as_home(), "in touch");
        cluster.set_membership_link(false);
        assert!(cluster.acts_as_home(), "alone, and nobody says etcd is up");
        // Node 2 is not in this node's view (it is stale), but in touch.
        cluster.heard_membership_link(2, true);
        assert!(
            !cluster.acts_as_home(),
            "a node in touch: this one is cut off"
        );
        cluster.heard_membership_link(2, false);
        assert!(cluster.acts_as_home());
        cluster.set_membership_link(true);
        cluster.heard_membership_link(1, true);
        assert!(cluster.acts_as_home(), "in touch itself");
    }

    #[test]
    fn a_home_gained_by_a_view_change_keeps_an_id_its_old_home_was_registering() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&runtime, async {
            let dir = tempfile::tempdir().unwrap();
            let (before, after) = (
                View::new(5, [0, 1, 2]).unwrap(),
                View::new(6, [0, 1]).unwrap(),
            );
            let cluster = node_0(dir.path(), before.clone());
            let id = std::iter::repeat_with(ObjectId::random)
                .find(|id| before.home(id) == 2 && after.home(id) == 0)
                .unwrap();
            // The create's Register at node 2 is on its way.
            let ticket = cluster.rebuild.borrow_mut().claims.begin();

            cluster.adopt_view(after);
            cluster.restored_by(1, cluster.incarnation, Some(6));
            let early = cluster.local_lookup(&[id]);
            assert!(
                early.is_err(),
                "answered before its own registration ended: {early:?}"
            );
            assert!(!cluster.directory_ready());

            // Node 2 accepted it; the create goes on: sealed and published
            // at the id's home of now, this node.
            cluster.rebuild.borrow_mut().claims.end(ticket, &[id]);
            tokio::time::timeout(Duration::from_secs(5), cluster.until_ready())
                .await
                .expect("ready once the registration ended");
            let location = ObjectLocation {
                offset: 0,
                data_size: 64,
                meta_size: 0,
            };
            cluster.directory_publish(&[id], &[location], 0);
            let entry = &cluster.local_lookup(&[id]).unwrap().entries[0];
            assert!(
                entry.known && entry.sealed && entry.owner == 0,
                "{id} at its new home: {entry:?}"
            );
        });
    }

    #[test]
    fn only_view_changes_and_rebuilds_count_as_overtaken() {
        let view = ShoalError::new(
            ErrorKind::NodeUnavailable,
            format!("{VIEW_CHANGED}: node 2 is at epoch 4"),
        );
        assert!(overtaken(&view));
        let rebuilding = ShoalError::new(
            ErrorKind::HomeUnavailable,
            "the home of object x, node 1, is rebuilding its directory after a restart",
        );
        assert!(overtaken(&rebuilding));
        let down = ShoalError::new(ErrorKind::HomeUnavailable, "node 1 is unreachable");
        assert!(!overtaken(&down));
        let exists = ShoalError::new(ErrorKind::ObjectExists, VIEW_CHANGED);
        assert!(!overtaken(&exists));
    }
}

//! Rebuilding a home's directory when a node (re)starts.
//!
//! A daemon starts with an empty directory, but its peers may own objects
//! whose home it is (it restarted while they lived). Until those are known
//! again the node must neither let anyone claim such an id (uniqueness) nor
//! answer lookups (it would say "unknown" for objects that exist). So:
//!
//! - every node that hears a new incarnation of a peer (first contact or a
//!   restart) re-registers with it everything it owns whose home the peer
//!   is, and re-announces its network copies, then says `Restored`;
//! - the starting node is *ready* — registers ids, answers lookups — once
//!   every peer has either restored or is down (its heartbeat failed), or
//!   once a lease has passed since it started ([`Readiness`]); a node that a
//!   new view gave homes also waits, whatever the lease, until its own
//!   objects homed here entered its directory, after the registrations it
//!   began under the old view ended;
//! - an owner takes the snapshot it restores only after every `Register` it
//!   began before hearing the new incarnation has finished ([`Claims`]): a
//!   Register the old incarnation accepted just before dying is restored
//!   too, one that failed is not;
//! - after restoring, the owner compares the snapshot with its store and
//!   corrects what changed meanwhile ([`corrections`]): a delete or a seal
//!   whose Unregister or Publish reached the home before the Restore.
//!
//! This module holds that logic without I/O; the daemon drives it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

/// Whether a starting node's directory can be trusted yet.
#[derive(Debug)]
pub struct Readiness {
    started: Instant,
    bound: Duration,
    me: u32,
    /// Per node: it finished restoring for our incarnation.
    restored: Vec<bool>,
    /// Per node: whether our latest heartbeat to it was answered (`None`
    /// before the first one finished).
    answered: Vec<Option<bool>>,
    /// Whether this node's own objects homed here entered its directory
    /// (since the latest view that gave it homes).
    own_restored: bool,
    /// How many views gave this node homes: which wait a restore of its own
    /// objects ends.
    round: u64,
    ready: bool,
}

/// How a node became ready (reported once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ready {
    /// Every live peer restored (the rest are down).
    Restored,
    /// The bound passed; these live peers had not finished restoring.
    TimedOut { waiting_for: Vec<u32> },
}

impl Readiness {
    /// Node `me` started at `started`, waiting for the restores of
    /// `members` (node ids below `slots`; the other slots hold nothing
    /// homed here); ready at the latest after `bound`.
    pub fn new(slots: usize, members: &[u32], me: u32, bound: Duration, started: Instant) -> Self {
        Self {
            started,
            bound,
            me,
            restored: (0..slots as u32).map(|n| !members.contains(&n)).collect(),
            answered: vec![None; slots],
            own_restored: true,
            round: 0,
            ready: false,
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// A new view gave this node homes it did not have: its directory waits
    /// again for every live peer among `members` to restore (for that view)
    /// or for the bound, counted from `now`; a node outside the view holds
    /// nothing homed by it. What heartbeats said of peers is kept. It also
    /// waits, past the bound too, for its own objects to enter it
    /// ([`Self::restored_own`] with the round returned here): a create this
    /// node began under the old view may have registered its id at the old
    /// home, and only this node can restore it here.
    pub fn again(&mut self, now: Instant, members: &[u32]) -> u64 {
        self.started = now;
        for (node, done) in self.restored.iter_mut().enumerate() {
            *done = !members.contains(&(node as u32));
        }
        self.own_restored = false;
        self.round += 1;
        self.ready = false;
        self.round
    }

    /// This node's own objects homed here entered its directory, for the
    /// view change numbered `round` (an older one's restore counts for
    /// nothing: a newer view moved homes again).
    pub fn restored_own(&mut self, round: u64) {
        if round == self.round {
            self.own_restored = true;
        }
    }

    /// `node` finished restoring what it holds for us.
    pub fn restored(&mut self, node: u32) {
        if let Some(done) = self.restored.get_mut(node as usize) {
            *done = true;
        }
    }

    /// Our heartbeat to `node` finished: answered or not.
    pub fn heartbeat(&mut self, node: u32, answered: bool) {
        if let Some(slot) = self.answered.get_mut(node as usize) {
            *slot = Some(answered);
        }
    }

    /// Peers still to be waited for: not restored, and alive or not probed yet.
    pub fn waiting_for(&self) -> Vec<u32> {
        (0..self.restored.len() as u32)
            .filter(|&n| n != self.me)
            .filter(|&n| !self.restored[n as usize] && self.answered[n as usize] != Some(false))
            .collect()
    }

    /// Becomes ready if it is time; `Some` exactly once, when it does.
    pub fn check(&mut self, now: Instant) -> Option<Ready> {
        if self.ready || !self.own_restored {
            return None;
        }
        let waiting_for = self.waiting_for();
        let outcome = if waiting_for.is_empty() {
            Ready::Restored
        } else if now.saturating_duration_since(self.started) >= self.bound {
            Ready::TimedOut { waiting_for }
        } else {
            return None;
        };
        self.ready = true;
        Some(outcome)
    }
}

/// Ids this node is registering at their homes, or registered and does not
/// hold in its store yet (the create is waiting for space): what a restore
/// must include beside the store. Registrations are numbered so a restore
/// can wait for those begun before it.
#[derive(Debug, Default)]
pub struct Claims {
    next: u64,
    in_flight: BTreeSet<u64>,
    claimed: HashSet<ObjectId>,
}

impl Claims {
    /// A registration starts; returns its ticket.
    pub fn begin(&mut self) -> u64 {
        let ticket = self.next;
        self.next += 1;
        self.in_flight.insert(ticket);
        ticket
    }

    /// The registration `ticket` ended; `registered` are the ids it claimed
    /// (none if it failed).
    pub fn end(&mut self, ticket: u64, registered: &[ObjectId]) {
        self.in_flight.remove(&ticket);
        self.claimed.extend(registered.iter().copied());
    }

    /// The store speaks for these ids now (sealed and published), or they
    /// are gone (unregistered).
    pub fn settle(&mut self, ids: &[ObjectId]) {
        if !self.claimed.is_empty() {
            for id in ids {
                self.claimed.remove(id);
            }
        }
    }

    /// The ticket the next registration will get.
    pub fn watermark(&self) -> u64 {
        self.next
    }

    /// Whether a registration with a ticket below `watermark` is in flight.
    pub fn in_flight_before(&self, watermark: u64) -> bool {
        self.in_flight.first().is_some_and(|&t| t < watermark)
    }

    pub fn is_claimed(&self, id: &ObjectId) -> bool {
        self.claimed.contains(id)
    }

    pub fn claimed(&self) -> impl Iterator<Item = &ObjectId> {
        self.claimed.iter()
    }
}

/// What an owner holds of one id: sealed at a location, or pending (being
/// written, or registered and not created yet). Absent: gone.
pub type Holding = Option<ObjectLocation>;

/// What to tell a home after a restore, comparing what was sent with what
/// the owner holds now: ids gone since (to unregister) and ids sealed since
/// (to publish). Ids that appeared since are not the restore's business:
/// they were registered at the home itself.
pub fn corrections(
    sent: &HashMap<ObjectId, Holding>,
    now: &HashMap<ObjectId, Holding>,
) -> (Vec<ObjectId>, Vec<(ObjectId, ObjectLocation)>) {
    let mut gone = Vec::new();
    let mut sealed = Vec::new();
    for (id, before) in sent {
        match now.get(id) {
            None => gone.push(*id),
            Some(Some(location)) if before.as_ref() != Some(location) => {
                sealed.push((*id, *location))
            }
            Some(_) => {}
        }
    }
    gone.sort_unstable();
    sealed.sort_unstable_by_key(|(id, _)| *id);
    (gone, sealed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ObjectId {
        ObjectId([n; 20])
    }

    const LEASE: Duration = Duration::from_secs(2);

    #[test]
    fn ready_once_every_live_peer_restored() {
        let t0 = Instant::now();
        let mut r = Readiness::new(3, &[0, 1, 2], 1, LEASE, t0);
        assert!(!r.is_ready());
        assert_eq!(r.waiting_for(), vec![0, 2]);
        assert_eq!(r.check(t0), None);
        r.restored(0);
        r.heartbeat(2, true);
        assert_eq!(r.check(t0), None, "node 2 is alive and has not restored");
        r.restored(2);
        assert_eq!(r.check(t0), Some(Ready::Restored));
        assert!(r.is_ready());
        assert_eq!(r.check(t0), None, "reported once");
    }

    #[test]
    fn a_view_that_brings_homes_waits_for_every_live_peer_again() {
        let t0 = Instant::now();
        let mut r = Readiness::new(3, &[0, 1, 2], 1, LEASE, t0);
        r.restored(0);
        r.restored(2);
        assert_eq!(r.check(t0), Some(Ready::Restored));
        r.heartbeat(2, false);
        let t1 = t0 + LEASE;
        let round = r.again(t1, &[0, 1, 2]);
        r.restored_own(round);
        assert!(!r.is_ready());
        assert_eq!(r.waiting_for(), vec![0], "node 2 is down: not waited for");
        assert_eq!(r.check(t1), None);
        r.restored(0);
        assert_eq!(r.check(t1), Some(Ready::Restored));
        r.heartbeat(2, true);
        r.again(t1, &[0, 1]);
        assert_eq!(r.waiting_for(), vec![0], "node 2 is alive, but no member");
        let round = r.again(t1, &[0, 1, 2]);
        r.restored_own(round);
        r.heartbeat(2, false);
        assert_eq!(
            r.check(t1 + LEASE),
            Some(Ready::TimedOut {
                waiting_for: vec![0]
            }),
            "the bound counts from the view change"
        );
    }

    #[test]
    fn a_view_that_brings_homes_waits_for_this_nodes_own_restore_past_the_bound() {
        let t0 = Instant::now();
        let mut r = Readiness::new(2, &[0, 1], 0, LEASE, t0);
        r.restored(1);
        assert_eq!(
            r.check(t0),
            Some(Ready::Restored),
            "a start restores its own at once"
        );
        let first = r.again(t0, &[0, 1]);
        r.restored(1);
        assert_eq!(r.check(t0), None, "its own objects are not in yet");
        assert_eq!(r.check(t0 + 2 * LEASE), None, "the bound is for peers only");
        let second = r.again(t0, &[0, 1]);
        r.restored(1);
        r.restored_own(first);
        assert_eq!(
            r.check(t0),
            None,
            "an older view change's restore counts for nothing"
        );
        r.restored_own(second);
        assert_eq!(r.check(t0), Some(Ready::Restored));
    }

    #[test]
    fn down_peers_are_not_waited_for_but_unprobed_ones_are() {
        let t0 = Instant::now();
        let mut r = Readiness::new(3, &[0, 1, 2], 0, LEASE, t0);
        r.heartbeat(1, false);
        assert_eq!(r.check(t0), None, "node 2 was never probed");
        r.heartbeat(2, false);
        assert_eq!(r.check(t0), Some(Ready::Restored));
        // A single node waits for nobody.
        assert_eq!(
            Readiness::new(1, &[0], 0, LEASE, t0).check(t0),
            Some(Ready::Restored)
        );
    }

    #[test]
    fn a_peer_that_comes_back_is_waited_for_again() {
        let t0 = Instant::now();
        let mut r = Readiness::new(2, &[0, 1], 0, LEASE, t0);
        r.heartbeat(1, false);
        r.heartbeat(1, true);
        assert_eq!(r.waiting_for(), vec![1]);
        assert_eq!(r.check(t0 + LEASE / 2), None);
    }

    #[test]
    fn the_lease_bounds_the_wait() {
        let t0 = Instant::now();
        let mut r = Readiness::new(3, &[0, 1, 2], 2, LEASE, t0);
        r.heartbeat(0, true);
        r.restored(1);
        assert_eq!(r.check(t0 + LEASE - Duration::from_millis(1)), None);
        assert_eq!(
            r.check(t0 + LEASE),
            Some(Ready::TimedOut {
                waiting_for: vec![0]
            })
        );
        assert!(r.is_ready());
    }

    #[test]
    fn slots_of_nodes_not_known_are_not_waited_for() {
        // A membership's 8 slots, nodes 0 and 3 known: only 3 restores here.
        let t0 = Instant::now();
        let mut r = Readiness::new(8, &[0, 3], 0, LEASE, t0);
        assert_eq!(r.waiting_for(), [3]);
        r.restored(3);
        assert_eq!(r.check(t0), Some(Ready::Restored));
    }

    #[test]
    fn claims_wait_for_earlier_registrations_only() {
        let mut c = Claims::default();
        let first = c.begin();
        let mark = c.watermark();
        let second = c.begin();
        assert!(c.in_flight_before(mark));
        c.end(first, &[id(1), id(2)]);
        assert!(
            !c.in_flight_before(mark),
            "a later registration does not count"
        );
        assert!(c.in_flight_before(c.watermark()));
        c.end(second, &[]);
        assert!(!c.in_flight_before(c.watermark()));
        assert!(c.is_claimed(&id(1)) && c.is_claimed(&id(2)));
        c.settle(&[id(1), id(9)]);
        assert_eq!(c.claimed().collect::<Vec<_>>(), vec![&id(2)]);
    }

    #[test]
    fn corrections_unregister_what_went_and_publish_what_sealed() {
        let at = |offset| ObjectLocation {
            offset,
            data_size: 1,
            meta_size: 0,
        };
        let sent: HashMap<ObjectId, Holding> = [
            (id(1), Some(at(0))),   // unchanged
            (id(2), None),          // sealed since
            (id(3), Some(at(64))),  // deleted since
            (id(4), None),          // aborted since
            (id(5), None),          // still being written
            (id(6), Some(at(128))), // deleted, then created again and sealed elsewhere
        ]
        .into();
        let now: HashMap<ObjectId, Holding> = [
            (id(1), Some(at(0))),
            (id(2), Some(at(192))),
            (id(5), None),
            (id(6), Some(at(256))),
            (id(7), Some(at(320))), // new: registered at the home itself
        ]
        .into();
        let (gone, sealed) = corrections(&sent, &now);
        assert_eq!(gone, vec![id(3), id(4)]);
        assert_eq!(sealed, vec![(id(2), at(192)), (id(6), at(256))]);
    }
}

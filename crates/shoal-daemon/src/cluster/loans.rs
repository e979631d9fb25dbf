//! References this node holds on other nodes' objects, shared by its clients.
//!
//! A get of an object on another node takes one reference at its owner
//! (`Acquire`) for this node: a *loan*. Local clients that get the object
//! are counted here, and when the last one releases, the loan is kept for
//! `linger` so that the next get of the same object needs no round trip.
//! Then it is returned (`Release`).
//!
//! An owner takes loans back in two cases:
//! - before a delete completes it *revokes* them (so a get here after the
//!   delete never sees the old object): idle loans are dropped at once,
//!   loans in use serve no new get and are returned on their last release;
//! - when it needs space it asks for its *idle* loans back.
//!
//! In both cases the owner itself drops the references of the loans this node
//! gave up (they are named in the answer), so nothing is released twice.
//!
//! The race: an Acquire answer can be overtaken by a revoke the owner sent
//! after making it. Owners number their revokes and every Acquire answer
//! carries the number of revokes sent until then; an answer older than a
//! revoke this node already heard from that owner installs no loan.
//!
//! References that are not loans are *direct*: returned on the client's
//! release. They are taken for network-mode gets (the bytes are pulled, then
//! the reference goes), when lingering is off, and when a loan could not be
//! installed (the race above, or a loan for the id is already there).

use std::collections::VecDeque;
use std::time::Duration;

use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;
use tokio::time::Instant;

type ClientId = u32;

/// On every remote get and release: foldhash, not SipHash.
type HashMap<K, V> = foldhash::HashMap<K, V>;

/// One reference at an owner, shared by this node's clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loan {
    pub owner: u32,
    /// The owner's incarnation that granted it (its region's generation).
    pub generation: u64,
    pub location: ObjectLocation,
    users: u32,
    /// When the last user released it (`None` while in use).
    idle_since: Option<Instant>,
    /// Which idle period this is (its entry in `Loans::idle_order`).
    idle_mark: u64,
    /// The owner deleted the object: no new users; returned when unused.
    revoked: bool,
    /// The owner presumably reclaimed the reference (our lease there ran
    /// out): no new users, and nothing to return.
    lost: bool,
}

/// A reference an owner granted (its Acquire answer).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub owner: u32,
    pub generation: u64,
    pub location: ObjectLocation,
    /// Revokes the owner had sent when it answered.
    pub revokes: u64,
    /// Granted before a fence this node has heard of since (`fencing.rs`):
    /// the owner holds the reference in quarantine.
    pub fenced: bool,
}

/// One client's references on other nodes' objects.
#[derive(Debug, Default)]
struct Hold {
    /// Uses of this id's loan.
    lent: u32,
    /// The direct references (usually none or one).
    direct: Vec<Direct>,
}

/// A reference of one client at an owner, returned on its release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Direct {
    owner: u32,
    /// The owner fenced this node since it was taken (`fencing.rs`): the
    /// owner holds it in quarantine, so it is never released there.
    fenced: bool,
}

/// Idle loans a node keeps at most (beyond it, the longest idle go first).
pub(crate) const MAX_IDLE: usize = 1 << 18;

pub(crate) struct Loans {
    linger: Duration,
    max_idle: usize,
    /// Invariant: a loan is idle (`users == 0`) exactly when it has an
    /// `idle_since`, is counted in `idle` and has a current entry in
    /// `idle_order`.
    loans: HashMap<ObjectId, Loan>,
    /// Loans in the order they went idle, oldest first: (when, mark, id).
    /// An entry is current while its loan is still in that idle period;
    /// the others (used again since, or gone) are skipped when met. Each
    /// heartbeat tick looks only at the front: O(loans expired), not a scan
    /// of every loan with a clock read each (which kept a node that held
    /// 10^5 loans busy in `expired`).
    idle_order: VecDeque<(Instant, u64, ObjectId)>,
    /// The last idle period's mark (instants may repeat: a paused clock).
    idle_marks: u64,
    /// How many loans are idle.
    idle: usize,
    holds: HashMap<ClientId, HashMap<ObjectId, Hold>>,
    /// The highest revoke number heard from each owner.
    revokes_heard: HashMap<u32, u64>,
}

/// A reference to return at its owner: (owner, id).
pub(crate) type Returned = (u32, ObjectId);

impl Loans {
    /// `linger` zero: no loans, every reference is direct.
    pub(crate) fn new(linger: Duration) -> Self {
        Self {
            linger,
            max_idle: MAX_IDLE,
            loans: HashMap::default(),
            idle_order: VecDeque::new(),
            idle_marks: 0,
            idle: 0,
            holds: HashMap::default(),
            revokes_heard: HashMap::default(),
        }
    }

    /// Gets served from this node's loans, per id the loan if there is one
    /// that `usable` accepts (its owner is not known to be down, and is at
    /// the same incarnation): one more user each.
    pub(crate) fn borrow(
        &mut self,
        client: ClientId,
        ids: &[ObjectId],
        usable: impl Fn(&Loan) -> bool,
    ) -> Vec<Option<Loan>> {
        let held = self.holds.entry(client).or_default();
        let found = ids
            .iter()
            .map(|id| {
                let loan = self.loans.get_mut(id)?;
                if loan.revoked || !usable(loan) {
                    return None;
                }
                loan.users += 1;
                if loan.idle_since.take().is_some() {
                    self.idle -= 1;
                }
                held.entry(*id).or_default().lent += 1;
                Some(*loan)
            })
            .collect();
        if held.is_empty() {
            self.holds.remove(&client);
        }
        found
    }

    /// `client`'s get took a reference at `grant.owner`. Becomes the node's
    /// loan if `lend` and nothing stands in the way, else a direct reference.
    pub(crate) fn acquired(&mut self, client: ClientId, id: ObjectId, grant: Grant, lend: bool) {
        let Grant {
            owner,
            generation,
            location,
            revokes,
            fenced,
        } = grant;
        if fenced {
            // Counted until the client lets go, never released.
            self.direct(client, id, owner, true);
            return;
        }
        let overtaken = self.revokes_heard.get(&owner).is_some_and(|&n| n > revokes);
        if !lend || self.linger.is_zero() || overtaken || self.loans.contains_key(&id) {
            self.direct(client, id, owner, false);
            return;
        }
        self.holds
            .entry(client)
            .or_default()
            .entry(id)
            .or_default()
            .lent += 1;
        self.loans.insert(
            id,
            Loan {
                owner,
                generation,
                location,
                users: 1,
                idle_since: None,
                idle_mark: 0,
                revoked: false,
                lost: false,
            },
        );
    }

    /// `client` holds a reference at `owner` that is returned on its release
    /// (its remote creations, network-mode gets) — unless `fenced`: `owner`
    /// fenced it already (granted before the fence, answered after this node
    /// heard of it), so it is counted until the client lets go, never released.
    pub(crate) fn direct(&mut self, client: ClientId, id: ObjectId, owner: u32, fenced: bool) {
        self.holds
            .entry(client)
            .or_default()
            .entry(id)
            .or_default()
            .direct
            .push(Direct { owner, fenced });
    }

    /// Whether `client` holds a reference to `id` on another node.
    #[cfg(test)]
    pub(crate) fn holds(&self, client: ClientId, id: &ObjectId) -> bool {
        self.holds
            .get(&client)
            .is_some_and(|held| held.contains_key(id))
    }

    /// Drops one of `client`'s references per id; returns those to release
    /// at their owners now (direct ones, and revoked loans left unused).
    pub(crate) fn release(&mut self, client: ClientId, ids: &[ObjectId]) -> Vec<Returned> {
        self.release_held(client, ids, |_| ())
    }

    /// As [`release`](Self::release); ids `client` holds no remote
    /// reference to go to `not_held` (they are local objects).
    pub(crate) fn release_held(
        &mut self,
        client: ClientId,
        ids: &[ObjectId],
        mut not_held: impl FnMut(&ObjectId),
    ) -> Vec<Returned> {
        let now = Instant::now();
        let mut out = Vec::new();
        let Some(held) = self.holds.get_mut(&client) else {
            ids.iter().for_each(not_held);
            return out;
        };
        let mut unused = Vec::new();
        for id in ids {
            let Some(hold) = held.get_mut(id) else {
                not_held(id);
                continue;
            };
            if let Some(direct) = hold.direct.pop() {
                if !direct.fenced {
                    out.push((direct.owner, *id));
                }
            } else {
                hold.lent -= 1;
                unused.push(*id);
            }
            if hold.lent == 0 && hold.direct.is_empty() {
                held.remove(id);
            }
        }
        if held.is_empty() {
            self.holds.remove(&client);
        }
        for id in unused {
            out.extend(self.unuse(id, now));
        }
        out
    }

    /// Every reference of a client that went away.
    pub(crate) fn drop_client(&mut self, client: ClientId) -> Vec<Returned> {
        let now = Instant::now();
        let mut out = Vec::new();
        for (id, hold) in self.holds.remove(&client).unwrap_or_default() {
            out.extend(
                hold.direct
                    .into_iter()
                    .filter(|d| !d.fenced)
                    .map(|d| (d.owner, id)),
            );
            for _ in 0..hold.lent {
                out.extend(self.unuse(id, now));
            }
        }
        out
    }

    /// One user of `id`'s loan is done with it.
    fn unuse(&mut self, id: ObjectId, now: Instant) -> Option<Returned> {
        let loan = self.loans.get_mut(&id)?;
        loan.users -= 1;
        if loan.users > 0 {
            return None;
        }
        if loan.revoked {
            let loan = self.loans.remove(&id)?;
            return (!loan.lost).then_some((loan.owner, id));
        }
        loan.idle_since = Some(now);
        self.idle += 1;
        self.idle_marks += 1;
        loan.idle_mark = self.idle_marks;
        self.idle_order.push_back((now, self.idle_marks, id));
        // Skipped entries pile up behind a young one under churn (a loan
        // got and released again and again): drop them once they are
        // most of the queue, amortised O(1) per entry.
        if self.idle_order.len() > 2 * self.idle + 1024 {
            let loans = &self.loans;
            self.idle_order
                .retain(|(_, mark, id)| is_current(loans, *mark, id));
        }
        None
    }

    /// This node's lease at `owner` may have run out (its heartbeats went
    /// unanswered for most of a lease): the owner may have reclaimed every
    /// reference this node held there and reused the memory. Its loans serve
    /// no new get and are forgotten, not returned: a late Release could drop
    /// a reference taken since. (If the owner did not reclaim them, they stay
    /// referenced there until this node restarts: safe, not free.) Returns
    /// how many loans that was.
    pub(crate) fn owner_lost(&mut self, owner: u32) -> usize {
        let mut lost = 0;
        let idle = &mut self.idle;
        self.loans.retain(|_, loan| {
            if loan.owner != owner || loan.lost {
                return true;
            }
            lost += 1;
            loan.revoked = true;
            loan.lost = true;
            if loan.users == 0 {
                *idle -= 1;
            }
            loan.users > 0
        });
        lost
    }

    /// `owner` fenced this node (`fencing.rs`): it holds every reference this
    /// node had there in quarantine. Loans serve no new get and are never
    /// returned; direct references are not released. Returns how many
    /// references were fenced now (loans not already lost, direct ones).
    pub(crate) fn fence(&mut self, owner: u32) -> usize {
        // Loans as when the owner went silent (lost, never returned).
        let mut fenced = self.owner_lost(owner);
        for held in self.holds.values_mut() {
            for hold in held.values_mut() {
                for d in hold
                    .direct
                    .iter_mut()
                    .filter(|d| d.owner == owner && !d.fenced)
                {
                    d.fenced = true;
                    fenced += 1;
                }
            }
        }
        fenced
    }

    /// How many references at `owner` this node's clients still hold that
    /// are fenced or lost (loans in use, direct references): the owner's
    /// quarantine may be freed only at zero.
    pub(crate) fn fenced_held(&self, owner: u32) -> usize {
        let lent = self
            .loans
            .values()
            .filter(|l| l.owner == owner && l.lost && l.users > 0)
            .count();
        let direct = self
            .holds
            .values()
            .flat_map(|held| held.values())
            .flat_map(|hold| hold.direct.iter())
            .filter(|d| d.owner == owner && d.fenced)
            .count();
        lent + direct
    }

    /// `owner` deleted `ids` (its revoke number `number`): their loans serve
    /// no new get. Returns the ids whose loans were idle and are dropped
    /// (the owner drops those references itself).
    pub(crate) fn revoke(&mut self, owner: u32, number: u64, ids: &[ObjectId]) -> Vec<ObjectId> {
        let heard = self.revokes_heard.entry(owner).or_default();
        *heard = (*heard).max(number);
        let mut dropped = Vec::new();
        for id in ids {
            let Some(loan) = self.loans.get_mut(id).filter(|l| l.owner == owner) else {
                continue;
            };
            if loan.users == 0 {
                self.loans.remove(id);
                self.idle -= 1;
                dropped.push(*id);
            } else {
                loan.revoked = true;
            }
        }
        dropped
    }

    /// `owner` needs space: its idle loans are dropped (it drops the
    /// references of the ids returned itself).
    pub(crate) fn give_back_idle(&mut self, owner: u32) -> Vec<ObjectId> {
        let mut dropped = Vec::new();
        self.loans.retain(|id, loan| {
            let idle = loan.owner == owner && loan.users == 0;
            if idle {
                dropped.push(*id);
            }
            !idle
        });
        self.idle -= dropped.len();
        dropped
    }

    /// Loans idle for longer than `linger`, and the longest idle beyond
    /// [`MAX_IDLE`] (a get that touched many objects once pins them only so
    /// far), dropped here: release them. Called every heartbeat tick; looks
    /// at the longest idle only.
    pub(crate) fn expired(&mut self) -> Vec<Returned> {
        let now = Instant::now();
        let mut out = Vec::new();
        while let Some(&(at, mark, id)) = self.idle_order.front() {
            let current = is_current(&self.loans, mark, &id);
            if current && now.duration_since(at) < self.linger && self.idle <= self.max_idle {
                break;
            }
            self.idle_order.pop_front();
            if current {
                let loan = self.loans.remove(&id).expect("a current entry's loan");
                self.idle -= 1;
                out.push((loan.owner, id));
            }
        }
        out
    }

    /// `owner` restarted: every reference there is gone with its previous
    /// incarnation. Returns how many local references that was.
    pub(crate) fn forget_owner(&mut self, owner: u32) -> usize {
        let mut forgotten = 0;
        let mut lent_gone = foldhash::HashSet::default();
        let idle = &mut self.idle;
        self.loans.retain(|id, loan| {
            let gone = loan.owner == owner;
            if gone {
                lent_gone.insert(*id);
                if loan.users == 0 {
                    *idle -= 1;
                }
            }
            !gone
        });
        for held in self.holds.values_mut() {
            held.retain(|id, hold| {
                let before = hold.direct.len();
                hold.direct.retain(|d| d.owner != owner);
                forgotten += before - hold.direct.len();
                if lent_gone.contains(id) {
                    forgotten += hold.lent as usize;
                    hold.lent = 0;
                }
                hold.lent > 0 || !hold.direct.is_empty()
            });
        }
        self.holds.retain(|_, held| !held.is_empty());
        self.revokes_heard.remove(&owner);
        forgotten
    }

    /// How many loans this node holds (in use or idle).
    pub(crate) fn len(&self) -> usize {
        self.loans.len()
    }
}

/// Whether the idle-order entry (`mark`, `id`) is its loan's current one.
fn is_current(loans: &HashMap<ObjectId, Loan>, mark: u64, id: &ObjectId) -> bool {
    loans
        .get(id)
        .is_some_and(|l| l.idle_since.is_some() && l.idle_mark == mark)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ObjectId {
        ObjectId([n; 20])
    }

    const AT: ObjectLocation = ObjectLocation {
        offset: 128,
        data_size: 10,
        meta_size: 0,
    };

    fn loans() -> Loans {
        Loans::new(Duration::from_secs(60))
    }

    fn grant(owner: u32, generation: u64, revokes: u64) -> Grant {
        Grant {
            owner,
            generation,
            location: AT,
            revokes,
            fenced: false,
        }
    }

    fn always(_: &Loan) -> bool {
        true
    }

    #[test]
    fn a_released_loan_serves_the_next_get_without_a_round_trip() {
        let mut l = loans();
        assert!(l.borrow(1, &[id(1)], always)[0].is_none());
        l.acquired(1, id(1), grant(2, 7, 0), true);
        assert!(l.holds(1, &id(1)));
        assert!(l.release(1, &[id(1)]).is_empty(), "kept, not returned");
        assert!(!l.holds(1, &id(1)));
        let loan = l.borrow(3, &[id(1)], always)[0].expect("lingering loan");
        assert_eq!((loan.owner, loan.generation, loan.location), (2, 7, AT));
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn clients_share_one_reference_at_the_owner() {
        let mut l = loans();
        l.acquired(1, id(1), grant(2, 7, 0), true);
        l.borrow(2, &[id(1)], always)[0].unwrap();
        l.borrow(2, &[id(1)], always)[0].unwrap();
        assert!(l.release(1, &[id(1)]).is_empty());
        assert!(l.drop_client(2).is_empty());
        // Idle now: a zero linger would return it.
        assert_eq!(l.give_back_idle(2), vec![id(1)]);
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn idle_loans_expire_after_the_linger() {
        let mut l = Loans::new(Duration::from_millis(1));
        l.acquired(1, id(1), grant(2, 7, 0), true);
        l.acquired(1, id(2), grant(2, 7, 0), true);
        l.release(1, &[id(1)]);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(l.expired(), vec![(2, id(1))], "the one in use stays");
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn the_longest_idle_loans_go_beyond_the_cap() {
        let mut l = loans();
        l.max_idle = 2;
        for n in 1..=4 {
            l.acquired(1, id(n), grant(2, 7, 0), true);
        }
        l.acquired(1, id(5), grant(2, 7, 0), true);
        for n in 1..=4 {
            l.release(1, &[id(n)]);
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut gone = l.expired();
        gone.sort();
        assert_eq!(gone, vec![(2, id(1)), (2, id(2))], "the two idle longest");
        assert_eq!(l.len(), 3, "two idle and the one in use stay");
        assert!(l.expired().is_empty());
    }

    #[test]
    fn a_revoke_drops_idle_loans_and_stops_busy_ones_serving() {
        let mut l = loans();
        l.acquired(1, id(1), grant(2, 7, 0), true);
        l.acquired(1, id(2), grant(2, 7, 0), true);
        l.release(1, &[id(1)]);
        assert_eq!(l.revoke(2, 1, &[id(1), id(2), id(3)]), vec![id(1)]);
        assert!(
            l.borrow(3, &[id(2)], always)[0].is_none(),
            "revoked: no new user"
        );
        // The last user's release returns it at once.
        assert_eq!(l.release(1, &[id(2)]), vec![(2, id(2))]);
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn loans_of_an_owner_whose_lease_may_have_run_out_are_forgotten() {
        let mut l = loans();
        l.acquired(1, id(1), grant(2, 7, 0), true);
        l.acquired(1, id(2), grant(2, 7, 0), true);
        l.acquired(1, id(3), grant(0, 7, 0), true);
        l.release(1, &[id(1)]);
        assert_eq!(l.owner_lost(2), 2);
        assert_eq!(l.owner_lost(2), 0, "once");
        assert!(l.borrow(3, &[id(2)], always)[0].is_none(), "no new user");
        assert!(l.release(1, &[id(2)]).is_empty(), "nothing returned");
        assert!(l.expired().is_empty());
        assert_eq!(l.len(), 1, "owner 0's loan stays");
        // A new get takes a fresh reference, lent anew.
        l.acquired(1, id(1), grant(2, 7, 0), true);
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn a_revoke_names_only_the_revoking_owners_loans() {
        let mut l = loans();
        l.acquired(1, id(1), grant(2, 7, 0), true);
        l.release(1, &[id(1)]);
        assert!(l.revoke(0, 1, &[id(1)]).is_empty());
        assert!(l.borrow(1, &[id(1)], always)[0].is_some());
    }

    #[test]
    fn an_acquire_answer_overtaken_by_a_revoke_installs_no_loan() {
        let mut l = loans();
        // The owner answered after 4 revokes, then sent its 5th, heard first.
        l.revoke(2, 5, &[id(1)]);
        l.acquired(1, id(1), grant(2, 7, 4), true);
        assert_eq!(l.len(), 0);
        assert_eq!(l.release(1, &[id(1)]), vec![(2, id(1))], "direct");
        // An answer made after that revoke is fine.
        l.acquired(1, id(1), grant(2, 7, 5), true);
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn direct_references_are_returned_on_release() {
        let mut l = loans();
        l.acquired(1, id(1), grant(2, 7, 0), false);
        l.acquired(1, id(2), grant(2, 7, 0), true);
        // Two gets raced: the second reference is direct.
        l.acquired(4, id(2), grant(2, 7, 0), true);
        assert_eq!(l.release(1, &[id(1)]), vec![(2, id(1))]);
        assert_eq!(l.release(4, &[id(2)]), vec![(2, id(2))]);
        assert!(l.release(1, &[id(2)]).is_empty(), "the loan lingers");
        let mut off = Loans::new(Duration::ZERO);
        off.acquired(1, id(1), grant(2, 7, 0), true);
        assert_eq!(off.len(), 0);
        assert_eq!(off.release(1, &[id(1)]), vec![(2, id(1))]);
    }

    #[test]
    fn fenced_references_are_never_released_and_counted_until_let_go() {
        let mut l = loans();
        l.acquired(1, id(1), grant(2, 7, 0), true); // a loan in use
        l.acquired(1, id(2), grant(2, 7, 0), true);
        assert!(l.release(1, &[id(2)]).is_empty()); // an idle loan
        l.direct(3, id(3), 2, false); // a remote creation
        l.direct(3, id(4), 5, false); // at another owner
        assert_eq!(l.fence(2), 3);
        assert_eq!(l.fenced_held(2), 2, "the loan in use and the creation");
        assert_eq!(l.fenced_held(5), 0);
        assert!(l.borrow(4, &[id(1)], |_| true)[0].is_none(), "no new get");
        assert!(l.release(1, &[id(1)]).is_empty());
        assert!(l.release(3, &[id(3)]).is_empty());
        assert_eq!(l.fenced_held(2), 0);
        assert_eq!(
            l.release(3, &[id(4)]),
            vec![(5, id(4))],
            "other owners as before"
        );
        // A grant that crossed the fence: counted, never released.
        l.acquired(
            6,
            id(1),
            Grant {
                fenced: true,
                ..grant(2, 7, 0)
            },
            true,
        );
        assert_eq!(l.fenced_held(2), 1);
        assert!(l.drop_client(6).is_empty());
        assert_eq!(l.fenced_held(2), 0);
        // After the fence, new references are released as usual.
        l.acquired(1, id(1), grant(2, 7, 0), false);
        assert_eq!(l.release(1, &[id(1)]), vec![(2, id(1))]);
    }

    #[test]
    fn releases_of_unknown_ids_change_nothing() {
        let mut l = loans();
        l.acquired(1, id(1), grant(2, 7, 0), true);
        assert!(l.release(1, &[id(9)]).is_empty());
        assert!(l.release(5, &[id(1)]).is_empty());
        assert!(l.holds(1, &id(1)));
    }

    #[test]
    fn an_unusable_loan_serves_nothing() {
        let mut l = loans();
        l.acquired(1, id(1), grant(2, 7, 0), true);
        assert!(l.borrow(1, &[id(1)], |loan| loan.generation == 8)[0].is_none());
        assert!(l.release(1, &[id(1)]).is_empty());
    }

    #[test]
    fn a_restarted_owner_takes_every_reference_with_it() {
        let mut l = loans();
        l.acquired(1, id(1), grant(2, 7, 0), true);
        l.borrow(3, &[id(1)], always)[0].unwrap();
        l.acquired(1, id(2), grant(2, 7, 0), false);
        l.acquired(1, id(3), grant(0, 7, 0), true);
        l.revoke(2, 9, &[]);
        assert_eq!(l.forget_owner(2), 3);
        assert!(l.release(3, &[id(1)]).is_empty());
        assert!(!l.holds(1, &id(2)));
        assert!(l.holds(1, &id(3)));
        assert_eq!(l.len(), 1);
        // Revoke numbers start again with the new incarnation.
        l.acquired(1, id(4), grant(2, 8, 0), true);
        assert_eq!(l.len(), 2);
    }

    /// The idle bookkeeping agrees with the loans themselves.
    fn check_idle(l: &Loans) {
        let idle: Vec<_> = l.loans.iter().filter(|(_, x)| x.users == 0).collect();
        assert_eq!(l.idle, idle.len(), "idle count");
        for (id, loan) in idle {
            let at = loan.idle_since.expect("an idle loan has its time");
            assert!(
                l.idle_order.contains(&(at, loan.idle_mark, *id)),
                "an idle loan is in the order"
            );
        }
        assert!(l
            .loans
            .values()
            .all(|x| (x.users == 0) == x.idle_since.is_some()));
    }

    #[test]
    fn a_loan_used_again_expires_a_linger_after_its_last_release() {
        // Wide margins: a loaded machine may oversleep by tens of ms.
        let mut l = Loans::new(Duration::from_millis(300));
        l.acquired(1, id(1), grant(2, 7, 0), true);
        l.release(1, &[id(1)]);
        std::thread::sleep(Duration::from_millis(250));
        l.borrow(1, &[id(1)], always)[0].unwrap();
        l.release(1, &[id(1)]);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            l.expired().is_empty(),
            "idle ~100 ms since its last release"
        );
        check_idle(&l);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(l.expired(), vec![(2, id(1))]);
        assert!(l.idle_order.is_empty());
        check_idle(&l);
    }

    #[test]
    fn the_idle_order_stays_bounded_under_churn() {
        let mut l = loans();
        l.acquired(1, id(1), grant(2, 7, 0), true);
        l.acquired(1, id(2), grant(2, 7, 0), true);
        l.release(1, &[id(2)]); // a young idle loan at the front
        for _ in 0..10_000 {
            l.release(1, &[id(1)]);
            l.borrow(1, &[id(1)], always)[0].unwrap();
        }
        assert!(
            l.idle_order.len() <= 2 * l.idle + 1025,
            "{}",
            l.idle_order.len()
        );
        check_idle(&l);
        assert!(l.expired().is_empty());
    }

    #[test]
    fn idle_bookkeeping_holds_through_any_sequence_of_operations() {
        let mut l = loans();
        l.max_idle = 5;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut revokes = 0;
        for _ in 0..20_000 {
            let (client, n, owner) = (next(3) as u32, next(12) as u8, 1 + next(3) as u32);
            match next(10) {
                0..=2 => l.acquired(client, id(n), grant(owner, 7, revokes), next(4) > 0),
                3..=4 => {
                    l.borrow(client, &[id(n)], always);
                }
                5..=6 => {
                    l.release(client, &[id(n)]);
                }
                7 => match next(5) {
                    0 => {
                        revokes += 1;
                        l.revoke(owner, revokes, &[id(n)]);
                    }
                    1 => {
                        l.give_back_idle(owner);
                    }
                    2 => {
                        l.owner_lost(owner);
                    }
                    3 => {
                        l.forget_owner(owner);
                    }
                    _ => {
                        l.drop_client(client);
                    }
                },
                _ => {
                    l.expired();
                    assert!(l.idle <= l.max_idle, "the cap holds after a tick");
                }
            }
            check_idle(&l);
        }
    }
}

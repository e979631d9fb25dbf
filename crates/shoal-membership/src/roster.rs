//! What etcd says of the cluster now ([`Roster`]), and what a member should
//! propose about it ([`Steward`]): pure, so the rules are tested without etcd.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use shoal_cluster::View;

/// The cluster as this node last read it from etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roster {
    /// The current view, with the etcd revision it was written at (the
    /// compare-and-swap's token).
    pub view: View,
    pub view_revision: i64,
    /// Each member's `[[node]]` table (TOML), by node id.
    pub records: BTreeMap<u32, String>,
    /// The nodes whose liveness key exists, with their incarnations.
    pub live: BTreeMap<u32, u64>,
    /// Whether this node's lease was renewed within its TTL: if not, it
    /// may have been removed meanwhile and must not act as a home.
    pub connected: bool,
    /// Whether the roster follows etcd now: false from a broken watch
    /// until everything was read again (views may have been missed).
    pub current: bool,
}

/// Decides, as the roster changes, which view change to propose: live
/// nodes that are not members join; members without a liveness key for
/// `grace` leave. Every member proposes the same changes; the
/// compare-and-swap on the view's revision makes exactly one win.
#[derive(Debug)]
pub struct Steward {
    grace: Duration,
    /// Members seen without a liveness key, since when.
    absent_since: HashMap<u32, Instant>,
}

impl Steward {
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            absent_since: HashMap::new(),
        }
    }

    /// The next view to propose for `roster` at `now`, if any; also when to
    /// look again if a member's grace is still running.
    pub fn propose(&mut self, roster: &Roster, now: Instant) -> (Option<View>, Option<Instant>) {
        let members: BTreeSet<u32> = roster.view.members().iter().copied().collect();
        self.absent_since
            .retain(|node, _| members.contains(node) && !roster.live.contains_key(node));
        let mut left = Vec::new();
        let mut wake = None;
        for &node in members.iter().filter(|n| !roster.live.contains_key(n)) {
            let since = *self.absent_since.entry(node).or_insert(now);
            let due = since + self.grace;
            if due <= now {
                left.push(node);
            } else {
                wake = Some(wake.map_or(due, |w: Instant| w.min(due)));
            }
        }
        let joined: Vec<u32> = roster
            .live
            .keys()
            .copied()
            .filter(|n| !members.contains(n) && roster.records.contains_key(n))
            .collect();
        (roster.view.next(&joined, &left), wake)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roster(members: &[u32], live: &[u32]) -> Roster {
        Roster {
            view: View::new(4, members.iter().copied()).unwrap(),
            view_revision: 9,
            records: live
                .iter()
                .chain(members)
                .map(|&n| (n, String::new()))
                .collect(),
            live: live.iter().map(|&n| (n, 1)).collect(),
            connected: true,
            current: true,
        }
    }

    #[test]
    fn a_live_non_member_joins_at_once() {
        let mut steward = Steward::new(Duration::from_secs(2));
        let (view, wake) = steward.propose(&roster(&[0, 1], &[0, 1, 2]), Instant::now());
        assert_eq!(view.unwrap(), View::new(5, [0, 1, 2]).unwrap());
        assert_eq!(wake, None);
    }

    #[test]
    fn a_member_without_liveness_leaves_after_the_grace_only() {
        let grace = Duration::from_secs(2);
        let mut steward = Steward::new(grace);
        let t0 = Instant::now();
        let r = roster(&[0, 1, 2], &[0, 1]);
        assert_eq!(steward.propose(&r, t0), (None, Some(t0 + grace)));
        assert_eq!(
            steward.propose(&r, t0 + grace / 2),
            (None, Some(t0 + grace))
        );
        let (view, _) = steward.propose(&r, t0 + grace);
        assert_eq!(view.unwrap(), View::new(5, [0, 1]).unwrap());
    }

    #[test]
    fn a_member_back_within_the_grace_stays_and_its_clock_restarts() {
        let grace = Duration::from_secs(2);
        let mut steward = Steward::new(grace);
        let t0 = Instant::now();
        steward.propose(&roster(&[0, 1], &[0]), t0);
        assert_eq!(
            steward.propose(&roster(&[0, 1], &[0, 1]), t0 + grace),
            (None, None)
        );
        let t1 = t0 + grace * 2;
        assert_eq!(
            steward.propose(&roster(&[0, 1], &[0]), t1),
            (None, Some(t1 + grace))
        );
    }

    #[test]
    fn a_live_key_without_a_record_does_not_join() {
        let mut steward = Steward::new(Duration::from_secs(2));
        let mut r = roster(&[0], &[0, 5]);
        r.records.remove(&5);
        assert_eq!(steward.propose(&r, Instant::now()), (None, None));
    }
}

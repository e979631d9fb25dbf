//! The cluster's view: which nodes are members now, numbered by an epoch,
//! and which member is each id's home.
//!
//! A static cluster file has one view for its whole life (epoch 0, every
//! node of the file). With a membership service (etcd) the view changes as
//! nodes join and leave; every change takes the next epoch, and every peer
//! call carries its sender's epoch so that no node acts on a view older
//! than one its peer has seen (docs/cluster.md, "Membership").
//!
//! Homes are rendezvous hashing (highest random weight) over the members:
//! each member scores the id, the highest score is its home. A join moves
//! only the ids the newcomer now wins (about 1/(N+1) of them), a leave only
//! the leaver's; a modulus over the member count would move about
//! N/(N+1). The cost is one mix per member and id, a few ns each.

use std::fmt;

use shoal_core::error::{Result, ShoalError};
use shoal_core::ObjectId;

/// One numbered membership: the sorted, distinct node ids of the members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    epoch: u64,
    members: Vec<u32>,
}

impl View {
    /// The view numbered `epoch` with these members (any order, repeats
    /// ignored). A view has at least one member.
    pub fn new(epoch: u64, members: impl IntoIterator<Item = u32>) -> Result<Self> {
        let mut members: Vec<u32> = members.into_iter().collect();
        members.sort_unstable();
        members.dedup();
        if members.is_empty() {
            return Err(ShoalError::invalid(format!("view {epoch} has no member")));
        }
        Ok(Self { epoch, members })
    }

    /// The one view of a static cluster file of `nodes` nodes: epoch 0,
    /// nodes 0..nodes.
    pub fn of_file(nodes: usize) -> Self {
        Self {
            epoch: 0,
            members: (0..nodes.max(1) as u32).collect(),
        }
    }

    /// Its number: a later view has a larger one.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The members, in ascending order.
    pub fn members(&self) -> &[u32] {
        &self.members
    }

    /// Whether `node` is a member.
    pub fn contains(&self, node: u32) -> bool {
        self.members.binary_search(&node).is_ok()
    }

    /// The home of `id`: the member with the highest weight for it (the
    /// lower node id on a tie, which needs a 64-bit collision).
    pub fn home(&self, id: &ObjectId) -> u32 {
        home_among(id_hash(id), &self.members)
    }

    /// The member that would be `id`'s home if its home left: the second
    /// highest weight (`None` for a view of one member). It keeps the
    /// witness of ids whose owner is their home (the daemon's `witness.rs`).
    pub fn runner_up(&self, id: &ObjectId) -> Option<u32> {
        let hash = id_hash(id);
        let home = home_among(hash, &self.members);
        self.members
            .iter()
            .copied()
            .filter(|&node| node != home)
            .max_by_key(|&node| (weight(hash, node), std::cmp::Reverse(node)))
    }

    /// The next view: this one's members with `joined` added and `left`
    /// removed, numbered one higher. `None` if that changes nothing or
    /// would leave no member.
    pub fn next(&self, joined: &[u32], left: &[u32]) -> Option<Self> {
        let members = self
            .members
            .iter()
            .chain(joined)
            .copied()
            .filter(|node| !left.contains(node));
        let next = Self::new(self.epoch + 1, members).ok()?;
        (next.members != self.members).then_some(next)
    }

    /// The text form kept in a membership service: `epoch=7 members=0,1,3`.
    pub fn encode(&self) -> String {
        self.to_string()
    }

    /// Reads [`View::encode`]'s form; anything else is `InvalidArgument`
    /// naming what is wrong.
    pub fn decode(text: &str) -> Result<Self> {
        let bad = |why: &str| ShoalError::invalid(format!("view {text:?}: {why}"));
        let mut epoch = None;
        let mut members = None;
        for part in text.split_whitespace() {
            match part.split_once('=') {
                Some(("epoch", value)) if epoch.is_none() => {
                    epoch = Some(
                        value
                            .parse::<u64>()
                            .map_err(|_| bad("epoch is not a number"))?,
                    );
                }
                Some(("members", value)) if members.is_none() => {
                    let parsed: std::result::Result<Vec<u32>, _> =
                        value.split(',').map(str::parse::<u32>).collect();
                    members = Some(parsed.map_err(|_| bad("members are not node ids"))?);
                }
                _ => return Err(bad("expected `epoch=N members=A,B,…`")),
            }
        }
        match (epoch, members) {
            (Some(epoch), Some(members)) => Self::new(epoch, members),
            _ => Err(bad("expected `epoch=N members=A,B,…`")),
        }
    }
}

impl fmt::Display for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch={} members=", self.epoch)?;
        for (i, member) in self.members.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{member}")?;
        }
        Ok(())
    }
}

/// The home of `id` among the nodes 0..nodes of a static cluster file
/// ([`View::of_file`]).
pub fn home_of(id: &ObjectId, nodes: usize) -> u32 {
    let hash = id_hash(id);
    (0..nodes.max(1) as u32)
        .max_by_key(|&node| (weight(hash, node), std::cmp::Reverse(node)))
        .unwrap_or(0)
}

fn home_among(hash: u64, members: &[u32]) -> u32 {
    members
        .iter()
        .copied()
        .max_by_key(|&node| (weight(hash, node), std::cmp::Reverse(node)))
        .unwrap_or(0)
}

/// SplitMix64 over the id's bytes, 8 at a time (little-endian, the last
/// word zero-padded). Stable across processes, builds and languages: the
/// Python package computes the same (`shoal.testing.home_of`), checked
/// against tests/vectors/homes.txt on both sides.
pub fn id_hash(id: &ObjectId) -> u64 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in id.0.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        h ^= u64::from_le_bytes(word);
        h = mix(h);
    }
    h
}

/// A node's score for an id: the id's hash and the node's id mixed once
/// more (the node id first spread by the golden-ratio constant, so nodes
/// 0, 1, 2 differ in every bit).
pub fn weight(id_hash: u64, node: u32) -> u64 {
    mix(id_hash ^ u64::from(node).wrapping_mul(0xd6e8_feb8_6659_fd93))
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(count: usize) -> impl Iterator<Item = ObjectId> {
        (0..count as u64).map(|i| {
            let mut raw = [0u8; 20];
            raw[..8].copy_from_slice(&mix(i).to_le_bytes());
            raw[8..16].copy_from_slice(&mix(!i).to_le_bytes());
            ObjectId(raw)
        })
    }

    #[test]
    fn the_runner_up_is_the_home_once_the_home_left() {
        let view = View::new(5, [0, 1, 3, 6]).unwrap();
        for id in ids(5_000) {
            let home = view.home(&id);
            let without = view.next(&[], &[home]).unwrap();
            assert_eq!(view.runner_up(&id), Some(without.home(&id)), "{id}");
        }
        assert_eq!(
            View::new(1, [2])
                .unwrap()
                .runner_up(&ids(1).next().unwrap()),
            None
        );
    }

    #[test]
    fn homes_are_members_stable_and_spread() {
        let view = View::new(3, [4, 0, 9, 0, 2]).unwrap();
        assert_eq!(view.members(), &[0, 2, 4, 9]);
        let mut counts = std::collections::HashMap::new();
        for id in ids(40_000) {
            let home = view.home(&id);
            assert!(view.contains(home));
            assert_eq!(home, view.home(&id));
            *counts.entry(home).or_insert(0usize) += 1;
        }
        assert_eq!(counts.len(), 4);
        assert!(
            counts.values().all(|&c| c > 9_000 && c < 11_000),
            "{counts:?}"
        );
    }

    #[test]
    fn a_static_file_is_the_view_of_all_its_nodes() {
        let view = View::of_file(3);
        assert_eq!((view.epoch(), view.members()), (0, &[0, 1, 2][..]));
        for id in ids(1_000) {
            assert_eq!(home_of(&id, 3), view.home(&id));
        }
        assert_eq!(home_of(&ObjectId([7; 20]), 1), 0);
    }

    #[test]
    fn a_join_moves_only_what_the_newcomer_wins_and_a_leave_only_the_leavers() {
        let before = View::new(1, [0, 1, 2]).unwrap();
        let joined = before.next(&[3], &[]).unwrap();
        let left = before.next(&[], &[1]).unwrap();
        assert_eq!((joined.epoch(), left.epoch()), (2, 2));
        let (mut moved_by_join, mut moved_by_leave, mut total) = (0, 0, 0);
        for id in ids(100_000) {
            total += 1;
            let home = before.home(&id);
            let after_join = joined.home(&id);
            if after_join != home {
                assert_eq!(after_join, 3, "a join moved an id between old members");
                moved_by_join += 1;
            }
            let after_leave = left.home(&id);
            if home != 1 {
                assert_eq!(
                    after_leave, home,
                    "a leave moved an id the leaver was not home of"
                );
            } else {
                moved_by_leave += 1;
            }
        }
        let share = moved_by_join as f64 / total as f64;
        assert!(
            share <= 1.1 / 4.0 && share > 0.9 / 4.0,
            "a join moved {share}"
        );
        assert!(moved_by_leave > 0);
    }

    #[test]
    fn next_views_count_up_and_refuse_nothing_or_no_member() {
        let view = View::new(5, [1, 2]).unwrap();
        assert_eq!(view.next(&[2], &[]), None);
        assert_eq!(view.next(&[], &[1, 2]), None);
        assert_eq!(view.next(&[], &[2]).unwrap(), View::new(6, [1]).unwrap());
        assert!(View::new(0, []).is_err());
    }

    #[test]
    fn the_text_form_round_trips_and_refuses_other_text() {
        let view = View::new(12, [3, 1, 7]).unwrap();
        assert_eq!(view.encode(), "epoch=12 members=1,3,7");
        assert_eq!(View::decode(&view.encode()).unwrap(), view);
        for bad in [
            "",
            "epoch=1",
            "members=1",
            "epoch=x members=1",
            "epoch=1 members=1,,2",
            "epoch=1 members=",
            "epoch=1 members=1 extra=2",
            "epoch=1 epoch=2 members=1",
            "epoch=-1 members=1",
        ] {
            let err = View::decode(bad).unwrap_err();
            assert_eq!(
                err.kind(),
                shoal_core::error::ErrorKind::InvalidArgument,
                "{bad:?}"
            );
        }
    }

    /// tests/vectors/homes.txt: one line per id, `hex hash home@[0,1,2] home@[0,1,2,3]
    /// home@[1,3,4]`, read by the Python package's test too: both compute the
    /// same homes.
    #[test]
    fn the_shared_vectors_hold() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/homes.txt");
        let text = std::fs::read_to_string(path).unwrap();
        let views = [
            View::new(0, [0, 1, 2]).unwrap(),
            View::new(0, [0, 1, 2, 3]).unwrap(),
            View::new(0, [1, 3, 4]).unwrap(),
        ];
        let mut lines = 0;
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let id = ObjectId::from_hex(fields[0]).unwrap();
            assert_eq!(format!("{:016x}", id_hash(&id)), fields[1], "{line}");
            for (view, want) in views.iter().zip(&fields[2..]) {
                assert_eq!(view.home(&id).to_string(), *want, "{line} in {view}");
            }
            lines += 1;
        }
        assert!(lines >= 64, "{lines} vectors");
    }
}

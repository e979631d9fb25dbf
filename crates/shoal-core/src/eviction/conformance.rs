//! The contract every eviction policy keeps, run against each one `by_name`
//! builds. Policy-specific orderings are tested in each policy's own file.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::{by_name, EvictionPolicy, POLICY_NAMES};
use crate::object_table::Slot;

fn each_policy(mut check: impl FnMut(&str, Box<dyn EvictionPolicy>)) {
    for name in POLICY_NAMES {
        let policy = by_name(name).unwrap_or_else(|| panic!("by_name knows {name}"));
        check(name, policy);
    }
}

fn drain(policy: &mut dyn EvictionPolicy) -> Vec<Slot> {
    let mut order = Vec::new();
    while let Some(v) = policy.victim() {
        order.push(v);
        policy.remove(v);
    }
    order
}

#[test]
fn by_name_builds_each_policy_under_its_name_in_any_case() {
    each_policy(|name, policy| {
        assert_eq!(policy.name(), name);
        assert_eq!(by_name(&name.to_uppercase()).unwrap().name(), name);
    });
    assert!(by_name("mru").is_none());
}

#[test]
fn empty_policy_has_no_victim() {
    each_policy(|name, policy| {
        assert_eq!(policy.victim(), None, "{name}");
        assert!(policy.is_empty(), "{name}");
    });
}

#[test]
fn every_candidate_leaves_exactly_once() {
    each_policy(|name, mut policy| {
        let slots = [7, 0, 3, 1000, 12];
        for s in slots {
            policy.insert(s);
        }
        assert_eq!(policy.len(), slots.len(), "{name}");
        let mut order = drain(policy.as_mut());
        order.sort();
        assert_eq!(order, vec![0, 3, 7, 12, 1000], "{name}");
        assert!(policy.is_empty(), "{name}");
    });
}

#[test]
fn inserting_a_candidate_twice_counts_it_once() {
    each_policy(|name, mut policy| {
        policy.insert(4);
        policy.insert(4);
        assert_eq!(policy.len(), 1, "{name}");
        assert_eq!(drain(policy.as_mut()), vec![4], "{name}");
    });
}

#[test]
fn the_victim_stays_a_candidate_until_removed() {
    each_policy(|name, mut policy| {
        policy.insert(1);
        policy.insert(2);
        let v = policy.victim().unwrap();
        assert_eq!(
            policy.victim(),
            Some(v),
            "{name}: victim() does not consume"
        );
        assert_eq!(policy.len(), 2, "{name}");
        policy.remove(v);
        assert_ne!(policy.victim(), Some(v), "{name}");
    });
}

#[test]
fn unknown_slots_are_ignored() {
    each_policy(|name, mut policy| {
        policy.remove(9);
        policy.touch(9);
        assert!(
            policy.is_empty(),
            "{name}: a touch does not make a candidate"
        );
        assert_eq!(policy.victim(), None, "{name}");
        policy.insert(1);
        policy.remove(u32::MAX - 1);
        policy.touch(500);
        assert_eq!(policy.len(), 1, "{name}");
        assert_eq!(policy.victim(), Some(1), "{name}");
    });
}

#[test]
fn a_referenced_slot_is_never_a_victim() {
    // The store's get: remove (referenced) then touch; the release inserts again.
    each_policy(|name, mut policy| {
        policy.insert(1);
        policy.insert(2);
        policy.remove(1);
        policy.touch(1);
        policy.touch(1);
        assert_eq!(policy.len(), 1, "{name}");
        assert_eq!(policy.victim(), Some(2), "{name}");
        policy.remove(2);
        assert_eq!(policy.victim(), None, "{name}");
        policy.insert(1);
        assert_eq!(policy.victim(), Some(1), "{name}");
    });
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Slot),
    Remove(Slot),
    Touch(Slot),
    EvictOne,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..64).prop_map(Op::Insert),
        (0u32..64).prop_map(Op::Remove),
        (0u32..64).prop_map(Op::Touch),
        Just(Op::EvictOne),
    ]
}

proptest! {
    /// Against a model set of candidates: lengths agree, the victim is always
    /// a candidate (never a removed or evicted slot), and draining at the end
    /// returns exactly the model's candidates.
    #[test]
    fn candidates_match_a_model_set(ops in prop::collection::vec(op(), 0..300)) {
        for name in POLICY_NAMES {
            let mut policy = by_name(name).unwrap();
            let mut model = BTreeSet::new();
            for op in &ops {
                match *op {
                    Op::Insert(s) => {
                        policy.insert(s);
                        model.insert(s);
                    }
                    Op::Remove(s) => {
                        policy.remove(s);
                        model.remove(&s);
                    }
                    Op::Touch(s) => policy.touch(s),
                    Op::EvictOne => {
                        if let Some(v) = policy.victim() {
                            prop_assert!(model.remove(&v), "{} evicted non-candidate {}", name, v);
                            policy.remove(v);
                        }
                    }
                }
                prop_assert_eq!(policy.len(), model.len(), "{}", name);
                match policy.victim() {
                    Some(v) => prop_assert!(model.contains(&v), "{} victim {} not a candidate", name, v),
                    None => prop_assert!(model.is_empty(), "{} has no victim among {:?}", name, model),
                }
            }
            let mut rest = drain(policy.as_mut());
            rest.sort();
            prop_assert_eq!(rest, model.into_iter().collect::<Vec<_>>(), "{}", name);
        }
    }
}

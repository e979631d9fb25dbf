//! The store with the fast path on: a client's references taken through the
//! shared index keep memory from being freed, exactly as references taken
//! through the daemon do.

use std::os::fd::AsFd;

use proptest::prelude::*;

use shoal_core::fast_path::readers::FastReads;
use shoal_core::ids::ObjectId;

use crate::eviction::Lru;
use crate::store::{Store, FAST_READERS};

const READER: u32 = 9;

fn store(size: u64) -> (Store, FastReads) {
    let mut store = Store::new(size, size, 64, Box::new(Lru::default()));
    store.enable_fast_reads(1 << 12).unwrap();
    let (index, table) = store.add_fast_reader(READER).unwrap().unwrap();
    let fast = FastReads::attach(index.as_fd(), table.as_fd()).unwrap();
    (store, fast)
}

fn id(n: u8) -> ObjectId {
    ObjectId([n; 20])
}

fn put(store: &mut Store, n: u8, size: u64) -> u64 {
    let at = store.create(1, id(n), size, 0).unwrap();
    store.seal(1, &[id(n)], true).unwrap();
    at.offset
}

#[test]
fn sealed_objects_are_found_without_the_daemon_and_unsealed_ones_are_not() {
    let (mut s, fast) = store(1 << 16);
    s.create(1, id(1), 100, 4).unwrap();
    assert!(fast.acquire(&id(1)).is_none(), "unsealed");
    s.seal(1, &[id(1)], true).unwrap();
    let found = fast.acquire(&id(1)).unwrap();
    assert_eq!(found.location, s.location(&id(1)).unwrap());
    fast.release(found.position);
    s.check_invariants();
}

#[test]
fn an_object_a_fast_reader_holds_is_not_evicted_until_released() {
    let (mut s, fast) = store(4096);
    let offset = put(&mut s, 1, 1000);
    put(&mut s, 2, 1000);
    let held = fast.acquire(&id(1)).unwrap();
    assert_eq!(s.evict(4096), 1024, "only the object nobody holds");
    assert!(s.contains(&id(1)));
    assert_eq!(s.kept_for_fast_readers(), 1);
    s.check_invariants();
    // Still readable through the fast path, at the same place.
    let again = fast.acquire(&id(1)).unwrap();
    assert_eq!(again.location.offset, offset);
    fast.release(again.position);
    fast.release(held.position);
    assert_eq!(s.evict(4096), 1024, "free once released");
    assert!(!s.contains(&id(1)));
    assert_eq!(s.kept_for_fast_readers(), 0);
    assert_eq!(s.stats().used, 0);
    s.check_invariants();
}

#[test]
fn a_deleted_object_vanishes_at_once_and_its_memory_waits_for_its_readers() {
    let (mut s, fast) = store(4096);
    put(&mut s, 1, 1000);
    let held = fast.acquire(&id(1)).unwrap();
    s.delete(&id(1)).unwrap();
    assert!(!s.contains(&id(1)));
    assert!(fast.acquire(&id(1)).is_none(), "gone from the index");
    assert_eq!(s.stats().used, 1024, "the reader's bytes stay");
    assert_eq!(s.sweep_fast_readers(), 0);
    s.check_invariants();
    fast.release(held.position);
    assert_eq!(s.sweep_fast_readers(), 1);
    assert_eq!(s.stats().used, 0);
    s.check_invariants();
}

#[test]
fn a_deleted_object_also_held_through_the_daemon_waits_for_both() {
    let (mut s, fast) = store(4096);
    put(&mut s, 1, 1000);
    assert!(s.get(2, &id(1)).is_some());
    let held = fast.acquire(&id(1)).unwrap();
    s.delete(&id(1)).unwrap();
    assert!(fast.acquire(&id(1)).is_none());
    s.release(2, &id(1)).unwrap();
    assert_eq!(s.stats().used, 1024, "kept for the fast reader");
    fast.release(held.position);
    s.sweep_fast_readers();
    assert_eq!(s.stats().used, 0);
    s.check_invariants();
}

#[test]
fn a_client_that_goes_away_holds_nothing() {
    let (mut s, fast) = store(4096);
    put(&mut s, 1, 1000);
    fast.acquire(&id(1)).unwrap();
    fast.acquire(&id(1)).unwrap();
    s.delete(&id(1)).unwrap();
    assert_eq!(s.stats().used, 1024);
    // Killed without releasing: its table goes with its connection.
    s.disconnect(READER);
    assert_eq!(s.stats().used, 0);
    s.check_invariants();
}

#[test]
fn objects_published_before_the_fast_path_was_offered_are_found() {
    let mut s = Store::new(4096, 4096, 64, Box::new(Lru::default()));
    put(&mut s, 1, 100);
    s.enable_fast_reads(1 << 12).unwrap();
    let (index, table) = s.add_fast_reader(READER).unwrap().unwrap();
    let fast = FastReads::attach(index.as_fd(), table.as_fd()).unwrap();
    assert!(fast.acquire(&id(1)).is_some());
    assert_eq!(
        s.stats().clients,
        1,
        "the fast readers' principal is not a client"
    );
    let _ = FAST_READERS;
}

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u16),
    FastGet(u8),
    FastRelease(u8),
    Get(u8),
    Release(u8),
    Delete(u8),
    Evict(u16),
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    let n = 0u8..12;
    prop_oneof![
        (n.clone(), 1u16..1500).prop_map(|(n, s)| Op::Put(n, s)),
        n.clone().prop_map(Op::FastGet),
        n.clone().prop_map(Op::FastRelease),
        n.clone().prop_map(Op::Get),
        n.clone().prop_map(Op::Release),
        n.clone().prop_map(Op::Delete),
        (0u16..8192).prop_map(Op::Evict),
        Just(Op::Sweep),
    ]
}

proptest! {
    /// Whatever the order of operations: while a fast-path reader holds an
    /// object, its bytes stay allocated where the reader found them and no
    /// other object is placed over them; the store's invariants hold.
    #[test]
    fn fast_references_always_pin_their_bytes(ops in proptest::collection::vec(op(), 1..120)) {
        let (mut s, fast) = store(8192);
        // Fast references held: (id, position, offset, size).
        let mut held: Vec<(u8, u32, u64, u64)> = Vec::new();
        let mut daemon_refs: Vec<u8> = Vec::new();
        for op in ops {
            match op {
                Op::Put(n, size) => {
                    if s.create(1, id(n), u64::from(size), 0).is_ok() {
                        s.seal(1, &[id(n)], true).unwrap();
                    }
                }
                Op::FastGet(n) => {
                    if let Some(f) = fast.acquire(&id(n)) {
                        held.push((n, f.position, f.location.offset, f.location.data_size));
                    }
                }
                Op::FastRelease(n) => {
                    if let Some(i) = held.iter().position(|h| h.0 == n) {
                        fast.release(held.remove(i).1);
                    }
                }
                Op::Get(n) => {
                    if s.get(2, &id(n)).is_some() {
                        daemon_refs.push(n);
                    }
                }
                Op::Release(n) => {
                    if let Some(i) = daemon_refs.iter().position(|h| *h == n) {
                        daemon_refs.remove(i);
                        s.release(2, &id(n)).unwrap();
                    }
                }
                Op::Delete(n) => {
                    let _ = s.delete(&id(n));
                }
                Op::Evict(bytes) => {
                    s.evict(u64::from(bytes));
                }
                Op::Sweep => {
                    s.sweep_fast_readers();
                }
            }
            s.check_invariants();
            // Every held range is still allocated to an object (its own:
            // objects never move, and no live object overlaps another).
            for &(n, _, offset, size) in &held {
                let covering = s.list_all().into_iter().any(|o| {
                    o.location.offset == offset && o.location.data_size == size
                });
                prop_assert!(covering, "object {n}'s bytes at {offset} were freed while held");
            }
        }
    }
}

#[test]
fn a_read_through_the_fast_path_counts_for_eviction_as_a_get_does() {
    let (mut s, fast) = store(4096);
    put(&mut s, 1, 1000);
    put(&mut s, 2, 1000);
    // Object 1 is the older; a fast-path read makes it the more recent.
    let r = fast.acquire(&id(1)).unwrap();
    fast.release(r.position);
    assert_eq!(s.evict(1024), 1024);
    assert!(s.contains(&id(1)), "the object read stays");
    assert!(!s.contains(&id(2)), "the one nobody read goes");
    // Read once, chosen once: the next eviction takes it.
    assert_eq!(s.evict(1024), 1024);
    assert!(!s.contains(&id(1)));
    s.check_invariants();
}

#[test]
fn a_fast_path_read_before_a_cool_leaves_it_cold_and_one_after_warms_it() {
    let (mut s, fast) = store(4096);
    put(&mut s, 1, 1000);
    put(&mut s, 2, 1000);
    put(&mut s, 3, 1000);
    // The reader of 3 is done with it: read, released, cooled.
    let r = fast.acquire(&id(3)).unwrap();
    fast.release(r.position);
    s.cool(&id(3)).unwrap();
    assert_eq!(
        s.record_fast_reads(),
        0,
        "the read before the cool is counted"
    );
    assert_eq!(s.evict(1024), 1024);
    assert!(!s.contains(&id(3)), "the cooled object goes first");
    // 2 cooled, then read again: warm, a candidate in the policy's order.
    s.cool(&id(2)).unwrap();
    let r = fast.acquire(&id(2)).unwrap();
    fast.release(r.position);
    assert_eq!(s.evict(1024), 1024);
    assert!(
        !s.contains(&id(1)) && s.contains(&id(2)),
        "read after the cool: warm"
    );
    s.check_invariants();
}

#[test]
fn a_create_that_cannot_fit_past_a_held_object_evicts_nothing() {
    let (mut s, fast) = store(8192);
    put(&mut s, 1, 4000);
    put(&mut s, 2, 1000);
    let held = fast.acquire(&id(1)).unwrap();
    // 5000 bytes could come free only by evicting the held object too.
    assert!(s.create(1, id(3), 5000, 0).is_err());
    assert!(
        s.contains(&id(2)),
        "nothing evicted for a create that fails"
    );
    s.check_invariants();
    fast.release(held.position);
    s.create(1, id(3), 5000, 0).unwrap();
    s.check_invariants();
}

#[test]
fn fast_path_reads_recorded_between_evictions_keep_their_order() {
    let (mut s, fast) = store(3 * 1024);
    for n in 1..=3 {
        put(&mut s, n, 1000);
    }
    let clock = s.access_clock();
    // Object 2 read, recorded; then object 1: the policy sees them in the
    // order they were read, not in the order eviction meets them.
    let r = fast.acquire(&id(2)).unwrap();
    fast.release(r.position);
    assert_eq!(s.record_fast_reads(), 1);
    assert_eq!(s.access_clock(), clock + 1, "timed as a get");
    assert_eq!(s.record_fast_reads(), 0, "nothing new");
    let r = fast.acquire(&id(1)).unwrap();
    fast.release(r.position);
    assert_eq!(s.record_fast_reads(), 1);
    // (Met only by eviction, 1 would have gone second: each read buys one
    // second chance in the order the policy names them.)
    assert_eq!(s.evict(1024), 1024);
    assert!(!s.contains(&id(3)), "never read: first out");
    assert_eq!(s.evict(1024), 1024);
    assert!(!s.contains(&id(2)), "read before 1: out before it");
    assert!(s.contains(&id(1)));
    s.check_invariants();
}

/// A lent create looks at the creating filter, then the index: from its
/// create to its delete, an id must be in one of them at every moment a
/// reader on another thread looks (a seal that took the id out of the
/// filter before publishing it let a create of the just-sealed id through).
#[test]
fn an_id_is_always_in_the_creating_filter_or_the_index_until_deleted() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;

    fn numbered(n: u32) -> ObjectId {
        let mut id = [7u8; 20];
        id[..4].copy_from_slice(&n.to_le_bytes());
        ObjectId(id)
    }

    let (mut s, fast) = store(1 << 20);
    let fast = Arc::new(fast);
    let watched = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (fast, watched, stop) = (fast.clone(), watched.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut looks, mut gaps) = (0u64, 0u64);
            while !stop.load(Ordering::SeqCst) {
                let n = watched.load(Ordering::SeqCst);
                if n == 0 {
                    continue;
                }
                let id = numbered(n);
                let seen = fast.maybe_creating(&id) || fast.published(&id);
                looks += 1;
                // Counted only if the id was alive all along the look.
                if !seen && watched.load(Ordering::SeqCst) == n {
                    gaps += 1;
                }
            }
            (looks, gaps)
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(800);
    let mut n = 0;
    while std::time::Instant::now() < deadline {
        n += 1;
        let id = numbered(n);
        s.create(1, id, 64, 0).unwrap();
        watched.store(n, Ordering::SeqCst);
        s.seal(1, &[id], true).unwrap();
        watched.store(0, Ordering::SeqCst);
        s.delete(&id).unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let (looks, gaps) = reader.join().unwrap();
    assert_eq!(gaps, 0, "{gaps} of {looks} looks found neither ({n} seals)");
    s.check_invariants();
}

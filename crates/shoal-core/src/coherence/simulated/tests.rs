use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Barrier};

use proptest::prelude::*;

use super::*;

fn fabric(len: usize, nodes: usize) -> Arc<SimulatedFabric> {
    Arc::new(SimulatedFabric::zeroed(len, nodes))
}

fn object(tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag ^ (i as u8).wrapping_mul(37)) | 1)
        .collect()
}

// ---- the cache model itself ------------------------------------------------

#[test]
fn a_cached_line_hides_later_changes_to_memory() {
    let f = fabric(4 * LINE, 2);
    let (a, b) = (f.node(0), f.node(1));
    assert_eq!(b.read_vec(0, 4), [0; 4]);
    a.write(0, b"new!");
    a.flush(0, 4);
    assert_eq!(f.node(0).read_vec(0, 4), *b"new!");
    assert_eq!(b.read_vec(0, 4), [0; 4], "b still has the line it loaded");
    assert_eq!(b.invalidate(0, 4), 0);
    assert_eq!(b.read_vec(0, 4), *b"new!");
}

#[test]
fn writes_stay_in_the_writers_cache_until_flushed() {
    let f = fabric(2 * LINE, 2);
    let a = f.node(0);
    a.write(LINE + 3, b"abc");
    assert_eq!(a.line_state(LINE), LineState::Dirty);
    assert_eq!(a.line_state(0), LineState::Invalid);
    assert_eq!(a.read_vec(LINE + 3, 3), *b"abc", "a reads its own write");
    let mut physical = [0u8; 3];
    f.read_physical(LINE + 3, &mut physical);
    assert_eq!(physical, [0; 3]);
    a.flush(LINE, LINE);
    f.read_physical(LINE + 3, &mut physical);
    assert_eq!(physical, *b"abc");
    assert_eq!(
        a.line_state(LINE),
        LineState::Invalid,
        "Evict drops the line"
    );
}

#[test]
fn writeback_flush_keeps_the_line_clean() {
    let f = Arc::new(SimulatedFabric::zeroed(LINE, 1).with_flush_kind(FlushKind::WriteBack));
    let a = f.node(0);
    a.write(0, &[9; 8]);
    a.flush(0, 8);
    assert_eq!(a.line_state(0), LineState::Clean);
    let mut physical = [0u8; 8];
    f.read_physical(0, &mut physical);
    assert_eq!(physical, [9; 8]);
}

#[test]
fn invalidate_drops_dirty_lines_and_reports_them() {
    let f = fabric(2 * LINE, 1);
    let a = f.node(0);
    a.write(10, &[7; 4]);
    assert_eq!(a.invalidate(0, 2 * LINE), 1, "one dirty line lost");
    assert_eq!(a.read_vec(10, 4), [0; 4], "the write is gone");
}

#[test]
fn partial_line_write_merges_with_the_rest_of_the_line() {
    let f = Arc::new(SimulatedFabric::with_line_size((0..=255).collect(), 2, 64));
    let (a, b) = (f.node(0), f.node(1));
    a.write(70, &[0; 2]);
    a.flush(70, 2);
    let line = b.read_vec(64, 64);
    assert_eq!(&line[..6], &[64, 65, 66, 67, 68, 69]);
    assert_eq!(&line[6..8], &[0, 0]);
    assert_eq!(&line[8..], &(72..128).collect::<Vec<u8>>()[..]);
}

#[test]
fn unaligned_ranges_touch_every_partial_line() {
    let f = Arc::new(SimulatedFabric::with_line_size(vec![0; 256], 2, 16));
    let (a, b) = (f.node(0), f.node(1));
    b.read_vec(0, 256);
    a.write(15, &[1; 18]); // lines 0, 1, 2
    a.flush(15, 18);
    assert_eq!(b.invalidate(15, 18), 0);
    assert_eq!(b.line_state(0), LineState::Invalid);
    assert_eq!(b.line_state(32), LineState::Invalid);
    assert_eq!(b.line_state(48), LineState::Clean, "line 3 not touched");
    assert_eq!(b.read_vec(15, 18), [1; 18]);
    // Empty ranges do nothing.
    a.write(100, &[]);
    a.flush(100, 0);
    assert_eq!(b.invalidate(100, 0), 0);
    assert_eq!(a.line_state(96), LineState::Invalid);
}

#[test]
fn random_eviction_writes_dirty_lines_back() {
    // One node, evict before every operation: a dirty line reaches memory
    // without any flush.
    let f = Arc::new(SimulatedFabric::zeroed(LINE, 1).with_random_eviction(1, 1));
    let a = f.node(0);
    a.write(0, &[5; 4]);
    assert_eq!(a.resident_lines(), 1);
    a.read_vec(0, 1); // the eviction before this read writes the line back
    let mut physical = [0u8; 4];
    f.read_physical(0, &mut physical);
    assert_eq!(physical, [5; 4]);
}

#[test]
fn random_activity_is_deterministic_for_a_seed() {
    let run = |seed| {
        let f = Arc::new(
            SimulatedFabric::zeroed(16 * LINE, 3)
                .with_random_eviction(seed, 2)
                .with_random_prefetch(3),
        );
        let nodes: Vec<_> = (0..3).map(|i| f.node(i)).collect();
        for step in 0..200 {
            let n = &nodes[step % 3];
            n.write((step * 40) % (15 * LINE), &[step as u8; 40]);
            n.read_vec((step * 70) % (15 * LINE), 50);
        }
        let mut physical = vec![0; f.len()];
        f.read_physical(0, &mut physical);
        let states: Vec<_> = nodes.iter().map(|n| n.resident_lines()).collect();
        (physical, states)
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
}

#[test]
#[should_panic(expected = "outside")]
fn out_of_range_access_panics() {
    fabric(LINE, 1).node(0).read_vec(LINE - 1, 2);
}

#[test]
#[should_panic(expected = "whole number")]
fn memory_must_be_whole_lines() {
    SimulatedFabric::zeroed(LINE + 1, 1);
}

// ---- the protocol ----------------------------------------------------------

/// (a) With the writer's flush and the reader's invalidate, the reader sees
/// exactly what the writer wrote, even if it had the range cached before.
#[test]
fn flush_then_invalidate_delivers_the_written_bytes() {
    let f = fabric(4 * LINE, 2);
    let (a, b) = (f.node(0), f.node(1));
    b.read_vec(0, 3 * LINE); // stale lines in the reader's cache
    let obj = object(0xa0, 3 * LINE - 5);
    a.write(0, &obj);
    a.flush(0, obj.len());
    // seal travels over RPC here
    assert_eq!(b.invalidate(0, obj.len()), 0);
    assert_eq!(b.read_vec(0, obj.len()), obj);
}

/// (b) Without the writer's flush the bytes never left its cache: the reader
/// reads zeros, invalidate or not.
#[test]
fn without_flush_the_reader_sees_old_memory() {
    let f = fabric(2 * LINE, 2);
    let (a, b) = (f.node(0), f.node(1));
    let obj = object(0xb0, LINE + 9);
    a.write(0, &obj);
    // no a.flush
    assert_eq!(b.invalidate(0, obj.len()), 0);
    assert_eq!(b.read_vec(0, obj.len()), vec![0; obj.len()]);
}

/// (c) Reuse without the reader's invalidate: the reader keeps object 1's
/// lines and reads them instead of object 2.
#[test]
fn without_invalidate_a_reused_range_reads_stale() {
    let f = fabric(2 * LINE, 2);
    let (a, b) = (f.node(0), f.node(1));
    let one = object(0x10, 2 * LINE);
    a.write(0, &one);
    a.flush(0, one.len());
    assert_eq!(b.invalidate(0, one.len()), 0);
    assert_eq!(b.read_vec(0, one.len()), one);
    // b releases, the range is freed and reused for object 2.
    let two = object(0x20, 2 * LINE);
    a.write(0, &two);
    a.flush(0, two.len());
    // no b.invalidate
    assert_eq!(b.read_vec(0, two.len()), one, "stale object 1");
    // With it, object 2.
    assert_eq!(b.invalidate(0, two.len()), 0);
    assert_eq!(b.read_vec(0, two.len()), two);
}

/// The writer of an aborted object must flush too: otherwise its dirty lines
/// are evicted later, over the next object at that range.
#[test]
fn abort_without_flush_corrupts_the_next_object() {
    let f = fabric(LINE, 3);
    let (a, b, c) = (f.node(0), f.node(1), f.node(2));
    a.write(0, &object(0x30, LINE)); // aborted, not flushed
    let next = object(0x40, LINE);
    b.write(0, &next);
    b.flush(0, LINE);
    a.flush(0, LINE); // any later eviction of a's line does this
    assert_eq!(c.invalidate(0, LINE), 0);
    assert_ne!(c.read_vec(0, LINE), next);
}

/// Emulated nodes on their own threads, seals over channels, random eviction
/// and prefetch on: every read after seal and invalidate is exact.
#[test]
fn nodes_on_threads_follow_the_protocol() {
    const NODES: usize = 4;
    const ROUNDS: usize = 50;
    let slot = 2 * LINE;
    let f = Arc::new(
        SimulatedFabric::zeroed(NODES * slot, NODES)
            .with_random_eviction(7, 3)
            .with_random_prefetch(3),
    );
    // The allocator's guarantee, reduced to a barrier: a slot is reused only
    // after every node has read (and released) the object in it.
    let released = Barrier::new(NODES);
    let (seal_tx, seal_rx): (Vec<_>, Vec<_>) = (0..NODES).map(|_| mpsc::channel()).unzip();
    let reads = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for (id, seals) in seal_rx.into_iter().enumerate() {
            let node = f.node(id);
            let seal_tx = seal_tx.clone();
            let (released, reads) = (&released, &reads);
            s.spawn(move || {
                for round in 0..ROUNDS {
                    // Write, flush and seal this round's object in our slot...
                    let obj = object((id * ROUNDS + round) as u8, slot - round);
                    node.write(id * slot, &obj);
                    node.flush(id * slot, obj.len());
                    for tx in &seal_tx {
                        tx.send((id * slot, obj.clone())).unwrap();
                    }
                    // ...then read every node's object of this round.
                    for _ in 0..NODES {
                        let (offset, expect): (usize, Vec<u8>) = seals.recv().unwrap();
                        assert_eq!(node.invalidate(offset, expect.len()), 0);
                        assert_eq!(node.read_vec(offset, expect.len()), expect);
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    released.wait();
                }
            });
        }
    });
    assert_eq!(reads.into_inner(), NODES * NODES * ROUNDS);
}

// ---- random interleavings of the whole protocol --------------------------

const SLOTS: usize = 3;
const SLOT_LINES: usize = 3;

/// One object-sized range the allocator hands out again and again.
#[derive(Debug)]
enum Slot {
    Free,
    Writing {
        writer: usize,
        offset: usize,
        data: Vec<u8>,
        written: usize,
    },
    Sealed {
        offset: usize,
        data: Vec<u8>,
        invalidated: Vec<bool>,
        /// The writer whose flush is still to come (only when the protocol
        /// under test seals before flushing).
        late_flush: Option<usize>,
    },
}

/// Which protocol steps [`run_protocol`] performs; every field is `true` in
/// the real protocol, and turning one off must let the checker find a fault.
#[derive(Debug, Clone, Copy)]
struct Protocol {
    flush_before_seal: bool,
    /// False: the seal goes out first and the flush runs some steps later
    /// (what a flush without its trailing fence would allow).
    flush_completes_before_seal: bool,
    invalidate_before_read: bool,
    flush_on_abort: bool,
}

const PROTOCOL: Protocol = Protocol {
    flush_before_seal: true,
    flush_completes_before_seal: true,
    invalidate_before_read: true,
    flush_on_abort: true,
};

/// Random cache activity: (seed, evict one in, prefetch one in).
type RandomActivity = (u64, u32, u32);

/// Drives the protocol for `SLOTS` concurrent objects from a list of
/// `(kind, slot, node, arg)` choices; returns the first read after seal that
/// was not exact (or the first dirty line a reader dropped).
fn run_protocol(
    protocol: Protocol,
    nodes: usize,
    line: usize,
    flush_kind: FlushKind,
    noise: RandomActivity,
    steps: &[(u8, u8, u8, u16)],
) -> Result<(), String> {
    let slot_bytes = SLOT_LINES * line;
    let f = Arc::new(
        SimulatedFabric::with_line_size(vec![0; SLOTS * slot_bytes], nodes, line)
            .with_flush_kind(flush_kind)
            .with_random_eviction(noise.0, noise.1)
            .with_random_prefetch(noise.2),
    );
    let views: Vec<_> = (0..nodes).map(|i| f.node(i)).collect();
    let mut slots: Vec<Slot> = (0..SLOTS).map(|_| Slot::Free).collect();
    let mut generation = 0u32;

    for (step, &(kind, s, n, arg)) in steps.iter().enumerate() {
        let s = usize::from(s) % SLOTS;
        let node = &views[usize::from(n) % nodes];
        let arg = usize::from(arg);
        if kind % 4 == 3 {
            // A stray read: a prefetch, or a node touching a range it has no
            // business reading yet. It may cache stale or half-written lines.
            let start = s * slot_bytes + arg % slot_bytes;
            let len = (arg / 7) % (s * slot_bytes + slot_bytes - start) + 1;
            node.read_vec(start, len);
            continue;
        }
        slots[s] = match std::mem::replace(&mut slots[s], Slot::Free) {
            Slot::Free => {
                // Allocate: a line-aligned object inside the slot.
                generation += 1;
                let first = arg % SLOT_LINES;
                let len = 1 + (arg / SLOT_LINES) % ((SLOT_LINES - first) * line);
                let data = (0..len)
                    .map(|i| (generation as usize * 131 + i * 7 + 1) as u8)
                    .collect();
                Slot::Writing {
                    writer: node.id(),
                    offset: s * slot_bytes + first * line,
                    data,
                    written: 0,
                }
            }
            Slot::Writing {
                writer,
                offset,
                data,
                written,
            } => {
                let w = &views[writer];
                if arg % 16 == 0 {
                    // Abort: flush what was written, free the range.
                    if protocol.flush_on_abort {
                        w.flush(offset, data.len());
                    }
                    Slot::Free
                } else if written < data.len() {
                    let chunk = 1 + arg % (2 * line);
                    let end = (written + chunk).min(data.len());
                    w.write(offset + written, &data[written..end]);
                    Slot::Writing {
                        writer,
                        offset,
                        data,
                        written: end,
                    }
                } else {
                    // Flush, then seal (the seal is this state change: it
                    // reaches readers over RPC, never through the fabric).
                    let mut late_flush = None;
                    if protocol.flush_before_seal {
                        if protocol.flush_completes_before_seal {
                            w.flush(offset, data.len());
                        } else {
                            late_flush = Some(writer);
                        }
                    }
                    Slot::Sealed {
                        offset,
                        invalidated: vec![false; nodes],
                        data,
                        late_flush,
                    }
                }
            }
            Slot::Sealed {
                offset,
                data,
                mut invalidated,
                mut late_flush,
            } => {
                if let Some(writer) = late_flush.filter(|_| arg % 4 == 1 || arg % 8 == 0) {
                    views[writer].flush(offset, data.len());
                    late_flush = None;
                }
                if arg % 8 == 0 {
                    // Every reader released: free.
                    Slot::Free
                } else {
                    let reader = node.id();
                    if !invalidated[reader] && protocol.invalidate_before_read {
                        let lost = node.invalidate(offset, data.len());
                        if lost != 0 {
                            return Err(format!(
                                "step {step}: reader {reader} dropped {lost} dirty lines"
                            ));
                        }
                        invalidated[reader] = true;
                    }
                    let start = (arg / 8) % data.len();
                    let len = 1 + (arg / 3) % (data.len() - start);
                    if node.read_vec(offset + start, len) != data[start..start + len] {
                        return Err(format!(
                            "step {step}: node {reader} misread object at {offset}+{start}..+{len}"
                        ));
                    }
                    Slot::Sealed {
                        offset,
                        data,
                        invalidated,
                        late_flush,
                    }
                }
            }
        };
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// (d) Any interleaving of alloc, chunked writes, aborts, flush + seal,
    /// invalidate + reads, frees, reuse and stray reads, on 2-4 nodes, with
    /// random eviction and prefetch: every read after seal is exact.
    #[test]
    fn protocol_always_reads_exact_bytes(
        nodes in 2usize..=4,
        line in prop_oneof![Just(16usize), Just(64), Just(128)],
        writeback in any::<bool>(),
        seed in any::<u64>(),
        evict_one_in in 0u32..4,
        prefetch_one_in in 0u32..4,
        steps in prop::collection::vec((0u8..4, 0u8..8, 0u8..8, any::<u16>()), 1..400),
    ) {
        let kind = if writeback { FlushKind::WriteBack } else { FlushKind::Evict };
        let noise = (seed, evict_one_in, prefetch_one_in);
        let outcome = run_protocol(PROTOCOL, nodes, line, kind, noise, &steps);
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}

/// Runs `protocol` on random schedules until one goes wrong; the checker
/// above is only worth something if it notices each step missing.
fn finds_fault(protocol: Protocol) -> Option<String> {
    let mut rng = SplitMix64(0x5eed);
    (0..300).find_map(|_| {
        let steps: Vec<_> = (0..300)
            .map(|_| {
                let r = rng.next();
                (
                    (r & 3) as u8,
                    (r >> 8) as u8,
                    (r >> 16) as u8,
                    (r >> 32) as u16,
                )
            })
            .collect();
        let nodes = 2 + rng.below(3);
        let noise = (rng.next(), 3, 3);
        run_protocol(protocol, nodes, 64, FlushKind::Evict, noise, &steps).err()
    })
}

#[test]
fn checker_catches_a_missing_flush_before_seal() {
    let fault = finds_fault(Protocol {
        flush_before_seal: false,
        ..PROTOCOL
    });
    eprintln!("missing flush: {fault:?}");
    assert!(fault.is_some(), "no schedule exposed the missing flush");
}

#[test]
fn checker_catches_a_missing_invalidate_before_read() {
    let fault = finds_fault(Protocol {
        invalidate_before_read: false,
        ..PROTOCOL
    });
    eprintln!("missing invalidate: {fault:?}");
    assert!(
        fault.is_some(),
        "no schedule exposed the missing invalidate"
    );
}

#[test]
fn checker_catches_a_missing_flush_on_abort() {
    let fault = finds_fault(Protocol {
        flush_on_abort: false,
        ..PROTOCOL
    });
    eprintln!("missing flush on abort: {fault:?}");
    assert!(
        fault.is_some(),
        "no schedule exposed the missing flush on abort"
    );
}

#[test]
fn checker_catches_a_seal_sent_before_the_flush() {
    let fault = finds_fault(Protocol {
        flush_completes_before_seal: false,
        ..PROTOCOL
    });
    eprintln!("seal before flush: {fault:?}");
    assert!(
        fault.is_some(),
        "no schedule exposed the seal before the flush"
    );
}

#[test]
fn the_same_random_schedules_pass_with_the_full_protocol() {
    assert_eq!(finds_fault(PROTOCOL), None);
}

//! Tests of the real cache maintenance on the host CPU.
//!
//! A coherent host cannot show that a flush reached memory (that is what
//! `simulated` and the Spin model are for); these check that the instructions
//! run, cover odd ranges without faulting, and never change a byte.

use std::time::{Duration, Instant};

use super::*;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + 7) as u8).collect()
}

#[test]
fn line_is_a_power_of_two_covering_x86_and_power_lines() {
    assert!(LINE.is_power_of_two());
    assert_eq!(LINE % 64, 0, "x86 lines (and adjacent-line pairs) fit");
    assert_eq!(LINE % 128, 0, "POWER lines fit");
}

#[test]
fn flush_keeps_buffer_contents() {
    let buf = pattern(64 * 1024 + 17);
    let expect = buf.clone();
    flush_slice(&buf);
    assert_eq!(buf, expect);
}

#[test]
fn invalidate_keeps_contents_just_written() {
    // The lines are dirty here: invalidate must write them back, not drop them.
    let mut buf = vec![0u8; 8 * LINE + 3];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    invalidate_slice(&buf);
    assert!(buf.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    // And again after a flush, when the lines may be clean or absent.
    flush_slice(&buf);
    invalidate_slice(&buf);
    assert!(buf.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
}

#[test]
fn unaligned_ranges_are_covered_without_fault_or_change() {
    let buf = pattern(6 * LINE);
    let expect = buf.clone();
    // Every start inside the first two lines, lengths around line boundaries,
    // so partial lines at either end occur in every combination.
    for start in 0..2 * LINE {
        for len in [1, 2, 63, 64, 65, 127, 128, 129, 255, 256, 257, 3 * LINE] {
            let range = &buf[start..start + len];
            flush_slice(range);
            invalidate_slice(range);
            // SAFETY: `range` is inside `buf`, which is mapped.
            unsafe {
                flush_range(range.as_ptr(), range.len());
                invalidate_range(range.as_ptr(), range.len());
            }
        }
    }
    assert_eq!(buf, expect);
}

#[test]
fn empty_ranges_are_no_ops_even_for_null() {
    // An empty range names no byte, so no address is touched: a null or
    // dangling pointer must not fault.
    // SAFETY: the range is empty; the contract asks nothing of the pointer.
    unsafe {
        flush_range(std::ptr::null(), 0);
        invalidate_range(std::ptr::null(), 0);
        flush_range(std::ptr::NonNull::<u8>::dangling().as_ptr(), 0);
        invalidate_range(std::ptr::NonNull::<u8>::dangling().as_ptr(), 0);
    }
    flush_slice(&[]);
    invalidate_slice(&[]);
}

#[test]
fn instruction_names_are_known_and_match_the_architecture() {
    let flush = instruction_in_use();
    let invalidate = invalidate_instruction_in_use();
    let known = ["clwb", "clflushopt", "clflush", "dc civac", "dcbf", "none"];
    assert!(known.contains(&flush), "unknown flush instruction {flush}");
    assert!(
        known.contains(&invalidate),
        "unknown invalidate instruction {invalidate}"
    );
    assert_ne!(
        invalidate, "clwb",
        "CLWB may keep the line: it cannot invalidate"
    );
    assert_eq!(instruction_in_use(), flush, "selection is stable");
    if cfg!(target_arch = "x86_64") {
        assert!(["clwb", "clflushopt", "clflush"].contains(&flush));
    }
    if cfg!(target_arch = "aarch64") {
        assert_eq!((flush, invalidate), ("dc civac", "dc civac"));
    }
    if cfg!(target_arch = "powerpc64") {
        assert_eq!((flush, invalidate), ("dcbf", "dcbf"));
    }
    assert_eq!(HAS_CACHE_MAINTENANCE, flush != "none");
}

#[test]
fn flush_and_invalidate_of_one_mib_complete() {
    let buf = pattern(1 << 20);
    let started = Instant::now();
    flush_slice(&buf);
    let flushed = started.elapsed();
    invalidate_slice(&buf);
    let total = started.elapsed();
    eprintln!(
        "{}: flush 1 MiB in {flushed:?}; {}: invalidate in {:?}",
        instruction_in_use(),
        invalidate_instruction_in_use(),
        total - flushed
    );
    // 16384 lines; even CLFLUSH on a loaded shared CI host does this in
    // milliseconds. The bound only catches a runaway loop.
    assert!(total < Duration::from_secs(5), "took {total:?}");
    assert_eq!(buf, pattern(1 << 20));
}

#[test]
fn fence_runs() {
    fence();
    fence();
}

#[test]
fn protocol_steps_across_threads_keep_bytes() {
    // The protocol's shape on one coherent host: writer flushes then "seals"
    // over a channel; the reader invalidates once then reads.
    let mut object = vec![0u8; 3 * LINE];
    let (seal, sealed) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let written = pattern(object.len());
            object.copy_from_slice(&written);
            flush_slice(&object);
            seal.send(()).unwrap();
        });
    });
    sealed.recv().unwrap();
    invalidate_slice(&object);
    assert_eq!(object, pattern(3 * LINE));
}

#[test]
fn portable_fallback_only_fences() {
    assert_eq!(portable::flush_instruction(), "none");
    assert_eq!(portable::invalidate_instruction(), "none");
    let buf = pattern(300);
    // SAFETY: `buf` is mapped; the fallback dereferences nothing anyway.
    unsafe {
        portable::flush_range(buf.as_ptr(), buf.len());
        portable::invalidate_range(buf.as_ptr(), buf.len());
        portable::flush_range(std::ptr::null(), 0);
    }
    portable::fence();
    assert_eq!(buf, pattern(300));
}

//! Filling a process's page tables for shared memory ahead of its use.
//!
//! A process that maps the store's region takes a minor fault the first time
//! it touches each page (one per 16 pages with the kernel's fault-around).
//! `MADV_POPULATE_READ` / `_WRITE` fill the page tables of a whole range in
//! one call at a fraction of that cost, yet still ~3–7 ms per 100 MB of
//! 4 KiB pages here. A writer populates before it writes (it is about to
//! touch every byte now). A reader hands the range to a background thread
//! instead, so that a get costs the same whatever the object's size: the
//! first get of a 100 MB object in chunks this process had never used took
//! ~7 ms, a 1 kB one ~10 µs. Reads that overtake the thread fault as usual;
//! nothing waits for it.

use std::sync::mpsc;
use std::sync::{Arc, OnceLock, Weak};

use memmap2::MmapRaw;

/// Faults in `[ptr, ptr + len)` of a shared mapping with one system call
/// (MADV_POPULATE_WRITE / _READ, Linux ≥ 5.14), which costs a fraction of
/// taking the faults one page at a time. Falls back to touching each page
/// only where the kernel lacks the call (EINVAL): other failures (EFAULT: a
/// hugetlbfs region out of huge pages, a poisoned page) are where a touch
/// would raise SIGBUS, so the range is left to fault, or fail, when used.
///
/// # Safety
/// The range must lie inside a live mapping of the caller's (writable if `write`).
pub unsafe fn populate(ptr: *mut u8, len: usize, write: bool) {
    const MADV_POPULATE_READ: libc::c_int = 22;
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    let page = page_size();
    let start = (ptr as usize) & !(page - 1);
    let end = ptr as usize + len;
    let advice = if write {
        MADV_POPULATE_WRITE
    } else {
        MADV_POPULATE_READ
    };
    // SAFETY: page-aligned range inside the caller's mapping; madvise only faults pages in.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, advice) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // Old kernel: take the faults by reading. Never write back: other
        // processes may be writing these pages right now.
        let mut at = start;
        while at < end {
            // SAFETY: `at` is inside the mapping; a volatile read faults the page in.
            let _ = unsafe { std::ptr::read_volatile(at as *const u8) };
            at += page;
        }
    }
}

/// The system's base page size in bytes (`_SC_PAGESIZE`), 4096 if it cannot be read.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

/// Populates `[offset, offset + len)` of `map` for reading on the process's
/// populating thread, or here when there is none (it could not be started,
/// or this process is a fork of the one that started it). The job holds the
/// mapping weakly: a mapping its client dropped is skipped (and unmapped),
/// one still held stays mapped while its range is populated.
pub fn populate_for_reading(map: &Arc<MmapRaw>, offset: usize, len: usize) {
    if len == 0 || offset.checked_add(len).is_none_or(|end| end > map.len()) {
        return;
    }
    if let Some(thread) = populating_thread() {
        let job = Job::Populate {
            map: Arc::downgrade(map),
            offset,
            len,
        };
        if thread.jobs.send(job).is_ok() {
            return;
        }
    }
    // SAFETY: inside the live mapping (checked above).
    unsafe { populate(map.as_mut_ptr().add(offset), len, false) }
}

/// Waits until every range handed to the populating thread before this call
/// is populated (tests and benchmarks that count page faults).
pub fn settle() {
    let Some(thread) = populating_thread() else {
        return;
    };
    let (done, wait) = mpsc::sync_channel(1);
    if thread.jobs.send(Job::Settle(done)).is_ok() {
        let _ = wait.recv();
    }
}

enum Job {
    Populate {
        map: Weak<MmapRaw>,
        offset: usize,
        len: usize,
    },
    Settle(mpsc::SyncSender<()>),
}

struct PopulatingThread {
    /// The process that started it: a forked child has no such thread.
    pid: u32,
    jobs: mpsc::Sender<Job>,
}

/// The process's populating thread, started on first use; `None` when it
/// could not be started or this process is a fork of the one that did.
fn populating_thread() -> Option<&'static PopulatingThread> {
    static THREAD: OnceLock<Option<PopulatingThread>> = OnceLock::new();
    let thread = THREAD
        .get_or_init(|| {
            let (jobs, work) = mpsc::channel();
            std::thread::Builder::new()
                .name("shoal-populate".into())
                .spawn(move || run(work))
                .ok()?;
            Some(PopulatingThread {
                pid: std::process::id(),
                jobs,
            })
        })
        .as_ref()?;
    (thread.pid == std::process::id()).then_some(thread)
}

/// How much the populating thread fills per system call.
const PIECE: usize = 256 << 10;

fn run(work: mpsc::Receiver<Job>) {
    // Nice 19: on a busy machine the thread must not take a core from the
    // reader it serves, yet not SCHED_IDLE, which could leave it preempted
    // for long while it holds the mmap lock the process's mmap/munmap needs.
    // SAFETY: setpriority of this thread (its tid) only; failure leaves
    // the priority as it was.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
    for job in work {
        match job {
            Job::Populate { map, offset, len } => {
                // Nobody maps it any more (the client went away): skip it.
                let Some(map) = map.upgrade() else {
                    continue;
                };
                // A piece at a time: populating holds the process's mmap
                // lock, which the caller's own mmap/munmap (an allocator
                // growing) must not wait behind for a whole object.
                let mut at = offset;
                while at < offset + len {
                    let n = PIECE.min(offset + len - at);
                    // SAFETY: checked inside the mapping when scheduled;
                    // the upgraded `map` keeps it mapped until this returns.
                    unsafe { populate(map.as_mut_ptr().add(at), n, false) }
                    at += n;
                }
            }
            Job::Settle(done) => {
                let _ = done.send(());
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn anon_map(len: usize) -> Arc<MmapRaw> {
        let map = memmap2::MmapOptions::new().len(len).map_anon().unwrap();
        Arc::new(MmapRaw::from(map))
    }

    /// Minor page faults this thread took so far (region.rs's tests too).
    pub(crate) fn minor_faults() -> i64 {
        // SAFETY: rusage is plain integers, for which all zeroes is valid.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: getrusage writes into the struct we own.
        let read = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        assert_eq!(read, 0);
        usage.ru_minflt
    }

    #[test]
    fn a_range_handed_over_is_populated_by_the_thread_not_the_caller() {
        // Fresh anonymous memory: no page tables filled yet.
        let map = anon_map(8 << 20);
        let before = minor_faults();
        populate_for_reading(&map, 4096, 6 << 20);
        // Out of range or empty: ignored.
        populate_for_reading(&map, 8 << 20, 1);
        populate_for_reading(&map, usize::MAX, 2);
        populate_for_reading(&map, 0, 0);
        assert!(minor_faults() - before < 8, "the caller took the faults");
        settle();
        let before = minor_faults();
        let mut sum = 0u64;
        for at in (4096..(6 << 20)).step_by(4096) {
            // SAFETY: inside the mapping.
            sum += u64::from(unsafe { map.as_mut_ptr().add(at).read_volatile() });
        }
        assert_eq!(sum, 0);
        assert!(minor_faults() - before < 8, "populated before the reads");
    }

    #[test]
    fn a_range_whose_mapping_was_dropped_is_skipped() {
        let map = anon_map(4 << 20);
        populate_for_reading(&map, 0, 4 << 20);
        let weak = Arc::downgrade(&map);
        drop(map); // unmapped now: the queued job holds it weakly
        assert!(weak.upgrade().is_none());
        settle();
    }
}

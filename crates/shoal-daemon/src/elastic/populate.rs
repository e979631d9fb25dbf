//! The region's memory brought back up to the target, ahead of use: the
//! other half of `release.rs`. An elastic store populates its region only
//! up to its target (at start, and again each time it grows back after a
//! shrink punched holes in it), so a restore or create into a grown store
//! finds its pages allocated instead of faulting each one in while the
//! data job waits.
//!
//! Doing it at once matters beyond moving the faults off the data path: on
//! a virtual machine with free page reporting (virtio-balloon), memory the
//! compute job frees is handed back to the hypervisor a couple of seconds
//! later, and each page touched after that faults in the host too. Here a
//! huge-page tmpfs populates at 17 GiB/s right after a punch and at
//! 0.4–0.8 GiB/s four seconds later; the pass after a burst took 3–4 s
//! instead of 1.5 s (bench/results/elastic-forecast-huge.md, run of
//! 2026-11-26, in git history: 8ede608).
//!
//! One thread per daemon does it, a huge page at a time, checking
//! before each piece that the region still holds less than the target
//! (a shrink lowers it: the piece in flight may land after a punch, and
//! the next step gives it back). Free ranges are filled in the order the
//! allocator hands them out (best fit: smallest first, lowest address
//! first), so the pages populated are those the next objects take.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use prometheus_client::metrics::counter::Counter;
use shoal_core::location::Block;
use shoal_core::region::Region;

/// Bytes allocated per system call: one huge page. Each call holds the
/// region file's inode lock, which a shrink's hole punching needs: short
/// calls let a shrink through at once (and stop the thread within one).
const PIECE: u64 = 2 << 20;

/// A pass fills the region up to this much below the target (pages of a
/// block's neighbours, a piece's rounding).
const SLACK: u64 = 4 << 20;

/// A pass starts only when the region holds less than the target by more
/// than this share of it (and SLACK): while a burst holds the store down,
/// the law's target wavers by a few percent each step, and filling each
/// rise only to punch it at the next step cost ~4 GiB of churn per burst
/// (bench/results/elastic-cycles-huge.md, run of 2026-11-27, in git history:
/// 2ecf339: 28 GiB given back in 4 bursts).
const START_SHARE: u64 = 16;

/// A pass: the region and its free ranges in the allocator's order.
struct Job {
    region: Arc<Region>,
    ranges: Vec<Block>,
}

pub(super) struct Populator {
    jobs: mpsc::Sender<Job>,
    /// The target the thread fills up to (0 stops it).
    limit: Arc<AtomicU64>,
    /// A pass is under way: steps do not queue another.
    busy: Arc<AtomicBool>,
}

impl Populator {
    /// Starts the thread; `None` (with a warning) if it cannot be started,
    /// when the region simply fills as it is used.
    /// `populated` counts the bytes the region grew by its passes.
    pub(super) fn start(limit: u64, populated: Counter) -> Option<Self> {
        let (jobs, work) = mpsc::channel::<Job>();
        let limit = Arc::new(AtomicU64::new(limit));
        let busy = Arc::new(AtomicBool::new(false));
        let thread = Worker {
            limit: limit.clone(),
            busy: busy.clone(),
            populated,
        };
        // At the daemon's own priority, not nice 19: each call holds the
        // inode lock the next shrink's punch needs, and a starved thread
        // preempted inside one held shrinks up for 0.4–1.6 s on a busy
        // node (bench/results/elastic-cycles-huge-2.md, run of 2026-11-27, in git
        // history: 2ecf339). Its work comes in
        // short bursts right after the store grows, when it must beat the
        // hypervisor's page reporting anyway.
        let started = std::thread::Builder::new()
            .name("shoal-fill".into())
            .spawn(move || thread.run(work));
        if let Err(err) = started {
            tracing::warn!(%err, "cannot start the region-populating thread; the region fills as it is used");
            return None;
        }
        Some(Self { jobs, limit, busy })
    }

    /// Called at each control step with the new target: when the region
    /// holds less than it and `may_start`, starts a pass over `free_ranges`
    /// (asked only then: listing them costs a walk of the allocator's free
    /// blocks). The caller says no while a burst is still growing: memory
    /// allocated between its steps only pushes the node over its threshold
    /// again at the next one.
    pub(super) fn follow(
        &self,
        region: &Arc<Region>,
        target: u64,
        may_start: bool,
        free_ranges: impl FnOnce() -> Vec<Block>,
    ) {
        self.limit.store(target, Ordering::Relaxed);
        if !may_start || self.busy.load(Ordering::Acquire) || !below(region, target) {
            return;
        }
        let mut ranges = free_ranges();
        ranges.sort_unstable_by_key(|b| (b.len, b.offset));
        self.busy.store(true, Ordering::Release);
        let job = Job {
            region: region.clone(),
            ranges,
        };
        if self.jobs.send(job).is_err() {
            self.busy.store(false, Ordering::Release);
        }
    }
}

/// Whether the region holds less than `target` by enough to start a pass.
fn below(region: &Region, target: u64) -> bool {
    let margin = SLACK.max(target / START_SHARE);
    region
        .resident_bytes()
        .is_ok_and(|resident| resident.saturating_add(margin) < target)
}

struct Worker {
    limit: Arc<AtomicU64>,
    busy: Arc<AtomicBool>,
    populated: Counter,
}

impl Worker {
    fn run(self, work: mpsc::Receiver<Job>) {
        // A region whose file never allocated (a DAX device) is left to
        // fill as it is used; one that did once (tmpfs) may have been full
        // for a moment, and is tried again at the next growth.
        let mut given_up = false;
        for job in work {
            if !given_up {
                let filled = self.fill(&job);
                given_up = !filled && self.populated.get() == 0;
            }
            self.busy.store(false, Ordering::Release);
        }
    }

    /// One pass; false if the region's file refused to allocate.
    fn fill(&self, job: &Job) -> bool {
        // What the region holds, read once per piece: after it, for the
        // counter and the next piece's check alike.
        let Ok(mut resident) = job.region.resident_bytes() else {
            return false;
        };
        for range in &job.ranges {
            let mut at = range.offset;
            let end = range.offset + range.len;
            while at < end {
                if resident.saturating_add(SLACK) >= self.limit.load(Ordering::Relaxed) {
                    return true;
                }
                let n = PIECE.min(end - at);
                if let Err(err) = job.region.allocate_pages(at, n) {
                    tracing::info!(%err, "the region's file cannot allocate ahead of use; it fills as it is used");
                    return false;
                }
                let after = job.region.resident_bytes().unwrap_or(resident);
                self.populated.inc_by(after.saturating_sub(resident));
                resident = after;
                at += n;
            }
        }
        true
    }
}

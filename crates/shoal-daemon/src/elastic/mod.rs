//! Elastic capacity (issue 11, DynIMS): one loop under the supervisor that
//! every T reads the node's memory use, steps shoal-core's controller and
//! applies its target to the store, then gives the freed memory back to
//! the kernel.
//!
//! - `config.rs`: what a daemon is configured with;
//! - `sampler.rs`: where v_i, M and the pressure are read;
//! - `release.rs`: hole punching over the region's free ranges;
//! - `populate.rs`: the region's memory allocated back up to the target;
//! - `prefetch.rs`: a shrink's victims brought back when it grows again;
//! - this file: the loop, its state, and what it shows (`shoal stat`,
//!   metrics, the trace).
//!
//! A shrink, in order: the idle loans other nodes hold here are taken
//! back (their references pin objects), the store's capacity drops and
//! evicts (clean objects leave at once; dirty ones are spilled down a tier
//! by the tiers' listener and freed when written; an object no tier takes
//! stays `Kept`: nothing sealed is lost), and the free ranges are punched
//! until the region holds no more than the target. Objects in use are
//! never evicted: when they alone exceed the target the store stays above
//! it, the controller says so, and creates are refused (`StoreFull` with
//! the reason) instead of pushing the node into swap.

mod config;
mod populate;
mod prefetch;
mod release;
mod sampler;

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use shoal_capacity::{CapacityTrace, Controller, ControllerState, MemorySample};
use shoal_core::error::Result;
use shoal_core::protocol::CapacityReport;

pub use config::{ElasticConfig, SourceChoice};
use populate::Populator;
pub use prefetch::Restorer;
use prefetch::{InMemory, Prefetch};
use sampler::Sampler;

use crate::cluster::Cluster;
use crate::node::Node;
use crate::supervisor::Supervisor;
use crate::tiers::restore::RestoreOutcome;

/// Memory the region may hold above the target before pages are punched:
/// a block's partial pages stay (its neighbours use them), and punching a
/// few pages at a time is not worth a pass.
const RELEASE_SLACK: u64 = 2 << 20;

/// The region is populated back up to the target only this long after the
/// store last shrank: longer than a burst's steps are apart (1 s in the
/// seed's HPCC profile), shorter than the ~2 s after which a hypervisor
/// with free page reporting has taken the freed memory back.
const POPULATE_AFTER_SHRINK: Duration = Duration::from_millis(1500);

/// Failing reads are logged once per this many, not every 100 ms.
const READ_ERROR_LOG_EVERY: u64 = 600;

pub struct Elastic {
    node: Rc<Node>,
    cluster: Option<Rc<Cluster>>,
    controller: RefCell<Controller>,
    sampler: Sampler,
    trace: RefCell<CapacityTrace>,
    started: Instant,
    /// Keeps the region's memory allocated up to the target (`None`: the
    /// region fills as it is used, `--no-prefault`).
    populator: Option<Populator>,
    /// When a step last lowered the capacity.
    last_shrink: Cell<Option<Instant>>,
    over_target: Cell<bool>,
    steps: Cell<u64>,
    released: Cell<u64>,
    read_errors: Cell<u64>,
    /// The region's resident bytes after a pass that could not reach its
    /// budget (objects in use, partial pages): no new pass until it grows.
    futile_at: Cell<Option<u64>>,
    /// `None`: prefetch on growth is off.
    prefetch: Option<Rc<Prefetch>>,
    /// What prefetches restore through; set once the daemon's operations
    /// exist (they are made after the controller).
    restorer: RefCell<Option<Weak<dyn Restorer>>>,
    supervisor: Supervisor,
}

impl Elastic {
    /// Validates the configuration, reads the source once (a daemon that
    /// cannot read its node's memory refuses to start rather than run
    /// blind) and starts the loop under `supervisor`. With `populate_ahead`
    /// (the daemon's prefault) the region's memory is allocated up to the
    /// target, at start and whenever the store grows back.
    pub fn start(
        config: &ElasticConfig,
        node: Rc<Node>,
        cluster: Option<Rc<Cluster>>,
        supervisor: &Supervisor,
        populate_ahead: bool,
    ) -> Result<Rc<Self>> {
        let mut controller_config = config.controller.clone();
        // The store's configured capacity (at most the mapped memory) is
        // the ceiling of U_max.
        let ceiling = node.read(|s| s.capacity());
        controller_config.max_capacity = Some(
            controller_config
                .max_capacity
                .map_or(ceiling, |cap| cap.min(ceiling)),
        );
        controller_config.min_capacity = controller_config.min_capacity.min(ceiling);
        let sampler = Sampler::new(&config.source)?;
        let usage = sampler.usage()?;
        sampler.pressure()?;
        // The paper starts at U_max.
        let initial = controller_config.max_capacity_for(usage.total());
        let controller = Controller::new(controller_config, initial)?;
        let interval = controller.config().interval;
        node.set_capacity(initial);
        tracing::info!(
            source = %sampler.describe(),
            interval = ?interval,
            urgent_interval = ?controller.config().urgent_interval,
            threshold = controller.config().threshold,
            gain = controller.config().gain,
            initial,
            node_used = usage.used(),
            node_total = usage.total(),
            "elastic capacity controller running"
        );
        let prefetch = (config.prefetch > 0).then(|| Rc::new(Prefetch::new(config.prefetch)));
        if let Some(prefetch) = &prefetch {
            node.listen(prefetch.clone());
        }
        let populated = node.metrics().controller.populated_bytes.clone();
        let populator = populate_ahead
            .then(|| Populator::start(initial, populated))
            .flatten();
        let elastic = Rc::new(Self {
            node,
            cluster,
            controller: RefCell::new(controller),
            sampler,
            trace: RefCell::new(CapacityTrace::new(config.trace_points)),
            started: Instant::now(),
            populator,
            last_shrink: Cell::new(None),
            over_target: Cell::new(false),
            steps: Cell::new(0),
            released: Cell::new(0),
            read_errors: Cell::new(0),
            futile_at: Cell::new(None),
            prefetch,
            restorer: RefCell::new(None),
            supervisor: supervisor.clone(),
        });
        let looping = elastic.clone();
        supervisor.spawn_local("elastic capacity", async move {
            // Every T, or every urgent interval while a burst is met
            // (Controller::next_interval); steps start at a fixed cadence, so
            // a step's own cost does not stretch the interval.
            let mut due = tokio::time::Instant::now();
            loop {
                tokio::time::sleep_until(due).await;
                looping.step().await;
                let next = looping.controller.borrow().next_interval();
                due = (due + next).max(tokio::time::Instant::now());
            }
        });
        Ok(elastic)
    }

    /// The daemon's operations, for prefetch restores.
    pub fn attach(&self, restorer: Weak<dyn Restorer>) {
        *self.restorer.borrow_mut() = Some(restorer);
    }

    /// One control step: sample, step the law, apply, give memory back.
    pub async fn step(&self) {
        let cpu = thread_cpu_time();
        let sample = match self.sample() {
            Ok(sample) => sample,
            Err(err) => {
                let n = self.read_errors.get();
                self.read_errors.set(n + 1);
                if n.is_multiple_of(READ_ERROR_LOG_EVERY) {
                    tracing::warn!(%err, failures = n + 1, "capacity controller cannot read the node's memory; capacity unchanged");
                }
                return;
            }
        };
        let state = self.controller.borrow_mut().step(&sample);
        let capacity = self.node.read(|s| s.capacity());
        let mut cpu_spent = thread_cpu_time().saturating_sub(cpu);
        if state.target < capacity {
            // Other nodes' idle loans pin objects here: ask for them first
            // (a no-op without any).
            if let Some(cluster) = &self.cluster {
                cluster.take_back_idle().await;
            }
        }
        let cpu = thread_cpu_time();
        self.apply(&sample, &state);
        cpu_spent += thread_cpu_time().saturating_sub(cpu);
        self.node
            .metrics()
            .controller
            .cpu_seconds
            .inc_by(cpu_spent.as_secs_f64());
    }

    fn sample(&self) -> Result<MemorySample> {
        Ok(MemorySample {
            time: self.started.elapsed(),
            usage: self.sampler.usage()?,
            store_resident: self.node.read(|s| s.used()),
            pressure: self.sampler.pressure()?,
        })
    }

    /// Applies the controller's target to the store and the region, and
    /// records what happened.
    fn apply(&self, sample: &MemorySample, state: &ControllerState) {
        let target = state.target;
        let before = self.node.read(|s| s.capacity());
        if target < before {
            self.last_shrink.set(Some(Instant::now()));
        }
        if let Some(populator) = &self.populator {
            // First: a shrink stops a pass under way before pages are
            // punched. A pass starts only once the store has not shrunk for
            // a while: a burst grows in steps, and filling the region
            // between them made each step cross the threshold further
            // (shrink reaction p99 0.5–1.0 s instead of ~0.1 s).
            let quiet = self
                .last_shrink
                .get()
                .is_none_or(|at| at.elapsed() >= POPULATE_AFTER_SHRINK);
            populator.follow(self.node.region(), target, quiet, || {
                self.node.read(|s| s.free_ranges().collect())
            });
        }
        // Carrying a shrink out (evicting, giving pages back) is counted
        // apart from the law's own cost.
        let evicting = thread_cpu_time();
        if let Some(prefetch) = &self.prefetch {
            // What leaves memory while the store is below its full size
            // (this shrink's victims, and those of the creates and
            // restores squeezed into it until it grows back) is what a
            // growth brings back.
            // U_max of this step: it follows the node's total memory (a
            // cgroup limit may move).
            let full = self
                .controller
                .borrow()
                .config()
                .max_capacity_for(sample.usage.total());
            prefetch.set_recording(target < full);
            prefetch.set_shrinking(target < before);
        }
        self.node.set_capacity(target);
        let mut release_cpu = thread_cpu_time().saturating_sub(evicting);
        let (capacity, used, pinned) = self.node.read(|s| (s.capacity(), s.used(), s.pinned()));
        if capacity >= before {
            self.refill(capacity.saturating_sub(used));
        }
        self.note_over_target(pinned, target);
        let giving = thread_cpu_time();
        self.give_back(target.max(used));
        release_cpu += thread_cpu_time().saturating_sub(giving);
        self.steps.set(self.steps.get() + 1);
        self.trace.borrow_mut().record_step(sample, state, capacity);
        let gauges = &self.node.metrics().controller;
        gauges.target_bytes.set(target as i64);
        gauges.ratio.set(state.utilisation);
        gauges.node_used_bytes.set(sample.usage.used() as i64);
        gauges.node_total_bytes.set(sample.usage.total() as i64);
        gauges.step_bytes.set(state.step);
        gauges.pinned_bytes.set(pinned as i64);
        gauges.over_target.set(self.over_target.get() as i64);
        gauges.stall_ratio.set(state.stall_share.unwrap_or(0.0));
        gauges.steps.inc();
        gauges.release_cpu_seconds.inc_by(release_cpu.as_secs_f64());
        if state.urgent {
            gauges.urgent_steps.inc();
        }
    }

    /// At a step that did not shrink the store, with `room` free in it:
    /// starts the refill loop if victims of a shrink wait and may fit (a
    /// no-op when prefetch is off). The loop restores them in the order
    /// they are predicted to be read, each only if it fits the room free
    /// just then, and ends when none is left, the next one does not fit,
    /// or the store shrinks.
    fn refill(&self, room: u64) {
        let restorer = self.restorer.borrow().as_ref().and_then(Weak::upgrade);
        let (Some(prefetch), Some(restorer)) = (&self.prefetch, restorer) else {
            return;
        };
        if !prefetch.start_refill(room) {
            return;
        }
        let node = self.node.clone();
        let prefetch = prefetch.clone();
        self.supervisor.spawn_local("prefetch", async move {
            let free = |node: &Node| node.read(|s| s.capacity().saturating_sub(s.used()));
            let blocked_at = 'refill: loop {
                let batch = node.read(|s| {
                    let room = s.capacity().saturating_sub(s.used());
                    prefetch.take_batch(room, s.access_clock(), |id| InMemory::of(s.residency(id)))
                });
                if batch.is_empty() {
                    let room = free(&node);
                    break (prefetch.pending() > 0).then_some(room);
                }
                for (n, &(id, bytes)) in batch.iter().enumerate() {
                    // Only into free room: a prefetch never evicts (the
                    // data job's restores and creates take room too).
                    let room = free(&node);
                    let shrinking = prefetch.shrinking();
                    if shrinking || bytes > room {
                        for (id, _) in &batch[n..] {
                            prefetch.put_back(id);
                        }
                        // Stopped by a shrink, the next growth starts
                        // again whatever its room.
                        break 'refill (!shrinking).then_some(room);
                    }
                    match restorer.restore_object(id).await {
                        Ok(RestoreOutcome::Restored(_)) => {
                            node.metrics().controller.prefetched.inc();
                        }
                        // In memory already, deleted meanwhile, or in no
                        // tier (a cluster's network copy): no bytes spent.
                        Ok(RestoreOutcome::NotBelow) => prefetch.refund(bytes),
                        Err(err) => {
                            prefetch.refund(bytes);
                            tracing::debug!(%id, %err, "prefetch restore failed");
                        }
                    }
                }
            };
            prefetch.refill_done(blocked_at);
        });
    }

    /// Logs when objects in use alone start or stop exceeding the target.
    fn note_over_target(&self, pinned: u64, target: u64) {
        let over = pinned > target;
        if over != self.over_target.replace(over) {
            if over {
                tracing::warn!(
                    pinned,
                    target,
                    "objects in use alone exceed the capacity target: the store stays above it and refuses new objects until they are released or the node's memory frees up"
                );
            } else {
                tracing::info!(
                    pinned,
                    target,
                    "objects in use fit the capacity target again"
                );
            }
        }
    }

    /// Punches the free ranges while the region holds more than `budget`.
    fn give_back(&self, budget: u64) {
        let budget = budget.saturating_add(RELEASE_SLACK);
        let resident = match self.node.region().resident_bytes() {
            Ok(resident) => resident,
            Err(err) => {
                tracing::warn!(%err, "cannot read the region's resident memory");
                return;
            }
        };
        if resident <= budget || self.futile_at.get().is_some_and(|at| resident <= at) {
            return;
        }
        match release::release_above(&self.node, budget) {
            Ok(pass) => {
                self.released.set(self.released.get() + pass.released);
                self.node
                    .metrics()
                    .controller
                    .released_bytes
                    .inc_by(pass.released);
                self.futile_at
                    .set((pass.resident > budget).then_some(pass.resident));
                tracing::debug!(
                    released = pass.released,
                    resident = pass.resident,
                    budget,
                    "region memory given back"
                );
            }
            Err(err) => tracing::warn!(%err, "cannot give the region's free memory back"),
        }
    }

    /// Why a create found no room, when the controller is the reason.
    pub fn refusal(&self) -> Option<String> {
        if !self.over_target.get() {
            return None;
        }
        let last = self.controller.borrow().last_state().copied()?;
        Some(format!(
            "the capacity controller holds the store at {} bytes because the node's memory is {:.1}% used (threshold {:.1}%), and objects in use alone exceed that: release objects or wait for the node's memory to free up",
            last.target,
            100.0 * last.utilisation,
            100.0 * self.controller.borrow().config().threshold
        ))
    }

    /// The controller's state for `shoal stat`, with the trace points
    /// later than `trace_since` when asked.
    pub fn report(&self, trace_since: Option<Duration>) -> CapacityReport {
        let controller = self.controller.borrow();
        let config = controller.config();
        let (capacity, used, pinned) = self.node.read(|s| (s.capacity(), s.used(), s.pinned()));
        let gauges = &self.node.metrics().controller;
        let mut report = CapacityReport {
            enabled: true,
            source: self.sampler.describe(),
            interval: config.interval,
            threshold: config.threshold,
            gain: config.gain,
            min_capacity: config.min_capacity,
            target: controller.target(),
            capacity,
            used,
            pinned,
            resident: self.node.region().resident_bytes().unwrap_or(0),
            over_target: self.over_target.get(),
            steps: self.steps.get(),
            released_bytes: self.released.get(),
            cpu_seconds: gauges.cpu_seconds.get(),
            release_cpu_seconds: gauges.release_cpu_seconds.get(),
            urgent_steps: gauges.urgent_steps.get(),
            ..Default::default()
        };
        if let Some(last) = controller.last_state() {
            report.max_capacity = last.max_capacity;
            report.utilisation = last.utilisation;
            report.last_step = last.step;
            report.stall_share = last.stall_share;
            report.psi_action = last.psi_action;
        }
        if let Some(point) = self.trace.borrow().latest() {
            report.node_used = point.node_used;
            report.node_total = point.node_total;
        }
        if let Some(since) = trace_since {
            report.trace = self.trace.borrow().since(since).copied().collect();
        }
        report
    }
}

/// CPU time of the calling thread (the daemon's: the controller runs on it).
fn thread_cpu_time() -> Duration {
    // SAFETY: clock_gettime writes into the timespec we own.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and a pointer to our timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

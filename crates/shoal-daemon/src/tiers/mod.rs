//! The tiers below this node's memory (docs/tiers.md): the storage engine
//! of `shoal-tiers` driven from the store thread.
//!
//! - Sealed objects are drained down the chain in the background, one
//!   bounded queue per tier (`drain.rs`): a backing store that is down
//!   stalls only its own queue.
//! - Eviction goes down a tier (`listener.rs`): a victim with a durable copy
//!   leaves memory at once; a dirty one is held while it is spilled
//!   (`spill.rs`), and stays in memory if no tier takes it.
//! - The burst buffer makes room by dropping copies the backing store also
//!   holds, oldest use first (`burst.rs`).
//! - A restore into memory is one call (`restoring.rs`; its types in `restore.rs`), one at a time per
//!   object, with memory from the operations (its `RestoreTarget`); seals
//!   wait here for the durability they ask.
//!
//! The node reaches the tiers only through its `Below` and `NodeListener`
//! traits; the operations call them directly.

pub(crate) mod adopted;
mod background;
mod burst;
mod config;
mod drain;
mod index;
mod listener;
pub mod restore;
mod restore_budget;
mod restoring;
mod spill;

use restore_budget::RestoreBudget;
pub use restore_budget::RestorePermit;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use shoal_core::durability::Durability;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::location::ObjectLocation;
use shoal_core::protocol::{TierInfo, TierReport};
use shoal_core::ObjectId;
use shoal_tiers::{
    Drainer, ObjectSizes, SourceRange, TierEngine, TierIdentity, TierLevel, TierSet, WriteClaim,
};
use tokio::sync::Notify;

pub use config::{Backing, TierConfig};

use crate::node::{Below, Node};
use crate::supervisor::Supervisor;
use index::{Index, Lane};

/// How long an object whose spill failed stays out of eviction before it
/// may be tried again.
const KEPT_RETRY: Duration = Duration::from_secs(5);
/// Drain rate window.
const RATE_WINDOW: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Counters {
    drained_objects: u64,
    drained_bytes: u64,
    spilled_bytes: u64,
    restores: u64,
    restored_bytes: u64,
    failures: u64,
    /// (when, bytes) of recent drains, for the rate.
    recent: VecDeque<(Instant, u64)>,
}

pub struct Tiers {
    engine: Arc<TierEngine>,
    /// The tiers as configured, and whose they are (for adoptions).
    config: TierConfig,
    owner: TierIdentity,
    /// The backing stores of the other nodes known here (the cluster file's
    /// and members learned since): what this node may adopt when one is
    /// removed for good (`adopted.rs`).
    adoptable: RefCell<std::collections::BTreeMap<u32, Backing>>,
    /// The engines of the backing stores this node adopted, by origin.
    adopted: RefCell<std::collections::BTreeMap<u32, Arc<TierEngine>>>,
    /// One queue per lane and tier, nearest tier first (`None`: no such
    /// tier).
    drainers: [[Option<Drainer>; 2]; 2],
    /// Where the drain runs (dropped after the drainers: declared after them).
    _background: background::Background,
    node: Rc<Node>,
    supervisor: Supervisor,
    default_durability: Durability,
    levels: TierSet,
    index: RefCell<Index>,
    /// Woken whenever an object's copies change or a write down fails.
    changed: Notify,
    /// Per lane and target tier, and their feeders' bells.
    backlog: [[Backlog; 2]; 2],
    bell: [[Notify; 2]; 2],
    restoring: RefCell<HashMap<ObjectId, restore::InFlight>>,
    /// What restores may run at once.
    restore_budget: RestoreBudget,
    counters: RefCell<Counters>,
    /// Objects a failed spill left in memory, with when to readmit them.
    kept: RefCell<VecDeque<(Instant, ObjectId)>>,
    /// Spills waiting for the spill task.
    spills: RefCell<Vec<shoal_store::store::Victim>>,
    relieving: Cell<bool>,
    /// Bytes of memory pinned by drain jobs (queued or running), per lane.
    pinned: [Cell<u64>; 2],
    /// Woken when drain jobs unpin memory.
    unpinned: Notify,
    /// When an object was last sealed here (write-behind yields to puts).
    last_seal: Cell<Instant>,
}

/// Ids waiting for a drain job, with when each was queued.
type Backlog = RefCell<VecDeque<(Instant, ObjectId)>>;

impl Tiers {
    /// Opens the tiers (recovering what a crash left), loads what they hold,
    /// and starts the drain. The node then evicts down the tiers.
    pub async fn start(
        config: &TierConfig,
        owner: &TierIdentity,
        adoptable: &[shoal_cluster::Node],
        node: Rc<Node>,
        supervisor: Supervisor,
    ) -> Result<Rc<Self>> {
        let started = Instant::now();
        let (engine, report) = config.open(owner).await?;
        let engine = Arc::new(engine);
        let mut index = Index::default();
        index.reserve(report.records.len());
        let mut named = Vec::new();
        for (id, record) in &report.records {
            index.recovered(*id, record);
            if let Some(name) = &record.name {
                let bound = crate::names::Bound {
                    id: *id,
                    data_size: record.sizes.data_size,
                    meta_size: record.sizes.meta_size,
                    mtime_ms: record.modified_ms,
                };
                named.push((name.clone(), bound, record.sealed_at_ms));
            }
        }
        // The loser of a name conflict is left unnamed (docs/posix.md).
        node.names().borrow_mut().recover(named);
        let mut levels = TierSet::EMPTY;
        let background = background::Background::start(config.drain_nice)?;
        for level in TierLevel::ALL {
            if engine.tier(level).is_some() {
                levels = levels.with(level);
            }
        }
        let mut events = Vec::new();
        let drainers = Lane::ALL.map(|lane| {
            TierLevel::ALL.map(|level| {
                engine.tier(level)?;
                let (drainer, worker, rx) =
                    Drainer::new(engine.clone(), drain_config(config, level));
                events.push((lane, rx));
                // Stopped with the daemon: jobs not finished then are found
                // again by the next start's recovery (or were memory only).
                let stop = supervisor.stopping();
                match lane {
                    // On the drain's runtime, at its lower priority.
                    Lane::Background => {
                        let mut worker = background.spawn(worker);
                        supervisor.spawn_local("drain", async move {
                            tokio::select! {
                                _ = &mut worker => {}
                                _ = stop => worker.abort(),
                            }
                        });
                    }
                    // On the store's runtime (its blocking pool): a client waits.
                    Lane::Urgent => supervisor.spawn("drain (urgent)", async move {
                        tokio::select! {
                            _ = worker => {}
                            _ = stop => {}
                        }
                    }),
                }
                Some(drainer)
            })
        });
        let tiers = Rc::new(Self {
            engine,
            config: config.clone(),
            owner: owner.clone(),
            adoptable: RefCell::default(),
            adopted: RefCell::default(),
            drainers,
            _background: background,
            node: node.clone(),
            supervisor: supervisor.clone(),
            default_durability: config.durability,
            levels,
            index: RefCell::new(index),
            changed: Notify::new(),
            backlog: Default::default(),
            bell: Default::default(),
            restoring: RefCell::default(),
            restore_budget: RestoreBudget::default(),
            counters: RefCell::default(),
            kept: RefCell::default(),
            spills: RefCell::default(),
            relieving: Cell::new(false),
            pinned: Default::default(),
            unpinned: Notify::new(),
            last_seal: Cell::new(Instant::now()),
        });
        for (lane, rx) in events {
            supervisor.spawn_local("drain events", tiers.clone().outcomes(lane, rx));
        }
        for lane in Lane::ALL {
            for level in TierLevel::ALL {
                if tiers.drainer(lane, level).is_some() {
                    supervisor.spawn_local("drain feeder", tiers.clone().feed(lane, level));
                }
            }
        }
        supervisor.spawn_local("readmit kept", tiers.clone().readmit_kept());
        // Recovered objects not yet in the backing store go on draining.
        for id in &report.to_drain {
            tiers.queue(*id, false);
        }
        for other in adoptable {
            tiers.learn_adoptable(other);
        }
        node.listen(Rc::new(listener::TierListener::new(Rc::downgrade(&tiers))));
        let below: Rc<dyn Below> = tiers.clone();
        node.set_below(Rc::downgrade(&below));
        tracing::info!(
            objects = report.records.len(),
            adopted = report.adopted.len(),
            dropped = report.dropped.len(),
            swept = report.swept,
            requeued = report.to_drain.len(),
            elapsed = ?started.elapsed(),
            "tiers open"
        );
        Ok(tiers)
    }

    fn drainer(&self, lane: Lane, level: TierLevel) -> Option<&Drainer> {
        self.drainers[lane as usize][level as usize].as_ref()
    }

    /// Bytes of memory drain jobs pin now: they come free as the jobs
    /// finish, so a create short of space waits for them.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned.iter().map(Cell::get).sum()
    }

    /// The durability a seal naming none gets.
    pub fn default_durability(&self) -> Durability {
        self.default_durability
    }

    /// Whether this node can give `level` at all.
    pub fn check_level(&self, level: Durability) -> Result<()> {
        check_level(Some(self), level)
    }

    /// Whether a tier holds `id` (or is restoring it).
    pub fn tracks(&self, id: &ObjectId) -> bool {
        self.index.borrow().get(id).is_some()
    }

    /// The tiers holding a copy of `id` (as `ObjectInfo::tiers` bits).
    pub fn tier_bits(&self, id: &ObjectId) -> u8 {
        self.index.borrow().get(id).map_or(0, |t| t.tiers().bits())
    }

    /// The sizes of an object held below.
    pub fn sizes(&self, id: &ObjectId) -> Option<ObjectSizes> {
        self.index.borrow().get(id).map(|t| t.sizes)
    }

    /// Whether `id` has a copy below already (evicting it writes nothing).
    fn is_clean(&self, id: &ObjectId) -> Option<bool> {
        self.index.borrow().get(id).map(|t| !t.tiers().is_empty())
    }

    /// Queues `id` for the drain of the nearest tier it lacks: in the
    /// urgent lane when `urgent` (a seal waits for it) or when its copies do
    /// not yet give the durability its seal asked for, else in the
    /// background lane.
    fn queue(&self, id: ObjectId, urgent: bool) {
        let (level, lane) = {
            let index = self.index.borrow();
            let Some(t) = index.get(&id) else { return };
            let Some(level) = self.next_level(t.tiers(), t.skip_burst) else {
                return;
            };
            let awaited = urgent || !t.tiers().meets(t.durability);
            (
                level,
                if awaited {
                    Lane::Urgent
                } else {
                    Lane::Background
                },
            )
        };
        self.backlog[lane as usize][level as usize]
            .borrow_mut()
            .push_back((Instant::now(), id));
        self.bell[lane as usize][level as usize].notify_one();
    }

    /// The nearest configured tier an object with copies on `tiers` lacks.
    fn next_level(&self, tiers: TierSet, skip_burst: bool) -> Option<TierLevel> {
        TierLevel::ALL.into_iter().find(|&level| {
            self.levels.contains(level)
                && !tiers.contains(level)
                && !(level == TierLevel::Burst
                    && (skip_burst || tiers.contains(TierLevel::Backing)))
        })
    }

    /// A seal asked for `level` (or the default): records it and queues the
    /// objects first in line when they must reach a tier.
    pub fn sealed_with(&self, ids: &[ObjectId], level: Durability) {
        {
            let mut index = self.index.borrow_mut();
            for id in ids {
                if let Some(t) = index.get_mut(id) {
                    t.durability = t.durability.max(level);
                }
            }
        }
        if level > Durability::Memory {
            for id in ids {
                self.queue(*id, true);
            }
        }
    }

    /// Waits until each id has a copy meeting `level`, or `deadline`. Per
    /// id: `None` when met; `Timeout`; `ObjectNotFound`; or the failure that
    /// keeps it from getting there (a full or broken tier).
    pub async fn wait_durable(
        &self,
        ids: &[ObjectId],
        level: Durability,
        deadline: Option<tokio::time::Instant>,
    ) -> Vec<Option<ShoalError>> {
        let mut out: Vec<Option<Option<ShoalError>>> = vec![None; ids.len()];
        if let Err(err) = self.check_level(level) {
            return vec![Some(err); ids.len()];
        }
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let mut waiting = 0;
            for (slot, id) in out.iter_mut().zip(ids) {
                if slot.is_some() {
                    continue;
                }
                *slot = self.durable_state(id, level);
                waiting += slot.is_none() as usize;
            }
            if waiting == 0 {
                break;
            }
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                for (slot, id) in out.iter_mut().zip(ids) {
                    if slot.is_none() {
                        *slot = Some(Some(ShoalError::new(
                            ErrorKind::Timeout,
                            format!("object {id} did not reach durability {level} in time"),
                        )));
                    }
                }
                break;
            }
            match deadline {
                Some(d) => {
                    tokio::select! {
                        _ = changed => {}
                        _ = tokio::time::sleep_until(d) => {}
                    }
                }
                None => changed.await,
            }
        }
        out.into_iter().map(|s| s.expect("decided")).collect()
    }

    /// `Some(None)`: `id` meets `level`; `Some(Some(err))`: it cannot;
    /// `None`: not yet.
    fn durable_state(&self, id: &ObjectId, level: Durability) -> Option<Option<ShoalError>> {
        let index = self.index.borrow();
        let Some(t) = index.get(id) else {
            // Not sealed yet (being written, or being restored): wait; a
            // network copy or an unknown id: nothing to wait for.
            let unsealed = self.node.read(|s| s.is_unsealed(id));
            return (!unsealed).then(|| Some(ShoalError::not_found(id)));
        };
        if t.tiers().meets(level) {
            return Some(None);
        }
        match &t.failure {
            Some(err)
                if !t.in_flight.iter().any(|f| *f)
                    && !shoal_tiers::retry::is_transient(err.kind()) =>
            {
                Some(Some(ShoalError::new(
                    err.kind(),
                    format!(
                        "object {id} cannot reach durability {level}: {}",
                        err.message()
                    ),
                )))
            }
            _ => None,
        }
    }

    /// Names changed (a rename) or were given a time (utimens): the
    /// records of objects already written down get the new names and
    /// times, so a restart finds them there.
    pub async fn names_changed(&self, ids: &[ObjectId]) -> Result<()> {
        for id in ids {
            if self
                .index
                .borrow()
                .get(id)
                .is_some_and(|t| !t.tiers().is_empty())
            {
                let (name, modified) = (self.node.name_of(id), self.node.mtime_of(id));
                self.engine_of(id).set_name(*id, name, modified).await?;
            }
        }
        Ok(())
    }

    /// The claim of a write down of `id`'s incarnation `generation`, taken
    /// while the index says it is alive (docs/tiers.md, "Deletes are
    /// final"); the index remembers it, so its delete goes to the engine.
    fn claim(&self, id: ObjectId, generation: u64) -> WriteClaim {
        if let Some(t) = self.index.borrow_mut().get_mut(&id) {
            t.claimed = true;
        }
        self.engine.claim(id, generation)
    }

    /// Whether this node's manifest holds no record of `id`, of any
    /// incarnation (a read, no commit); `false` when it cannot tell.
    async fn holds_no_record(&self, id: ObjectId) -> bool {
        matches!(self.engine.record(id).await, Ok(None))
    }

    /// Deletes `ids` from every tier; returns once the deletes are committed
    /// (no crash brings them back). Ids held by no tier are skipped, and so
    /// are objects no write down was ever claimed for whose id the manifest
    /// has no record of: nothing of them is on a tier or can get there
    /// (every write needs a claim, taken while the index tracks the object,
    /// which it no longer does), so there is no tombstone to commit. Per id
    /// of `ids`, `None` or why its delete was not committed (the object is
    /// then still held: served, and deleted by a retry).
    pub async fn delete(&self, ids: &[ObjectId]) -> Vec<Option<ShoalError>> {
        let mut out = vec![None; ids.len()];
        let held: Vec<(usize, index::Tracked)> = {
            let mut index = self.index.borrow_mut();
            ids.iter()
                .enumerate()
                .filter_map(|(i, id)| index.remove(id).map(|t| (i, t)))
                .collect()
        };
        if held.is_empty() {
            return out;
        }
        self.changed.notify_waiters();
        for drainer in self.drainers.iter().flatten().flatten() {
            for (i, _) in &held {
                drainer.cancel(ids[*i]);
            }
        }
        for (i, tracked) in held {
            let id = ids[i];
            if !tracked.claimed && self.holds_no_record(id).await {
                // Never written, and no earlier incarnation left a record
                // (a delete of one that failed, a copy forgotten after a
                // corrupt restore): memory held all of it, and that is gone.
                continue;
            }
            // Ends this incarnation's writes not yet done (a drain job
            // already running, a spill): they write nothing from here on.
            let engine = self.engine_for(tracked.origin);
            if let Err(err) = engine.delete(id, tracked.generation).await {
                tracing::warn!(%id, %err, "tier delete not committed; the object stays");
                self.index.borrow_mut().reinstate(id, tracked);
                // Its queued drain jobs were cancelled above: queued again.
                self.queue(id, false);
                out[i] = Some(err);
            }
        }
        out
    }

    /// A source range over an object in memory, for a write to a tier.
    ///
    /// # Safety
    /// The object's block must stay allocated and unwritten until the range
    /// is dropped: pinned by a reference, or held by its eviction.
    unsafe fn source(&self, location: ObjectLocation) -> SourceRange {
        let region = self.node.region().clone();
        SourceRange::new(
            region.base().add(location.offset as usize),
            location.size() as usize,
            region.clone(),
        )
    }

    /// The tiers, their use and the drain's progress (`shoal stat`).
    pub fn report(&self) -> TierReport {
        let mut counters = self.counters.borrow_mut();
        let now = Instant::now();
        while counters
            .recent
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > RATE_WINDOW)
        {
            counters.recent.pop_front();
        }
        let recent: u64 = counters.recent.iter().map(|(_, b)| b).sum();
        let index = self.index.borrow();
        TierReport {
            default_durability: self.default_durability,
            queue_depth: self
                .drainers
                .iter()
                .flatten()
                .flatten()
                .map(|d| d.depth() as u64)
                .sum::<u64>()
                + self
                    .backlog
                    .iter()
                    .flatten()
                    .map(|b| b.borrow().len() as u64)
                    .sum::<u64>(),
            drained_objects: counters.drained_objects,
            drained_bytes: counters.drained_bytes,
            drain_rate: (recent as f64 / RATE_WINDOW.as_secs_f64()) as u64,
            spilled_bytes: counters.spilled_bytes,
            restores: counters.restores,
            restored_bytes: counters.restored_bytes,
            durable_objects: index.durable(),
            failures: counters.failures,
            tiers: self
                .engine
                .usage()
                .into_iter()
                .map(|(level, usage)| TierInfo {
                    level: level as u8,
                    describe: self
                        .engine
                        .tier(level)
                        .map_or_else(String::new, |t| t.describe()),
                    capacity: usage.capacity,
                    used: usage.used,
                    objects: usage.objects,
                })
                .collect(),
        }
    }

    /// Readmits objects whose spill failed, once they waited `KEPT_RETRY`.
    async fn readmit_kept(self: Rc<Self>) {
        let mut ticker = tokio::time::interval(KEPT_RETRY / 5);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let due: Vec<ObjectId> = {
                let mut kept = self.kept.borrow_mut();
                let mut due = Vec::new();
                while kept
                    .front()
                    .is_some_and(|(at, _)| at.elapsed() >= KEPT_RETRY)
                {
                    due.push(kept.pop_front().expect("front").1);
                }
                due
            };
            if !due.is_empty() {
                self.node.mutate(|store| {
                    for id in &due {
                        store.readmit(id);
                    }
                });
            }
        }
    }
}

/// The queue of one tier's drain. Jobs that write from memory pin it while
/// queued; the feeder bounds the bytes pinned (`pin_room`), so the queue
/// holds two batches (group commits) and the backlog of ids in front of it
/// waits for free. Copies between tiers pin nothing and may queue more.
fn drain_config(config: &TierConfig, level: TierLevel) -> shoal_tiers::DrainConfig {
    let mut drain = config.drain;
    if level == TierLevel::Burst {
        drain.queue = drain.queue.min(2 * drain.batch.max(1));
    }
    drain
}

/// Whether a node with `tiers` can give durability `level`.
pub fn check_level(tiers: Option<&Tiers>, level: Durability) -> Result<()> {
    let levels = tiers.map_or(TierSet::EMPTY, |t| t.levels);
    if levels.meets(level) {
        return Ok(());
    }
    Err(ShoalError::invalid(match level {
        Durability::Backing => "durability backing needs a backing store on this node",
        _ => "durability local needs a tier below memory on this node (--burst or --backing)",
    }))
}

impl Below for Tiers {
    fn holds(&self, id: &ObjectId) -> bool {
        self.tracks(id)
    }

    fn held_only_below(&self) -> Vec<(ObjectId, ObjectLocation)> {
        let index = self.index.borrow();
        self.node.read(|store| {
            index
                .iter()
                .filter(|(id, _)| !store.contains(id))
                .map(|(id, t)| {
                    (
                        *id,
                        ObjectLocation {
                            offset: 0,
                            data_size: t.sizes.data_size,
                            meta_size: t.sizes.meta_size,
                        },
                    )
                })
                .collect()
        })
    }
}

//! `Drainer`: the write-behind queue. The daemon submits drain jobs (spill
//! an object from memory to a tier, or copy it one tier down); a background
//! task runs them in submission order, a batch at a time with bounded
//! parallelism, retries transient failures with backoff, and reports each
//! outcome on a channel.
//!
//! The queue is bounded: when the tiers cannot keep up (or the backing store
//! is down and its jobs keep retrying), `submit` waits and `try_submit` fails
//! with `StoreFull`, so pressure reaches the producers instead of memory
//! growing without bound. Objects whose jobs wait stay where they are (memory
//! or burst buffer): nothing is lost by waiting.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ObjectId;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::engine::{TierEngine, WriteClaim, WriteInfo, WriteItem};
use crate::format::ObjectSizes;
use crate::range::SourceRange;
use crate::record::{ObjectRecord, TierLevel};
use crate::retry::{is_transient, with_backoff, Backoff};

/// One unit of write-behind work.
#[derive(Debug)]
pub enum DrainJob {
    /// Write the object's bytes (still in memory) to `level`, as the
    /// incarnation `claim` names ([`TierEngine::claim`], taken when the job
    /// is made: a delete from then on makes the job write nothing).
    Write {
        /// The object and incarnation written.
        claim: WriteClaim,
        /// The tier written to.
        level: TierLevel,
        /// Data and metadata sizes; `src` is exactly their sum long.
        sizes: ObjectSizes,
        /// The payload in memory. The job keeps it (and so the daemon's pin,
        /// its keep-alive) until its outcome: a retry reads it again.
        src: SourceRange,
        /// What the record gets besides sizes and checksum.
        info: WriteInfo,
    },
    /// Copy the object from one tier to another (it is no longer in memory),
    /// if its record is still of incarnation `generation`.
    Copy {
        /// The object copied.
        id: ObjectId,
        /// The incarnation copied: a record of another one (deleted, or the
        /// id created again since) fails the job with `ObjectNotFound`,
        /// nothing written.
        generation: u64,
        /// The tier read (normally the burst buffer).
        from: TierLevel,
        /// The tier written (normally the backing store).
        to: TierLevel,
    },
}

impl DrainJob {
    /// The object the job writes.
    pub fn id(&self) -> ObjectId {
        match self {
            DrainJob::Write { claim, .. } => claim.id(),
            DrainJob::Copy { id, .. } => *id,
        }
    }

    /// The tier the job writes.
    pub fn target(&self) -> TierLevel {
        match self {
            DrainJob::Write { level, .. } => *level,
            DrainJob::Copy { to, .. } => *to,
        }
    }
}

/// The outcome of a job.
#[derive(Debug)]
pub struct DrainEvent {
    /// The number `submit` returned for the job.
    pub seq: u64,
    /// The object the job wrote, or tried to.
    pub id: ObjectId,
    /// The tier the job wrote, or tried to (`DrainJob::target`).
    pub target: TierLevel,
    /// The record after the job, or why it failed for good (a cancelled job
    /// fails with `ObjectNotFound`).
    pub result: Result<ObjectRecord>,
    /// Attempts made, the first included: more than 1 when transient
    /// failures were retried.
    pub attempts: u32,
}

/// A job `try_submit` could not queue, with the reason.
#[derive(Debug)]
pub struct Refused {
    /// `StoreFull` if the queue was full, `Disconnected` if the drainer has
    /// stopped.
    pub error: ShoalError,
    /// The job, not queued: its object stays where it is until the caller
    /// submits it again.
    pub job: DrainJob,
}

/// Sizes of the queue and of the batches.
#[derive(Debug, Clone, Copy)]
pub struct DrainConfig {
    /// Jobs queued (not yet started) at most.
    pub queue: usize,
    /// Jobs taken off the queue at once.
    pub batch: usize,
    /// Jobs of a batch running at once.
    pub parallel: usize,
    /// Retries of a job's transient failures.
    pub backoff: Backoff,
}

impl Default for DrainConfig {
    fn default() -> Self {
        Self {
            queue: 1024,
            batch: 128,
            parallel: 4,
            backoff: Backoff::default(),
        }
    }
}

struct Queued {
    seq: u64,
    job: DrainJob,
}

/// Cancellations: id → the sequence number at the cancel. Jobs of that id
/// submitted before it are skipped.
type Cancels = Arc<Mutex<HashMap<ObjectId, u64>>>;

/// The write-behind queue and its worker task.
pub struct Drainer {
    tx: mpsc::Sender<Queued>,
    seq: AtomicU64,
    cancels: Cancels,
    pending: Arc<AtomicUsize>,
    /// `None` when the caller runs the worker itself ([`Drainer::new`]).
    worker: Option<JoinHandle<()>>,
}

impl Drainer {
    /// Starts the worker on the current tokio runtime. Events arrive on the
    /// returned receiver (bounded like the queue: read it, or the worker
    /// waits).
    pub fn start(
        engine: Arc<TierEngine>,
        config: DrainConfig,
    ) -> (Self, mpsc::Receiver<DrainEvent>) {
        let (mut drainer, worker, events) = Self::new(engine, config);
        drainer.worker = Some(tokio::spawn(worker));
        (drainer, events)
    }

    /// As [`start`](Self::start), but hands the worker to the caller to run
    /// (under the daemon's supervisor, which cancels it at shutdown: jobs
    /// not finished then are found again by recovery at the next start).
    pub fn new(
        engine: Arc<TierEngine>,
        config: DrainConfig,
    ) -> (
        Self,
        impl std::future::Future<Output = ()> + Send + 'static,
        mpsc::Receiver<DrainEvent>,
    ) {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let (events_tx, events) = mpsc::channel(config.queue.max(1));
        let cancels: Cancels = Arc::default();
        let pending = Arc::new(AtomicUsize::new(0));
        let worker = run(
            engine,
            config,
            rx,
            events_tx,
            cancels.clone(),
            pending.clone(),
        );
        (
            Self {
                tx,
                seq: AtomicU64::new(1),
                cancels,
                pending,
                worker: None,
            },
            worker,
            events,
        )
    }

    fn queued(&self, job: DrainJob) -> Queued {
        self.pending.fetch_add(1, Ordering::AcqRel);
        Queued {
            seq: self.seq.fetch_add(1, Ordering::AcqRel),
            job,
        }
    }

    /// Queues `job`, waiting while the queue is full. Returns its number
    /// (its event carries it).
    pub async fn submit(&self, job: DrainJob) -> Result<u64> {
        let queued = self.queued(job);
        let seq = queued.seq;
        self.tx.send(queued).await.map_err(|_| {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            ShoalError::new(ErrorKind::Disconnected, "the drainer has stopped")
        })?;
        Ok(seq)
    }

    /// Queues `job` if there is room and returns its number; otherwise gives
    /// it back with `StoreFull` (the caller keeps the object where it is and
    /// tries later).
    pub fn try_submit(&self, job: DrainJob) -> std::result::Result<u64, Box<Refused>> {
        let queued = self.queued(job);
        let seq = queued.seq;
        self.tx.try_send(queued).map(|()| seq).map_err(|err| {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            let (error, queued) = match err {
                mpsc::error::TrySendError::Full(q) => (
                    ShoalError::new(ErrorKind::StoreFull, "the drain queue is full"),
                    q,
                ),
                mpsc::error::TrySendError::Closed(q) => (
                    ShoalError::new(ErrorKind::Disconnected, "the drainer has stopped"),
                    q,
                ),
            };
            Box::new(Refused {
                error,
                job: queued.job,
            })
        })
    }

    /// Drops the queued jobs of `id` (an object being deleted): saves their
    /// work. A job already running finishes first, and writes nothing once
    /// the engine's delete ended its claim.
    pub fn cancel(&self, id: ObjectId) {
        let seq = self.seq.load(Ordering::Acquire);
        self.cancels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, seq);
    }

    /// The number the next submitted job gets. Exact when one task submits:
    /// it can record the job before submitting, because its outcome may
    /// arrive before `submit` returns to it.
    pub fn next_seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// Jobs submitted and not yet finished (queued or running).
    pub fn depth(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Stops taking jobs, finishes the queued ones, and waits for the worker.
    pub async fn close(self) {
        drop(self.tx);
        if let Some(worker) = self.worker {
            let _ = worker.await;
        }
    }
}

async fn run(
    engine: Arc<TierEngine>,
    config: DrainConfig,
    mut rx: mpsc::Receiver<Queued>,
    events: mpsc::Sender<DrainEvent>,
    cancels: Cancels,
    pending: Arc<AtomicUsize>,
) {
    let mut batch = Vec::with_capacity(config.batch.max(1));
    loop {
        if rx.recv_many(&mut batch, config.batch.max(1)).await == 0 {
            return; // closed and empty
        }
        // In submission order, chunk by chunk: a run of writes from memory to
        // one tier goes down as one group commit; other jobs (copies,
        // cancelled writes) run a few at a time. A chunk starts when the one
        // before it is done, so a copy never overtakes the write it copies.
        let (engine, cancels) = (&engine, &cancels);
        let finish: Finish<'_> = (&*pending, &events);
        let mut jobs = batch.drain(..).peekable();
        while let Some(first) = jobs.next() {
            let group_of = |queued: &Queued| match &queued.job {
                DrainJob::Write { level, .. }
                    if !cancelled(cancels, queued.job.id(), queued.seq) =>
                {
                    Some(*level)
                }
                _ => None,
            };
            let level = group_of(&first);
            let mut chunk = vec![first];
            while let Some(next) = jobs.next_if(|next| group_of(next) == level) {
                chunk.push(next);
            }
            if level.is_some() {
                write_group(engine, config, chunk, cancels, finish).await;
            } else {
                let singles: Vec<_> = chunk
                    .into_iter()
                    .map(|queued| {
                        run_and_report(engine, config.backoff, queued, cancels, finish, 0)
                    })
                    .collect();
                at_most(config.parallel, singles).await;
            }
        }
        // With nothing queued, every job a cancellation was aimed at is done.
        if rx.is_empty() {
            cancels.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }
}

/// Where a finished job's outcome goes: the count of jobs pending, and the
/// events channel.
type Finish<'a> = (&'a AtomicUsize, &'a mpsc::Sender<DrainEvent>);

async fn report(finish: Finish<'_>, event: DrainEvent) {
    finish.0.fetch_sub(1, Ordering::AcqRel);
    let _ = finish.1.send(event).await;
}

/// Writes a group of `Write` jobs to one tier as one batch and reports the
/// outcome of each; jobs that failed with a transient error are retried one
/// by one, with backoff.
async fn write_group(
    engine: &TierEngine,
    config: DrainConfig,
    group: Vec<Queued>,
    cancels: &Cancels,
    finish: Finish<'_>,
) {
    let level = group[0].job.target();
    let items = group
        .iter()
        .map(|queued| match &queued.job {
            DrainJob::Write {
                claim,
                sizes,
                src,
                info,
                ..
            } => WriteItem {
                claim: claim.clone(),
                sizes: *sizes,
                src: src.clone(),
                info: info.clone(),
            },
            DrainJob::Copy { .. } => unreachable!("groups hold writes only"),
        })
        .collect();
    let results = engine.write_batch(level, items).await;
    let mut retry = Vec::new();
    for (queued, result) in group.into_iter().zip(results) {
        match result {
            Err(err) if is_transient(err.kind()) => retry.push(queued),
            result => {
                report(
                    finish,
                    DrainEvent {
                        seq: queued.seq,
                        id: queued.job.id(),
                        target: level,
                        result,
                        attempts: 1,
                    },
                )
                .await
            }
        }
    }
    let retries: Vec<_> = retry
        .into_iter()
        .map(|queued| run_and_report(engine, config.backoff, queued, cancels, finish, 1))
        .collect();
    at_most(config.parallel, retries).await;
}

/// Runs `futures`, at most `limit` at once. Why not `for_each_concurrent`:
/// the worker must be `Send`, and rustc cannot prove that of a closure that
/// returns borrowing futures held across an await (rust-lang/rust#102211);
/// futures made beforehand carry no closure.
async fn at_most<F: std::future::Future<Output = ()>>(limit: usize, futures: Vec<F>) {
    let mut running = futures_util::stream::FuturesUnordered::new();
    for future in futures {
        if running.len() >= limit.max(1) {
            running.next().await;
        }
        running.push(future);
    }
    while running.next().await.is_some() {}
}

/// Runs one job (after `attempts_before` failed attempts) and reports it.
async fn run_and_report(
    engine: &TierEngine,
    backoff: Backoff,
    queued: Queued,
    cancels: &Cancels,
    finish: Finish<'_>,
    attempts_before: u32,
) {
    let mut event = run_job(engine, backoff, queued, cancels).await;
    event.attempts += attempts_before;
    report(finish, event).await;
}

fn cancelled(cancels: &Cancels, id: ObjectId, seq: u64) -> bool {
    cancels
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id)
        .is_some_and(|&at| seq < at)
}

async fn run_job(
    engine: &TierEngine,
    backoff: Backoff,
    queued: Queued,
    cancels: &Cancels,
) -> DrainEvent {
    let Queued { seq, job } = queued;
    let (id, target) = (job.id(), job.target());
    let mut attempts = 0;
    let result = with_backoff(backoff, || {
        attempts += 1;
        let job = &job;
        async move {
            if cancelled(cancels, id, seq) {
                return Err(ShoalError::new(
                    ErrorKind::ObjectNotFound,
                    format!("drain of {id} cancelled (object deleted)"),
                ));
            }
            match job {
                DrainJob::Write {
                    claim,
                    level,
                    sizes,
                    src,
                    info,
                } => {
                    engine
                        .write(claim.clone(), *level, *sizes, src.clone(), info.clone())
                        .await
                }
                DrainJob::Copy {
                    id,
                    generation,
                    from,
                    to,
                } => engine.copy(*id, *generation, *from, *to).await,
            }
        }
    })
    .await;
    DrainEvent {
        seq,
        id,
        target,
        result,
        attempts,
    }
}

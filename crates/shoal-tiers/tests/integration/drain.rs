//! The write-behind `Drainer` over real directory tiers behind `FaultyTier`s:
//! order, retries through an outage, back-pressure, cancellation, and
//! failures that are not retried.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{payload, sizes_of};
use shoal_core::error::ErrorKind;
use shoal_core::ids::ObjectId;
use shoal_tiers::{
    Backoff, DirTier, DrainConfig, DrainEvent, DrainJob, Drainer, Durability, EngineConfig,
    FaultyTier, Manifest, SourceRange, Tier, TierEngine, TierIdentity, TierLevel, TierSet,
    WriteInfo,
};
use tokio::sync::mpsc;

struct Setup {
    _dir: tempfile::TempDir,
    burst: Arc<FaultyTier>,
    backing: Arc<FaultyTier>,
    engine: Arc<TierEngine>,
}

async fn setup(burst_capacity: u64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let me = TierIdentity::new("drain", 0);
    let burst = Arc::new(FaultyTier::new(Arc::new(
        DirTier::open(&dir.path().join("burst"), &me, burst_capacity).unwrap(),
    )));
    let backing = Arc::new(FaultyTier::new(Arc::new(
        DirTier::open(&dir.path().join("backing"), &me, 1 << 30).unwrap(),
    )));
    let manifest = Manifest::open(&dir.path().join("manifest.redb"), &me).unwrap();
    let (engine, _) = TierEngine::open(EngineConfig {
        manifest,
        burst: Some(burst.clone()),
        backing: Some(backing.clone()),
        shared_backing: false,
    })
    .await
    .unwrap();
    Setup {
        _dir: dir,
        burst,
        backing,
        engine: Arc::new(engine),
    }
}

/// The generation every object of these tests is (each id is one object).
const GEN: u64 = 1;

fn write_job(engine: &TierEngine, id: ObjectId, level: TierLevel, seed: u64) -> DrainJob {
    let bytes = payload(10_000, seed);
    DrainJob::Write {
        claim: engine.claim(id, GEN),
        level,
        sizes: sizes_of(bytes.len(), 0),
        src: SourceRange::from_vec(bytes),
        info: WriteInfo {
            durability: Durability::Local,
            ..WriteInfo::default()
        },
    }
}

fn fast() -> Backoff {
    Backoff {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(50),
        ..Backoff::default()
    }
}

async fn next(events: &mut mpsc::Receiver<DrainEvent>) -> DrainEvent {
    tokio::time::timeout(Duration::from_secs(20), events.recv())
        .await
        .expect("an event in time")
        .expect("the drainer runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_in_order_and_reports_each_job() {
    let s = setup(1 << 30).await;
    let config = DrainConfig {
        parallel: 1,
        backoff: fast(),
        ..DrainConfig::default()
    };
    let (drainer, mut events) = Drainer::start(s.engine.clone(), config);
    let ids: Vec<ObjectId> = (0..10).map(|_| ObjectId::random()).collect();
    for (i, id) in ids.iter().enumerate() {
        drainer
            .submit(write_job(&s.engine, *id, TierLevel::Burst, i as u64))
            .await
            .unwrap();
    }
    for id in &ids {
        drainer
            .submit(DrainJob::Copy {
                id: *id,
                generation: GEN,
                from: TierLevel::Burst,
                to: TierLevel::Backing,
            })
            .await
            .unwrap();
    }
    let mut order = Vec::new();
    for _ in 0..20 {
        let event = next(&mut events).await;
        assert_eq!(event.attempts, 1);
        let record = event.result.unwrap();
        assert!(record.tiers.contains(event.target));
        order.push((event.id, event.target));
    }
    let expected: Vec<_> = ids
        .iter()
        .map(|id| (*id, TierLevel::Burst))
        .chain(ids.iter().map(|id| (*id, TierLevel::Backing)))
        .collect();
    assert_eq!(order, expected, "one at a time: submission order");
    assert_eq!(drainer.depth(), 0);
    for id in &ids {
        let tiers = s.engine.record(*id).await.unwrap().unwrap().tiers;
        assert_eq!(
            tiers,
            TierSet::of(TierLevel::Burst).with(TierLevel::Backing)
        );
    }
    drainer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_backs_pressure_up_to_producers_and_resumes() {
    let s = setup(1 << 30).await;
    let config = DrainConfig {
        queue: 2,
        batch: 1,
        parallel: 1,
        backoff: fast(),
    };
    let (drainer, mut events) = Drainer::start(s.engine.clone(), config);
    s.backing.set_unreachable(true);
    let ids: Vec<ObjectId> = (0..3).map(|_| ObjectId::random()).collect();
    // One job running (retrying), two queued: the queue is full.
    for (i, id) in ids.iter().enumerate() {
        drainer
            .submit(write_job(&s.engine, *id, TierLevel::Backing, i as u64))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = drainer.try_submit(write_job(
        &s.engine,
        ObjectId::random(),
        TierLevel::Backing,
        9,
    ));
    let err = refused.unwrap_err().error;
    assert_eq!(err.kind(), ErrorKind::StoreFull, "{err}");
    assert_eq!(drainer.depth(), 3);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        events.try_recv().is_err(),
        "nothing finishes during the outage"
    );
    assert!(s.backing.injected() > 3, "the running job kept retrying");

    s.backing.set_unreachable(false);
    for (i, id) in ids.iter().enumerate() {
        let event = next(&mut events).await;
        assert_eq!(event.id, *id);
        // Only the job that was running during the outage needed retries.
        assert_eq!(event.attempts > 1, i == 0, "{event:?}");
        event.result.unwrap();
    }
    assert_eq!(drainer.depth(), 0);
    drainer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_jobs_are_skipped_and_hard_failures_not_retried() {
    let s = setup(15_000).await;
    let config = DrainConfig {
        batch: 1,
        parallel: 1,
        backoff: fast(),
        ..DrainConfig::default()
    };
    let (drainer, mut events) = Drainer::start(s.engine.clone(), config);
    s.burst.set_unreachable(true);
    let (first, doomed, big) = (ObjectId::random(), ObjectId::random(), ObjectId::random());
    drainer
        .submit(write_job(&s.engine, first, TierLevel::Burst, 1))
        .await
        .unwrap();
    drainer
        .submit(write_job(&s.engine, doomed, TierLevel::Burst, 2))
        .await
        .unwrap();
    drainer.cancel(doomed);
    // After the cancel: a job of the same id submitted now still runs.
    drainer
        .submit(write_job(&s.engine, big, TierLevel::Burst, 3))
        .await
        .unwrap();
    s.burst.set_unreachable(false);

    let event = next(&mut events).await;
    assert_eq!(event.id, first);
    event.result.unwrap();
    let event = next(&mut events).await;
    assert_eq!(event.id, doomed);
    assert_eq!(event.result.unwrap_err().kind(), ErrorKind::ObjectNotFound);
    assert_eq!(s.engine.record(doomed).await.unwrap(), None);
    // The burst buffer holds 15 000 bytes: the third object does not fit, and
    // StoreFull is reported after one attempt, not retried.
    let event = next(&mut events).await;
    assert_eq!(event.id, big);
    assert_eq!(event.result.unwrap_err().kind(), ErrorKind::StoreFull);
    assert_eq!(event.attempts, 1);
    drainer.close().await;
}

/// A job retrying through an outage when its object is deleted (the job is
/// running, so no cancel reaches it): the delete is acknowledged during the
/// outage, and the retry after it must write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_retrying_when_its_object_is_deleted_writes_nothing_after() {
    let s = setup(1 << 30).await;
    let config = DrainConfig {
        batch: 1,
        parallel: 1,
        backoff: fast(),
        ..DrainConfig::default()
    };
    let (drainer, mut events) = Drainer::start(s.engine.clone(), config);
    s.burst.set_unreachable(true);
    let id = ObjectId::random();
    drainer
        .submit(write_job(&s.engine, id, TierLevel::Burst, 1))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.burst.injected() < 2 {
        assert!(std::time::Instant::now() < deadline, "the job did not run");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Final even with the burst buffer down (its tombstone stays).
    s.engine.delete(id, GEN).await.unwrap();
    s.burst.set_unreachable(false);
    let event = next(&mut events).await;
    assert_eq!(event.id, id);
    assert!(event.attempts > 1, "{event:?}");
    assert_eq!(
        event.result.unwrap_err().kind(),
        ErrorKind::ObjectNotFound,
        "the retry after the delete wrote nothing"
    );
    assert_eq!(s.engine.record(id).await.unwrap(), None);
    assert_eq!(s.engine.finish_deletes().await.unwrap(), 1);
    assert!(s.burst.list().await.unwrap().is_empty());
    drainer.close().await;
}

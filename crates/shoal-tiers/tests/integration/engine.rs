//! The engine over two real directory tiers wrapped in `FaultyTier`s:
//! the write order, injected faults, corrupt copies, deletes, and recovery
//! from a crash after each step (simulated by dropping the engine where the
//! step left the disk, then reopening).

use std::path::PathBuf;
use std::sync::Arc;

use crate::common::{payload, sizes_of, Damage};
use shoal_core::error::ErrorKind;
use shoal_core::ids::ObjectId;
use shoal_tiers::manifest::Change;
use shoal_tiers::{
    DestRange, DirTier, Durability, EngineConfig, FaultTiming, FaultyTier, Held, Manifest,
    RecoveryReport, SourceRange, Tier, TierEngine, TierIdentity, TierLevel, TierSet, Tombstoned,
    WriteClaim, WriteInfo, WriteItem,
};
use tempfile::TempDir;

struct Node {
    /// The generation each id is written as (its record's after a restart).
    generations: std::sync::Mutex<std::collections::HashMap<ObjectId, u64>>,
    dir: TempDir,
    burst: Arc<FaultyTier>,
    backing: Arc<FaultyTier>,
    burst_dir: DirTier,
    backing_dir: DirTier,
    engine: TierEngine,
}

const CAPACITY: u64 = 1 << 30;

impl Node {
    async fn new() -> (Self, RecoveryReport) {
        Self::open(tempfile::tempdir().unwrap(), CAPACITY).await
    }

    async fn open(dir: TempDir, burst_capacity: u64) -> (Self, RecoveryReport) {
        Self::open_with(dir, burst_capacity, false).await
    }

    /// A node whose backing store is shared with nodes that may adopt it.
    async fn new_shared() -> (Self, RecoveryReport) {
        Self::open_with(tempfile::tempdir().unwrap(), CAPACITY, true).await
    }

    async fn open_with(dir: TempDir, burst_capacity: u64, shared: bool) -> (Self, RecoveryReport) {
        let me = TierIdentity::new("test", 7);
        let burst_dir = DirTier::open(&dir.path().join("burst"), &me, burst_capacity).unwrap();
        let backing_dir = DirTier::open(&dir.path().join("backing"), &me, CAPACITY).unwrap();
        let burst = Arc::new(FaultyTier::new(Arc::new(burst_dir.clone())));
        let backing = Arc::new(FaultyTier::new(Arc::new(backing_dir.clone())));
        let manifest = Manifest::open(&dir.path().join("burst/manifest.redb"), &me).unwrap();
        let (engine, report) = TierEngine::open(EngineConfig {
            manifest,
            burst: Some(burst.clone()),
            backing: Some(backing.clone()),
            shared_backing: shared,
        })
        .await
        .unwrap();
        (
            Self {
                generations: Default::default(),
                dir,
                burst,
                backing,
                burst_dir,
                backing_dir,
                engine,
            },
            report,
        )
    }

    /// A restart after a crash: everything in memory is gone, the disk stays.
    async fn restart(self) -> (Self, RecoveryReport) {
        let dir = self.dir;
        drop(self.engine);
        Self::open(dir, CAPACITY).await
    }

    /// The generation of `id`: its record's, or a new one for a new object.
    async fn generation(&self, id: ObjectId) -> u64 {
        if let Some(g) = self.generations.lock().unwrap().get(&id) {
            return *g;
        }
        let g = match self.engine.record(id).await.unwrap() {
            Some(record) => record.generation,
            None => self.engine.next_generation(),
        };
        *self.generations.lock().unwrap().entry(id).or_insert(g)
    }

    async fn claim(&self, id: ObjectId) -> WriteClaim {
        self.engine.claim(id, self.generation(id).await)
    }

    async fn write(
        &self,
        id: ObjectId,
        level: TierLevel,
        bytes: &[u8],
    ) -> shoal_core::error::Result<()> {
        self.write_as(self.claim(id).await, level, bytes).await
    }

    /// A write claimed beforehand (when a drain job was made).
    async fn write_as(
        &self,
        claim: WriteClaim,
        level: TierLevel,
        bytes: &[u8],
    ) -> shoal_core::error::Result<()> {
        self.engine
            .write(
                claim,
                level,
                sizes_of(bytes.len(), 0),
                SourceRange::from_vec(bytes.to_vec()),
                WriteInfo {
                    durability: Durability::Local,
                    ..WriteInfo::default()
                },
            )
            .await
            .map(drop)
    }

    async fn copy(
        &self,
        id: ObjectId,
        from: TierLevel,
        to: TierLevel,
    ) -> shoal_core::error::Result<shoal_tiers::ObjectRecord> {
        self.engine
            .copy(id, self.generation(id).await, from, to)
            .await
    }

    /// Deletes the incarnation of `id` written so far; the next write of
    /// `id` is a new one.
    async fn delete(&self, id: ObjectId) -> shoal_core::error::Result<bool> {
        let generation = self.generation(id).await;
        self.generations.lock().unwrap().remove(&id);
        self.engine.delete(id, generation).await
    }

    async fn restore(
        &self,
        id: ObjectId,
        len: usize,
    ) -> shoal_core::error::Result<(TierLevel, Vec<u8>)> {
        let (dst, buffer) = DestRange::buffer(len);
        let restored = self.engine.restore(id, dst).await?;
        Ok((restored.from, buffer.take().unwrap()))
    }

    async fn tiers_of(&self, id: ObjectId) -> Option<TierSet> {
        self.engine.record(id).await.unwrap().map(|r| r.tiers)
    }

    fn dir(&self, level: TierLevel) -> &DirTier {
        match level {
            TierLevel::Burst => &self.burst_dir,
            TierLevel::Backing => &self.backing_dir,
        }
    }

    /// Whether `level` holds an image of `id`.
    fn has(&self, level: TierLevel, id: ObjectId) -> bool {
        self.dir(level).image_location(&id).is_some()
    }

    /// The path a file image of `id` would have (for planting strays).
    fn file_path(&self, level: TierLevel, id: ObjectId) -> PathBuf {
        let hex = id.to_hex();
        self.dir(level)
            .root()
            .join("objects")
            .join(&hex[..2])
            .join(hex)
    }

    fn damage(&self, level: TierLevel, id: ObjectId, damage: Damage) {
        crate::common::damage_dir_image(self.dir(level), &id, damage);
    }
}

fn both() -> TierSet {
    TierSet::of(TierLevel::Burst).with(TierLevel::Backing)
}

#[tokio::test]
async fn objects_move_down_the_chain_and_come_back() {
    let (node, report) = Node::new().await;
    assert_eq!(report, RecoveryReport::default());
    let id = ObjectId::random();
    let bytes = payload(100_000, 1);
    node.write(id, TierLevel::Burst, &bytes).await.unwrap();
    let record = node.engine.record(id).await.unwrap().unwrap();
    assert_eq!(record.tiers, TierSet::of(TierLevel::Burst));
    assert_eq!(record.durability, Durability::Local);
    assert_eq!(record.checksum, crc32c::crc32c(&bytes));

    // Drain without the object in memory, then evict the burst copy.
    let record = node
        .copy(id, TierLevel::Burst, TierLevel::Backing)
        .await
        .unwrap();
    assert_eq!(record.tiers, both());
    assert_eq!(
        node.restore(id, bytes.len()).await.unwrap(),
        (TierLevel::Burst, bytes.clone())
    );
    node.engine.evict(id, TierLevel::Burst).await.unwrap();
    assert!(!node.has(TierLevel::Burst, id));
    assert_eq!(
        node.restore(id, bytes.len()).await.unwrap(),
        (TierLevel::Backing, bytes.clone())
    );
    let err = node.engine.evict(id, TierLevel::Backing).await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::ObjectInUse,
        "the last copy is never evicted: {err}"
    );

    let (node, report) = node.restart().await;
    assert_eq!(report.objects, 1);
    assert!(report.adopted.is_empty() && report.to_drain.is_empty());
    assert_eq!(node.restore(id, bytes.len()).await.unwrap().1, bytes);
    // Sizes are counted in the background after a restart.
    node.burst_dir.wait_counted();
    node.backing_dir.wait_counted();
    let usage = node.engine.usage();
    assert_eq!(usage[0].1.used, 0);
    assert_eq!(usage[1].1.objects, 1);
}

#[tokio::test]
async fn an_injected_error_leaves_the_object_where_it_was() {
    let (node, _) = Node::new().await;
    let id = ObjectId::random();
    let bytes = payload(20_000, 2);

    // The put fails before touching the disk: nothing recorded, nothing stored.
    node.burst.fail_nth(1, FaultTiming::Before);
    let err = node.write(id, TierLevel::Burst, &bytes).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert_eq!(node.tiers_of(id).await, None);
    assert!(node.burst.list().await.unwrap().is_empty());

    // In the burst buffer; the drain to the backing store fails.
    node.write(id, TierLevel::Burst, &bytes).await.unwrap();
    node.backing.fail_nth(1, FaultTiming::Before);
    node.copy(id, TierLevel::Burst, TierLevel::Backing)
        .await
        .unwrap_err();
    assert_eq!(node.tiers_of(id).await, Some(TierSet::of(TierLevel::Burst)));
    assert_eq!(node.restore(id, bytes.len()).await.unwrap().1, bytes);

    // A read error on the burst copy: the backing copy serves, the burst copy stays.
    node.copy(id, TierLevel::Burst, TierLevel::Backing)
        .await
        .unwrap();
    node.burst.fail_nth(1, FaultTiming::Before);
    assert_eq!(
        node.restore(id, bytes.len()).await.unwrap(),
        (TierLevel::Backing, bytes.clone())
    );
    assert_eq!(node.tiers_of(id).await, Some(both()));

    // Evict whose unlink fails: the manifest already forgot the copy; the file
    // is a stray that the next start adopts again (it verifies).
    node.burst.fail_nth(1, FaultTiming::Before);
    node.engine.evict(id, TierLevel::Burst).await.unwrap_err();
    assert_eq!(
        node.tiers_of(id).await,
        Some(TierSet::of(TierLevel::Backing))
    );
    assert!(node.has(TierLevel::Burst, id));
    let (node, report) = node.restart().await;
    assert_eq!(report.adopted, vec![id]);
    assert_eq!(node.tiers_of(id).await, Some(both()));
    assert!(node.burst.injected() == 0 && node.backing.injected() == 0);
}

#[tokio::test]
async fn unreachable_tier_fails_fast_and_resumes() {
    let (node, _) = Node::new().await;
    let id = ObjectId::random();
    let bytes = payload(1000, 3);
    node.write(id, TierLevel::Burst, &bytes).await.unwrap();
    node.backing.set_unreachable(true);
    for _ in 0..3 {
        let err = node
            .copy(id, TierLevel::Burst, TierLevel::Backing)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodeUnavailable, "{err}");
    }
    assert_eq!(node.tiers_of(id).await, Some(TierSet::of(TierLevel::Burst)));
    node.backing.set_unreachable(false);
    node.copy(id, TierLevel::Burst, TierLevel::Backing)
        .await
        .unwrap();
    assert_eq!(node.tiers_of(id).await, Some(both()));
}

#[tokio::test]
async fn a_full_burst_buffer_is_a_typed_error_and_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = Node::open(dir, 50_000).await;
    node.write(ObjectId::random(), TierLevel::Burst, &payload(30_000, 1))
        .await
        .unwrap();
    let id = ObjectId::random();
    let err = node
        .write(id, TierLevel::Burst, &payload(30_000, 2))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreFull, "{err}");
    assert_eq!(node.tiers_of(id).await, None);
    // The next tier down still takes it.
    node.write(id, TierLevel::Backing, &payload(30_000, 2))
        .await
        .unwrap();
}

#[tokio::test]
async fn corrupt_copies_are_detected_skipped_and_removed() {
    let (node, _) = Node::new().await;
    let cases = [
        Damage::FlipBit(64 * 8 + 77),
        Damage::Truncate(5000),
        Damage::FlipBit(13 * 8),
    ];
    for damage in cases {
        let id = ObjectId::random();
        let bytes = payload(10_000, 4);
        node.write(id, TierLevel::Burst, &bytes).await.unwrap();
        node.copy(id, TierLevel::Burst, TierLevel::Backing)
            .await
            .unwrap();

        node.damage(TierLevel::Burst, id, damage);
        let (dst, buffer) = DestRange::buffer(bytes.len());
        let restored = node.engine.restore(id, dst).await.unwrap();
        assert_eq!(restored.from, TierLevel::Backing, "{damage:?}");
        assert_eq!(restored.corrupt, vec![TierLevel::Burst]);
        assert_eq!(restored.record.tiers, TierSet::of(TierLevel::Backing));
        assert_eq!(buffer.take().unwrap(), bytes, "never the torn bytes");
        assert!(!node.has(TierLevel::Burst, id), "the corrupt file is gone");

        // Now the only copy is damaged: a clear ObjectCorrupt, then gone.
        node.damage(TierLevel::Backing, id, damage);
        let err = node.restore(id, bytes.len()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectCorrupt, "{damage:?}: {err}");
        assert!(err.message().contains(&id.to_hex()), "{err}");
        assert_eq!(node.tiers_of(id).await, None);
    }
}

/// A copy down the tiers checks the source's bytes against the record, in
/// release builds too, as a restore does: an image that verifies but holds
/// other bytes is removed, never copied and recorded as the object.
#[tokio::test]
async fn a_copy_refuses_a_source_image_of_other_bytes() {
    let (node, _) = Node::new().await;
    for len in [10_000, 2 << 20] {
        let id = ObjectId::random();
        let bytes = payload(len, 30);
        node.write(id, TierLevel::Burst, &bytes).await.unwrap();
        // Other bytes of the same sizes under the id: an intact image.
        let other = payload(len, 31);
        crate::common::write(&node.burst_dir, id, &other, 0)
            .await
            .unwrap();
        let err = node
            .copy(id, TierLevel::Burst, TierLevel::Backing)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectCorrupt, "{len}: {err}");
        assert!(err.message().contains(&id.to_hex()), "{err}");
        assert!(!node.has(TierLevel::Backing, id), "{len}: nothing copied");
        assert!(
            !node.has(TierLevel::Burst, id),
            "{len}: the bad copy is gone"
        );
        assert_eq!(node.tiers_of(id).await, None, "{len}: no copy was left");
    }
    let (_, report) = node.restart().await;
    assert!(
        report.adopted.is_empty() && report.objects == 0,
        "{report:?}"
    );
}

#[tokio::test]
async fn deletes_are_final_even_when_a_tier_is_down_or_the_node_crashes() {
    let (node, _) = Node::new().await;
    let id = ObjectId::random();
    node.write(id, TierLevel::Burst, &payload(500, 5))
        .await
        .unwrap();
    node.copy(id, TierLevel::Burst, TierLevel::Backing)
        .await
        .unwrap();
    node.backing.set_unreachable(true);
    assert!(node.delete(id).await.unwrap());
    assert_eq!(node.tiers_of(id).await, None);
    assert!(!node.has(TierLevel::Burst, id));
    assert!(node.has(TierLevel::Backing, id), "kept by the outage");
    assert_eq!(node.engine.finish_deletes().await.unwrap(), 0);

    // Crash now: the tombstone makes recovery remove the file, not adopt it.
    node.backing.set_unreachable(false);
    let (node, report) = node.restart().await;
    assert_eq!(report.deletes_finished, 1);
    assert!(report.adopted.is_empty());
    assert!(!node.has(TierLevel::Backing, id));
    assert_eq!(node.tiers_of(id).await, None);
    assert!(!node.delete(id).await.unwrap(), "already gone");
    for (_, usage) in node.engine.usage() {
        assert_eq!(usage.used, 0, "space reclaimed");
    }
}

/// A shared backing store is adopted by a survivor when its node is removed
/// for good, by its images alone (the manifest and its tombstones stay on the
/// lost node's disk): a delete whose backing image stays is therefore not
/// acknowledged, and the adopter serves every acknowledged object and no
/// deleted one. The first owner, back, is refused; a second adopter only
/// once the first is no longer a member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_backing_store_is_adopted_with_its_objects_and_without_its_deletes() {
    let (node, _) = Node::new_shared().await;
    let [kept, deleted, deleted_in_outage, burst_only] = [0; 4].map(|_| ObjectId::random());
    for (n, id) in [kept, deleted, deleted_in_outage, burst_only]
        .into_iter()
        .enumerate()
    {
        node.write(id, TierLevel::Burst, &payload(3000 + n, n as u64))
            .await
            .unwrap();
        if id != burst_only {
            node.copy(id, TierLevel::Burst, TierLevel::Backing)
                .await
                .unwrap();
        }
    }
    assert!(node.delete(deleted).await.unwrap());
    assert!(!node.has(TierLevel::Backing, deleted));
    // A file image whose payload rots after it was written.
    let rotten = ObjectId::random();
    node.write(rotten, TierLevel::Burst, &payload(2 << 20, 7))
        .await
        .unwrap();
    node.copy(rotten, TierLevel::Burst, TierLevel::Backing)
        .await
        .unwrap();
    let path = node.file_path(TierLevel::Backing, rotten);
    let mut image = std::fs::read(&path).unwrap();
    image[64 + 1000] ^= 0xff;
    std::fs::write(&path, image).unwrap();

    // The backing store is down: the delete is final here, not acknowledged.
    node.backing.set_unreachable(true);
    let err = node.delete(deleted_in_outage).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NodeUnavailable, "{err}");
    assert!(err.message().contains("not acknowledged"), "{err}");
    assert_eq!(node.tiers_of(deleted_in_outage).await, None);
    assert!(node.delete(deleted_in_outage).await.is_err(), "still down");
    node.backing.set_unreachable(false);
    assert!(
        !node.delete(deleted_in_outage).await.unwrap(),
        "a retry completes it"
    );
    assert!(!node.has(TierLevel::Backing, deleted_in_outage));

    // Node 7 is lost; node 1 adopts its backing store.
    let root = node.backing_dir.root().to_path_buf();
    drop(node.engine);
    let adopter = TierIdentity::new("test", 7).adopted(1);
    // Stopped cleanly, node 7 is expected back: its store is not adopted;
    // its start clears the mark.
    node.backing_dir.mark_stopped(true).await.unwrap();
    let err = DirTier::adopt(&root, &adopter, CAPACITY, |by| by.is_none()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectInUse, "{err}");
    assert!(err.message().contains("stopped cleanly"), "{err}");
    DirTier::open(&root, &TierIdentity::new("test", 7), CAPACITY).unwrap();
    let state = tempfile::tempdir().unwrap();
    let adopted = DirTier::adopt(&root, &adopter, CAPACITY, |by| by.is_none()).unwrap();
    let manifest = Manifest::open(&state.path().join("adopted-7.redb"), &adopter).unwrap();
    let (engine, report) = TierEngine::open_adopted(EngineConfig {
        manifest,
        burst: None,
        backing: Some(Arc::new(adopted)),
        shared_backing: true,
    })
    .await
    .unwrap();
    // Recorded from their headers (nothing read whole): the acknowledged
    // backing objects, nothing else.
    let mut ids: Vec<ObjectId> = report.records.iter().map(|(id, _)| *id).collect();
    let mut want = vec![kept, rotten];
    ids.sort();
    want.sort();
    assert_eq!(ids, want);
    let (dst, buffer) = DestRange::buffer(3000);
    assert_eq!(
        engine.restore(kept, dst).await.unwrap().from,
        TierLevel::Backing
    );
    assert_eq!(buffer.take().unwrap(), payload(3000, 0));
    // The rotten one fails its checksum at its first read, and is gone.
    let (dst, _) = DestRange::buffer(2 << 20);
    let err = engine.restore(rotten, dst).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectCorrupt, "{err}");
    assert_eq!(engine.record(rotten).await.unwrap(), None);

    // Node 7 back with its old configuration: refused, naming the adopter.
    let err = DirTier::open(&root, &TierIdentity::new("test", 7), CAPACITY).unwrap_err();
    assert!(err.message().contains("adopted by node 1"), "{err}");
    // Node 2 adopts it only once node 1 is gone.
    let by2 = TierIdentity::new("test", 7).adopted(2);
    let err = DirTier::adopt(&root, &by2, CAPACITY, |by| by.is_none()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectInUse, "{err}");
    DirTier::adopt(&root, &by2, CAPACITY, |by| by == Some(1)).unwrap();
    // A directory this node cannot see is not made.
    let err = DirTier::adopt(&state.path().join("nowhere"), &by2, CAPACITY, |_| true).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectNotFound, "{err}");
    assert!(!state.path().join("nowhere").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_during_a_drain_waits_for_it_and_nothing_comes_back() {
    let (node, _) = Node::new().await;
    let node = Arc::new(node);
    for round in 0..5 {
        let id = ObjectId::random();
        let bytes = payload(8 << 20, round);
        // The drain job is made (its write claimed), then the delete comes.
        let claim = node.claim(id).await;
        let writer = {
            let node = node.clone();
            tokio::spawn(async move { node.write_as(claim, TierLevel::Burst, &bytes).await })
        };
        tokio::task::yield_now().await;
        node.delete(id).await.unwrap();
        // Whichever took the lock first, nothing is left: the write ran
        // before the delete, or found its generation deleted and wrote nothing.
        if let Err(err) = writer.await.unwrap() {
            assert_eq!(err.kind(), ErrorKind::ObjectNotFound, "{err}");
        }
        assert_eq!(node.tiers_of(id).await, None);
        assert!(!node.has(TierLevel::Burst, id));
    }
    let node = Arc::into_inner(node).unwrap();
    let (node, report) = node.restart().await;
    assert_eq!(report.objects, 0);
    assert!(report.adopted.is_empty());
    assert_eq!(node.engine.usage()[0].1.used, 0);
}

/// Waits (bounded) until `tier` has `n` operations held at its gate.
async fn held(tier: &FaultyTier, n: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tier.waiting() != n {
        assert!(
            std::time::Instant::now() < deadline,
            "no operation reached the gate"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// The race of a write-behind drain against a delete (issue 39): the drain's
/// write was decided (its job made) before the delete, but the delete took
/// the object's lock first and was acknowledged while the write waited for
/// it. The write must then write nothing, packed image or file, and a
/// restart must not bring the object back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_decided_before_an_acknowledged_delete_writes_nothing() {
    let (node, _) = Node::new().await;
    let node = Arc::new(node);
    let mut ids = Vec::new();
    for (round, len) in [(1, 75_000), (2, 4 << 20)] {
        let id = ObjectId::random();
        ids.push(id);
        let claim = node.claim(id).await;
        // The delete commits its tombstone and stops, holding the lock, in
        // its removal of the burst buffer's file.
        node.burst.hold(Held::Deletes, true);
        let deleter = {
            let node = node.clone();
            tokio::spawn(async move { node.delete(id).await })
        };
        held(&node.burst, 1).await;
        let writer = {
            let node = node.clone();
            tokio::spawn(async move {
                node.write_as(claim, TierLevel::Burst, &payload(len, round))
                    .await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(
            !writer.is_finished(),
            "the write waits for the object's lock"
        );
        node.burst.hold(Held::Deletes, false);
        deleter.await.unwrap().unwrap(); // acknowledged
        let err = writer.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound, "{err}");
        assert_eq!(node.tiers_of(id).await, None, "no record after the delete");
        assert!(!node.has(TierLevel::Burst, id), "no image after the delete");
    }
    let node = Arc::into_inner(node).unwrap();
    let (node, report) = node.restart().await;
    assert_eq!(report.objects, 0, "{report:?}");
    assert!(report.adopted.is_empty(), "{report:?}");
    for id in ids {
        assert_eq!(node.tiers_of(id).await, None, "{id} came back");
    }
}

/// A write whose caller stops waiting (a drain stopped at shutdown) while
/// its image is on the way: the tier's work goes on (a blocking-pool write,
/// a PUT sent), so the object's lock must not free before it is done — a
/// delete let in then would be acknowledged, and the image landing after it
/// would be adopted at the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_its_caller_abandoned_finishes_before_a_delete_runs() {
    let (node, _) = Node::new().await;
    let node = Arc::new(node);
    let id = ObjectId::random();
    let claim = node.claim(id).await;
    node.burst.hold(Held::Puts, true);
    let writer = {
        let node = node.clone();
        tokio::spawn(async move {
            node.write_as(claim, TierLevel::Burst, &payload(300_000, 4))
                .await
        })
    };
    held(&node.burst, 1).await;
    writer.abort();
    let _ = writer.await;
    let deleter = {
        let node = node.clone();
        tokio::spawn(async move { node.delete(id).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        !deleter.is_finished(),
        "the delete waits for the write under way"
    );
    node.burst.hold(Held::Puts, false);
    assert!(
        deleter.await.unwrap().unwrap(),
        "the write was recorded, then deleted"
    );
    assert_eq!(node.tiers_of(id).await, None);
    assert!(!node.has(TierLevel::Burst, id));
    let node = Arc::into_inner(node).unwrap();
    let (node, report) = node.restart().await;
    assert_eq!(report.objects, 0, "{report:?}");
    assert!(report.adopted.is_empty(), "{report:?}");
    assert_eq!(node.tiers_of(id).await, None);
}

/// A manifest where a record was committed after its id's tombstone (what
/// the race above left before generations): recovery removes that record
/// and its files; a newer incarnation's record, written after an older
/// delete whose files were not all removed, keeps its copies.
#[tokio::test]
async fn recovery_never_keeps_a_record_its_tombstone_ended() {
    let (node, _) = Node::new().await;
    let (resurrected, newer) = (ObjectId::random(), ObjectId::random());
    let bytes = payload(60_000, 11);
    node.write(resurrected, TierLevel::Burst, &bytes)
        .await
        .unwrap();
    node.write(newer, TierLevel::Burst, &bytes).await.unwrap();
    let generation = node.generation(newer).await;
    let Node { dir, engine, .. } = node;
    drop(engine);
    {
        let me = TierIdentity::new("test", 7);
        let m = Manifest::open(&dir.path().join("burst/manifest.redb"), &me).unwrap();
        let record = m.get(&resurrected).unwrap().unwrap();
        let g = record.generation;
        assert!(matches!(
            m.tombstone(&resurrected, g).unwrap(),
            Tombstoned::Deleted(Some(_))
        ));
        m.apply(&[Change::Put(resurrected, record)]).unwrap();
        let record = m.get(&newer).unwrap().unwrap();
        m.apply(&[Change::Remove(newer)]).unwrap();
        m.tombstone(&newer, generation - 1).unwrap();
        m.apply(&[Change::Put(newer, record)]).unwrap();
    }
    let (node, report) = Node::open(dir, CAPACITY).await;
    assert_eq!(report.objects, 1, "{report:?}");
    assert!(report.adopted.is_empty(), "{report:?}");
    assert_eq!(node.tiers_of(resurrected).await, None);
    assert!(!node.has(TierLevel::Burst, resurrected));
    assert_eq!(
        node.restore(newer, bytes.len()).await.unwrap(),
        (TierLevel::Burst, bytes)
    );
    assert!(
        node.engine.next_generation() > generation,
        "generations go on above the manifest's"
    );
}

/// A write that replaces a packed copy whose dead record cannot be written
/// (an I/O error on the old segment's `.dead`) fails, and the old copy is
/// still live on disk. A delete must then bury it too, or fail and keep its
/// tombstone: otherwise, once the newer segment is removed, nothing outranks
/// the old copy and recovery adopts the deleted object.
#[tokio::test]
async fn a_replaced_packed_copy_that_could_not_be_marked_dead_never_comes_back() {
    let (node, _) = Node::new().await;
    let (passing, lasting) = (ObjectId::random(), ObjectId::random());
    let mut faults = Vec::new();
    for (seed, id) in [passing, lasting].into_iter().enumerate() {
        let bytes = payload(1000, 20 + seed as u64);
        node.write(id, TierLevel::Burst, &bytes).await.unwrap();
        let (segment, _, _) = node.burst_dir.image_location(&id).unwrap();
        // A directory where the old segment's `.dead` goes: opening it fails.
        let dead = segment.with_extension("dead");
        std::fs::create_dir(&dead).unwrap();
        // The object written again (a drain retried): the old copy cannot
        // be marked dead, so the write fails; the new copy serves.
        let err = node.write(id, TierLevel::Burst, &bytes).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Io, "{err}");
        assert_eq!(node.restore(id, bytes.len()).await.unwrap().1, bytes);
        faults.push(dead);
    }

    // The first fault passes before its delete; the second lasts through
    // it: the file stays, and so does the tombstone.
    std::fs::remove_dir(&faults[0]).unwrap();
    assert!(node.delete(passing).await.unwrap());
    assert!(!node.has(TierLevel::Burst, passing));
    assert!(node.delete(lasting).await.unwrap());
    assert_eq!(node.tiers_of(lasting).await, None);
    assert!(
        node.has(TierLevel::Burst, lasting),
        "the delete could not bury the old copy: it failed on the tier"
    );
    std::fs::remove_dir(&faults[1]).unwrap();

    let (node, report) = node.restart().await;
    assert!(report.adopted.is_empty(), "deletes came back: {report:?}");
    assert_eq!((report.objects, report.deletes_finished), (0, 1));
    for id in [passing, lasting] {
        assert_eq!(node.tiers_of(id).await, None);
        assert!(!node.has(TierLevel::Burst, id));
    }
    let (node, report) = node.restart().await;
    assert!(
        report.adopted.is_empty() && report.objects == 0,
        "{report:?}"
    );
    node.burst_dir.wait_counted();
    assert_eq!(node.engine.usage()[0].1.used, 0, "no segment is left");
}

#[tokio::test]
async fn recovery_after_a_crash_at_each_step_of_the_write_order() {
    let (node, _) = Node::new().await;
    let root = node.dir.path().to_path_buf();

    // Step 1: crash while the image is still a temp file (written, maybe
    // fsync'ed, not renamed). Nothing was acknowledged: it must vanish.
    let torn = ObjectId::random();
    std::fs::write(
        root.join("burst/tmp")
            .join(format!("{}.00000000000000aa", torn.to_hex())),
        b"partial",
    )
    .unwrap();

    // Step 2: crash after the rename and dir fsync, before the manifest commit
    // (the tier's put completes, then the "crash" hits the acknowledgement).
    let renamed = ObjectId::random();
    let renamed_bytes = payload(4096, 6);
    node.burst.fail_nth(1, FaultTiming::After);
    node.write(renamed, TierLevel::Burst, &renamed_bytes)
        .await
        .unwrap_err();
    assert_eq!(node.tiers_of(renamed).await, None, "not acknowledged");

    // Step 3: committed: the normal case.
    let committed = ObjectId::random();
    let committed_bytes = payload(3000, 7);
    node.write(committed, TierLevel::Burst, &committed_bytes)
        .await
        .unwrap();

    // A drain to the backing store that crashed after its rename.
    node.backing.fail_nth(1, FaultTiming::After);
    node.copy(committed, TierLevel::Burst, TierLevel::Backing)
        .await
        .unwrap_err();
    assert_eq!(
        node.tiers_of(committed).await,
        Some(TierSet::of(TierLevel::Burst))
    );

    // Garbage with an id's name but no valid image (a stray no write made).
    let garbage = ObjectId::random();
    std::fs::write(node.file_path(TierLevel::Backing, garbage), b"not an image").unwrap();

    // A recorded copy whose file vanished (an operator's rm).
    let vanished = ObjectId::random();
    node.write(vanished, TierLevel::Burst, &payload(100, 8))
        .await
        .unwrap();
    // (Written alone, it is alone in its segment: removing the file is the rm.)
    let (file, _, _) = node
        .dir(TierLevel::Burst)
        .image_location(&vanished)
        .unwrap();
    std::fs::remove_file(file).unwrap();

    // Objects only in the burst buffer must be re-queued for the drain.
    let undrained = ObjectId::random();
    node.write(undrained, TierLevel::Burst, &payload(100, 9))
        .await
        .unwrap();

    let (node, report) = node.restart().await;
    assert_eq!(report.swept, 1, "{report:?}");
    let mut adopted = vec![renamed, committed];
    adopted.sort();
    assert_eq!(report.adopted, adopted, "verified strays are adopted");
    assert_eq!(report.discarded, 1, "the garbage image");
    assert_eq!(report.lost_copies, 1);
    assert_eq!(report.dropped, vec![vanished]);
    let mut to_drain = vec![renamed, undrained];
    to_drain.sort();
    assert_eq!(report.to_drain, to_drain);
    assert_eq!(report.objects, 3);

    assert_eq!(node.tiers_of(torn).await, None);
    assert_eq!(node.tiers_of(garbage).await, None);
    assert!(!node.has(TierLevel::Backing, garbage));
    let adopted_record = node.engine.record(renamed).await.unwrap().unwrap();
    assert_eq!(
        adopted_record.durability,
        Durability::Memory,
        "no promise was made for it"
    );
    assert_eq!(node.restore(renamed, 4096).await.unwrap().1, renamed_bytes);
    assert_eq!(node.tiers_of(committed).await, Some(both()));
    assert_eq!(
        node.restore(committed, 3000).await.unwrap().1,
        committed_bytes
    );
    assert!(std::fs::read_dir(root.join("burst/tmp"))
        .unwrap()
        .next()
        .is_none());

    // A second restart finds nothing left to do.
    let (_, again) = node.restart().await;
    assert!(
        again.adopted.is_empty()
            && again.discarded == 0
            && again.swept == 0
            && again.lost_copies == 0
    );
    assert_eq!(again.objects, 3);
}

#[tokio::test]
async fn a_manifest_of_another_node_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manifest.redb");
    drop(Manifest::open(&path, &TierIdentity::new("a", 1)).unwrap());
    let err = Manifest::open(&path, &TierIdentity::new("b", 1)).unwrap_err();
    assert!(err.message().contains("refusing"), "{err}");
}

#[tokio::test]
async fn a_batch_write_keeps_each_objects_guarantees() {
    let big = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = Node::open(dir, 8 * 4096 + big as u64 / 2).await;
    let ids: Vec<ObjectId> = (0..5).map(|_| ObjectId::random()).collect();
    // ids[1] twice (the second bytes win), ids[3] too big for the burst buffer.
    let items: Vec<(ObjectId, Vec<u8>)> = vec![
        (ids[0], payload(100, 0)),
        (ids[1], payload(200, 1)),
        (ids[2], payload(0, 2)),
        (ids[3], payload(big, 3)),
        (ids[1], payload(300, 4)),
        (ids[4], payload(4000, 5)),
    ];
    let mut gens = std::collections::HashMap::new();
    for (id, _) in &items {
        gens.insert(*id, node.generation(*id).await);
    }
    let batch = items
        .iter()
        .map(|(id, bytes)| WriteItem {
            claim: node.engine.claim(*id, gens[id]),
            sizes: sizes_of(bytes.len(), 0),
            src: SourceRange::from_vec(bytes.clone()),
            info: WriteInfo {
                durability: Durability::Local,
                ..WriteInfo::default()
            },
        })
        .collect();
    let outcomes = node.engine.write_batch(TierLevel::Burst, batch).await;
    assert_eq!(outcomes.len(), items.len());
    for (i, ((id, bytes), outcome)) in items.iter().zip(&outcomes).enumerate() {
        if i == 3 {
            assert_eq!(outcome.as_ref().unwrap_err().kind(), ErrorKind::StoreFull);
            continue;
        }
        let record = outcome.as_ref().unwrap();
        assert_eq!(record.checksum, crc32c::crc32c(bytes), "item {i}");
        assert_eq!(
            (record.tiers, record.durability),
            (TierSet::of(TierLevel::Burst), Durability::Local)
        );
        let _ = id;
    }
    assert_eq!(
        node.engine.record(ids[3]).await.unwrap(),
        None,
        "nothing recorded for the refused one"
    );
    for (id, bytes) in [&items[0], &items[2], &items[4], &items[5]] {
        assert_eq!(
            node.restore(*id, bytes.len()).await.unwrap(),
            (TierLevel::Burst, bytes.clone())
        );
    }
    // An injected I/O error fails its own item only; the others commit.
    let (a, b) = (ObjectId::random(), ObjectId::random());
    let claims = [node.claim(a).await, node.claim(b).await];
    node.burst.fail_nth(1, FaultTiming::Before);
    let outcomes = node
        .engine
        .write_batch(
            TierLevel::Burst,
            claims
                .into_iter()
                .map(|claim| WriteItem {
                    claim,
                    sizes: sizes_of(10, 0),
                    src: SourceRange::from_vec(payload(10, 9)),
                    info: WriteInfo::default(),
                })
                .collect(),
        )
        .await;
    assert_eq!(outcomes[0].as_ref().unwrap_err().kind(), ErrorKind::Io);
    assert!(outcomes[1].is_ok());
    assert_eq!(node.tiers_of(a).await, None);
    // All of it survives a crash; nothing needs adopting.
    let (node, report) = node.restart().await;
    assert!(report.adopted.is_empty(), "{report:?}");
    for (id, bytes) in [&items[0], &items[2], &items[4], &items[5]] {
        assert_eq!(node.restore(*id, bytes.len()).await.unwrap().1, *bytes);
    }
    assert_eq!(node.tiers_of(b).await, Some(TierSet::of(TierLevel::Burst)));
}

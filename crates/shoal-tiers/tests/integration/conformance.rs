//! The `Tier` conformance suite against the directory backend, plain and
//! behind a `FaultyTier` with no fault armed (a decorator must not change
//! behaviour), plus what is specific to directories: owner markers, temp
//! files, names that are not ids.

use std::sync::{Arc, Mutex};

use crate::common::{payload, write, Damage, Harness};
use async_trait::async_trait;
use shoal_core::error::ErrorKind;
use shoal_core::ids::ObjectId;
use shoal_tiers::{DirTier, FaultyTier, Tier, TierIdentity};
use tempfile::TempDir;

/// Makes `DirTier`s in temporary directories (kept until the harness drops).
#[derive(Default)]
struct Dirs {
    faulty: bool,
    kept: Mutex<Vec<(TempDir, DirTier)>>,
}

impl Dirs {
    fn dir_of(&self, tier: &Arc<dyn Tier>) -> DirTier {
        let described = tier.describe();
        let kept = self.kept.lock().unwrap();
        kept.iter()
            .find(|(_, dir)| described.contains(&dir.describe()))
            .map(|(_, dir)| dir.clone())
            .expect("a tier this harness made")
    }
}

#[async_trait]
impl Harness for Dirs {
    async fn make(&self, capacity: u64) -> Arc<dyn Tier> {
        let dir = tempfile::tempdir().unwrap();
        let tier = DirTier::open(
            &dir.path().join("burst"),
            &TierIdentity::new("test", 0),
            capacity,
        )
        .unwrap();
        self.kept.lock().unwrap().push((dir, tier.clone()));
        if self.faulty {
            Arc::new(FaultyTier::new(Arc::new(tier)))
        } else {
            Arc::new(tier)
        }
    }

    async fn damage(&self, tier: &Arc<dyn Tier>, id: ObjectId, damage: Damage) {
        crate::common::damage_dir_image(&self.dir_of(tier), &id, damage);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dir_tier_conforms() {
    crate::common::suite::run(&Dirs::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faulty_tier_without_faults_conforms() {
    crate::common::suite::run(&Dirs {
        faulty: true,
        ..Dirs::default()
    })
    .await;
}

#[test]
fn another_nodes_or_clusters_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    DirTier::open(&root, &TierIdentity::new("prod", 1), 1 << 20).unwrap();
    // The owner reopens it.
    DirTier::open(&root, &TierIdentity::new("prod", 1), 1 << 20).unwrap();
    let err = DirTier::open(&root, &TierIdentity::new("prod", 2), 1 << 20).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(
        err.message()
            .contains("belongs to node 1 of cluster \"prod\""),
        "{err}"
    );
    let err = DirTier::open(&root, &TierIdentity::new("test", 1), 1 << 20).unwrap_err();
    assert!(err.message().contains("refusing"), "{err}");

    // A directory with someone's files and no marker is not taken over.
    let foreign = dir.path().join("home");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("thesis.tex"), b"precious").unwrap();
    let err = DirTier::open(&foreign, &TierIdentity::new("prod", 1), 1 << 20).unwrap_err();
    assert!(err.message().contains("not empty"), "{err}");
    assert_eq!(
        std::fs::read(foreign.join("thesis.tex")).unwrap(),
        b"precious"
    );
}

/// A read whose blocking task the runtime cancels (it was shutting down
/// before the task ran) fails with a typed error and hands the range back,
/// for the next tier to fill; it does not panic.
#[test]
fn a_read_cancelled_at_shutdown_is_an_error_not_a_panic() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    let dir = tempfile::tempdir().unwrap();
    let tier = DirTier::open(
        &dir.path().join("burst"),
        &TierIdentity::new("test", 0),
        1 << 30,
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    let (id, bytes) = (ObjectId::random(), payload(5000, 1));
    runtime.block_on(write(&tier, id, &bytes, 0)).unwrap();
    let handle = runtime.handle().clone();
    runtime.shutdown_background();

    // Polled here, outside any runtime, with the shut-down one as context:
    // its blocking pool cancels the read's task instead of running it.
    let _context = handle.enter();
    let (dst, buffer) = shoal_tiers::DestRange::buffer(bytes.len());
    let mut read = std::pin::pin!(tier.get(id, dst));
    let mut cx = Context::from_waker(Waker::noop());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (dst, got) = loop {
        if let Poll::Ready(out) = read.as_mut().poll(&mut cx) {
            break out;
        }
        assert!(std::time::Instant::now() < deadline, "the read never ended");
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    let err = got.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(err.message().contains("cancelled"), "{err}");
    assert_eq!(dst.len(), bytes.len(), "the range comes back");
    drop(dst);
    assert!(buffer.take().is_some());
}

#[tokio::test]
async fn sweep_removes_temp_files_and_foreign_names_and_reopen_counts_usage() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    let me = TierIdentity::new("c", 0);
    let tier = DirTier::open(&root, &me, 1 << 30).unwrap();
    let id = ObjectId::random();
    write(&tier, id, &payload(5000, 1), 0).await.unwrap();
    // What a crash mid-put leaves, and names that are no object's.
    std::fs::write(
        root.join("tmp")
            .join(format!("{}.0123456789abcdef", id.to_hex())),
        b"half",
    )
    .unwrap();
    std::fs::write(root.join("objects/00/notes.txt"), b"x").unwrap();
    let misplaced = ObjectId([0xab; 20]);
    std::fs::write(root.join("objects/00").join(misplaced.to_hex()), b"x").unwrap();

    let reopened = DirTier::open(&root, &me, 1 << 30).unwrap();
    reopened.wait_counted();
    assert_eq!(
        reopened.usage().objects,
        1,
        "only images under their own name count"
    );
    assert_eq!(reopened.usage().used, tier.usage().used);
    assert_eq!(reopened.sweep().await.unwrap(), 3);
    assert_eq!(reopened.list().await.unwrap(), vec![id]);
    assert_eq!(reopened.sweep().await.unwrap(), 0);
}

/// The walk at open serves the first `list`: changes made before it (a
/// recovery's deletes, a put) are in it, and later lists walk again.
#[tokio::test]
async fn the_first_list_after_open_sees_changes_made_since_the_walk() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    let me = TierIdentity::new("c", 0);
    let tier = DirTier::open(&root, &me, 1 << 30).unwrap();
    let ids: Vec<ObjectId> = (0..300).map(|_| ObjectId::random()).collect();
    for (i, id) in ids.iter().enumerate() {
        write(&tier, *id, &payload(10, i as u64), 0).await.unwrap();
    }
    let reopened = DirTier::open(&root, &me, 1 << 30).unwrap();
    assert!(reopened.delete(ids[0]).await.unwrap());
    let added = ObjectId::random();
    write(&reopened, added, &payload(10, 0), 0).await.unwrap();
    let mut want: Vec<ObjectId> = ids[1..].iter().copied().chain([added]).collect();
    want.sort();
    let mut listed = reopened.list().await.unwrap();
    listed.sort();
    assert_eq!(listed, want);
    // Later lists walk again.
    assert!(reopened.delete(ids[1]).await.unwrap());
    let mut listed = reopened.list().await.unwrap();
    listed.sort();
    want.retain(|id| *id != ids[1]);
    assert_eq!(listed, want);
    reopened.wait_counted();
    assert_eq!(reopened.usage().objects, 299);
}

/// File images are restored with direct I/O through a bounce buffer
/// (dir/direct.rs): payloads of 4 MiB and more in 4 MiB blocks, smaller ones
/// in one read. Block boundaries, the unaligned tail and damage anywhere
/// must come out as in the buffered path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_objects_restore_through_direct_io_and_damage_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let tier = DirTier::open(&dir.path().join("t"), &TierIdentity::new("c", 0), 1 << 30).unwrap();
    // Three 4 MiB blocks, the last one short and unaligned; one direct read.
    for len in [(9 << 20) + 5, (2 << 20) + 5] {
        check_direct_restores(&tier, len).await;
    }
}

async fn check_direct_restores(tier: &DirTier, len: usize) {
    let image_len = (shoal_tiers::format::HEADER_LEN + len) as u64;
    for (i, damage) in [
        None,
        Some(Damage::FlipBit((1 << 20) * 8 + 3)), // inside, off any block edge
        Some(Damage::FlipBit((4 << 20).min(image_len - 1) * 8 + 3)), // the second block's first byte
        Some(Damage::FlipBit(image_len * 8 - 1)),                    // last payload bit
        Some(Damage::Truncate(image_len - 4096)),
    ]
    .into_iter()
    .enumerate()
    {
        let id = ObjectId::random();
        let bytes = payload(len, i as u64);
        write(tier, id, &bytes, 3).await.unwrap();
        let got = match damage {
            None => {
                assert_eq!(crate::common::read(tier, id, len).await.unwrap(), bytes);
                continue;
            }
            Some(damage) => {
                crate::common::damage_dir_image(tier, &id, damage);
                crate::common::read(tier, id, len).await
            }
        };
        let err = got.unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::ObjectCorrupt,
            "{len} bytes, {damage:?}: {err}"
        );
    }
}

//! The directory tier's packing of small objects into segments
//! (src/dir/segments.rs): one segment per batch, durable deletes, space back
//! by removal and compaction, and the rules that decide which copy counts
//! after a crash (unfinished segments, damaged indexes, a replace or a
//! compaction cut short, a file image beside a packed one).

use std::collections::HashSet;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::{payload, read, sizes_of};
use shoal_core::error::ErrorKind;
use shoal_core::ids::ObjectId;
use shoal_tiers::{DirTier, ObjectHeader, PutItem, SourceRange, Tier, TierIdentity};

fn open(root: &Path) -> DirTier {
    let tier = DirTier::open(root, &TierIdentity::new("test", 0), 1 << 40).unwrap();
    tier.wait_counted();
    tier
}

/// Puts `objects` as one batch; every put must succeed.
async fn put_all(tier: &DirTier, objects: &[(ObjectId, Vec<u8>)]) {
    let items = objects
        .iter()
        .map(|(id, bytes)| PutItem {
            id: *id,
            sizes: sizes_of(bytes.len(), 0),
            src: SourceRange::from_vec(bytes.clone()),
        })
        .collect();
    for outcome in tier.put_batch(items).await {
        outcome.unwrap();
    }
}

fn objects(n: usize, len: usize, seed: u64) -> Vec<(ObjectId, Vec<u8>)> {
    (0..n)
        .map(|i| (ObjectId::random(), payload(len, seed + i as u64)))
        .collect()
}

/// Names in `root/segments` with extension `ext`.
fn files(root: &Path, ext: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    found.sort();
    found
}

async fn listed(tier: &DirTier) -> HashSet<ObjectId> {
    tier.list().await.unwrap().into_iter().collect()
}

async fn assert_serves(tier: &DirTier, objects: &[(ObjectId, Vec<u8>)]) {
    for (id, bytes) in objects {
        assert_eq!(&read(tier, *id, bytes.len()).await.unwrap(), bytes, "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_small_objects_is_one_segment_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("burst");
    let tier = open(&root);
    let mut all = objects(50, 10_000, 0);
    all.extend(objects(2, 2 << 20, 100));
    put_all(&tier, &all).await;
    assert_eq!(files(&root, "seg").len(), 1, "one segment for the batch");
    let fans: usize = std::fs::read_dir(root.join("objects"))
        .unwrap()
        .map(|f| std::fs::read_dir(f.unwrap().path()).unwrap().count())
        .sum();
    assert_eq!(fans, 2, "large objects keep a file each");
    let usage = tier.usage();
    let images: u64 = all.iter().map(|(_, b)| 64 + b.len() as u64).sum();
    assert_eq!((usage.used, usage.objects), (images, 52));
    assert_serves(&tier, &all).await;
    drop(tier);

    let tier = open(&root);
    assert_eq!(tier.sweep().await.unwrap(), 0);
    assert_eq!(listed(&tier).await, all.iter().map(|(id, _)| *id).collect());
    assert_eq!(tier.usage().used, images);
    assert_eq!(tier.usage().objects, 52);
    assert_serves(&tier, &all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_are_durable_and_space_comes_back_by_compaction_and_removal() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("burst");
    let tier = open(&root);
    let all = objects(10, 1000, 0);
    put_all(&tier, &all).await;
    let first = files(&root, "seg");
    for (id, _) in &all[..3] {
        assert!(tier.delete(*id).await.unwrap());
        assert!(
            !tier.delete(*id).await.unwrap(),
            "a second delete finds nothing"
        );
        let err = read(&tier, *id, 1000).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
    }
    assert_eq!(tier.usage().used, 10 * 1064, "dead images hold their space");
    drop(tier);

    // Deleted before a crash: never back.
    let tier = open(&root);
    assert_eq!(
        listed(&tier).await,
        all[3..].iter().map(|(id, _)| *id).collect()
    );
    assert_eq!(tier.usage().objects, 7);
    // Three more: 4 of 10 live is under half, so the segment is compacted.
    for (id, _) in &all[3..6] {
        assert!(tier.delete(*id).await.unwrap());
    }
    let now = files(&root, "seg");
    assert_eq!(now.len(), 1);
    assert_ne!(now, first, "the live images moved to a new segment");
    assert!(
        files(&root, "dead").is_empty(),
        "the old dead records went with it"
    );
    assert_eq!(tier.usage().used, 4 * 1064);
    assert_serves(&tier, &all[6..]).await;
    drop(tier);

    let tier = open(&root);
    assert_eq!(
        listed(&tier).await,
        all[6..].iter().map(|(id, _)| *id).collect()
    );
    assert_serves(&tier, &all[6..]).await;
    for (id, _) in &all[6..] {
        assert!(tier.delete(*id).await.unwrap());
    }
    assert!(files(&root, "seg").is_empty() && files(&root, "dead").is_empty());
    assert_eq!((tier.usage().used, tier.usage().objects), (0, 0));
    drop(tier);
    let tier = open(&root);
    assert!(tier.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_segment_keeps_only_its_complete_images() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("burst");
    let tier = open(&root);
    let all = objects(5, 1000, 0);
    put_all(&tier, &all).await;
    let empty = objects(1, 1000, 50);
    put_all(&tier, &empty).await;
    drop(tier);
    // A crash while they were written: the first cut in its fifth image
    // (no index, no trailer), the second before its first header ends.
    let segs = files(&root, "seg");
    let cut = |path: &Path, len: u64| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len)
            .unwrap()
    };
    cut(&segs[0], 4 * 1064 + 500);
    cut(&segs[1], 40);

    let tier = open(&root);
    assert_eq!(tier.sweep().await.unwrap(), 1, "the segment with no image");
    assert!(!segs[1].exists());
    assert_eq!(
        listed(&tier).await,
        all[..4].iter().map(|(id, _)| *id).collect()
    );
    assert_serves(&tier, &all[..4]).await;
    let err = read(&tier, all[4].0, 1000).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_index_is_rebuilt_from_the_headers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("burst");
    let tier = open(&root);
    let all = objects(5, 1000, 0);
    put_all(&tier, &all).await;
    drop(tier);
    let seg = &files(&root, "seg")[0];
    let mut bytes = std::fs::read(seg).unwrap();
    bytes[5 * 1064 + 7] ^= 0x10; // inside the index
    std::fs::write(seg, bytes).unwrap();
    let tier = open(&root);
    assert_eq!(listed(&tier).await, all.iter().map(|(id, _)| *id).collect());
    assert_serves(&tier, &all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_replace_cut_short_the_newer_copy_counts_and_a_delete_stays_final() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("burst");
    let tier = open(&root);
    let id = ObjectId::random();
    let (v1, v2) = (payload(1000, 1), payload(1000, 2));
    put_all(&tier, &[(id, v1)]).await;
    let old = files(&root, "seg")[0].clone();
    let snapshot = std::fs::read(&old).unwrap();
    put_all(&tier, &[(id, v2.clone())]).await;
    assert!(
        !old.exists(),
        "the replaced copy's segment emptied and went"
    );
    drop(tier);
    // As if the crash came before the old copy was marked dead.
    std::fs::write(&old, snapshot).unwrap();

    let tier = open(&root);
    assert_eq!(read(&tier, id, 1000).await.unwrap(), v2, "the newer copy");
    tier.sweep().await.unwrap();
    assert!(!old.exists(), "the superseded copy was buried");
    assert!(tier.delete(id).await.unwrap());
    drop(tier);
    let tier = open(&root);
    assert!(tier.list().await.unwrap().is_empty(), "no resurrection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_record_in_the_newest_segment_outranks_an_older_live_copy() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("burst");
    let tier = open(&root);
    let (x, y) = (ObjectId::random(), ObjectId::random());
    put_all(&tier, &[(x, payload(1000, 1))]).await;
    let old = files(&root, "seg")[0].clone();
    let snapshot = std::fs::read(&old).unwrap();
    // Rewritten beside y (as a compaction would copy it), then deleted.
    let kept = payload(5000, 3);
    put_all(&tier, &[(x, payload(1000, 1)), (y, kept.clone())]).await;
    assert!(tier.delete(x).await.unwrap());
    drop(tier);
    std::fs::write(&old, snapshot).unwrap();

    let tier = open(&root);
    assert_eq!(listed(&tier).await, HashSet::from([y]));
    tier.sweep().await.unwrap();
    assert!(!old.exists());
    assert_eq!(read(&tier, y, 5000).await.unwrap(), kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_image_wins_over_a_packed_copy() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("burst");
    let tier = open(&root);
    let id = ObjectId::random();
    put_all(&tier, &[(id, payload(1000, 1))]).await;
    drop(tier);
    // A file image of the same id, as a build without packing wrote it.
    let file = payload(1000, 2);
    let header = ObjectHeader {
        id,
        data_size: 1000,
        meta_size: 0,
        checksum: crc32c::crc32c(&file),
    };
    let hex = id.to_hex();
    let mut image = header.encode().to_vec();
    image.extend_from_slice(&file);
    std::fs::write(root.join("objects").join(&hex[..2]).join(&hex), image).unwrap();

    let tier = open(&root);
    assert_eq!(tier.list().await.unwrap(), vec![id]);
    assert_eq!(read(&tier, id, 1000).await.unwrap(), file);
    tier.sweep().await.unwrap();
    assert!(files(&root, "seg").is_empty(), "the packed copy was buried");
    assert_eq!(tier.usage().objects, 1);
    assert!(tier.delete(id).await.unwrap());
    drop(tier);
    let tier = open(&root);
    assert!(tier.list().await.unwrap().is_empty());
}

/// A file image written over a packed copy whose dead record cannot be
/// written (its `.dead` path taken by a directory): the put fails, both
/// copies are on disk, and a read answers what a reopen would — the file
/// image — never the older packed bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_prefers_the_file_image_as_the_reopen_does() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("burst");
    let tier = open(&root);
    let id = ObjectId::random();
    let packed = payload(1000, 3);
    put_all(&tier, &[(id, packed)]).await;
    let segment = files(&root, "seg").pop().unwrap();
    std::fs::create_dir(segment.with_extension("dead")).unwrap();
    // The same id again, too large to pack: a file image.
    let large = payload((2 << 20) + 5, 4);
    let items = vec![PutItem {
        id,
        sizes: sizes_of(large.len(), 0),
        src: SourceRange::from_vec(large.clone()),
    }];
    let failed = tier.put_batch(items).await.pop().unwrap();
    assert!(failed.is_err(), "the old copy could not be marked dead");
    assert_eq!(read(&tier, id, large.len()).await.unwrap(), large);
    assert_eq!(tier.header(id).await.unwrap().data_size, large.len() as u64);
    assert_eq!(tier.verify(id).await.unwrap().data_size, large.len() as u64);
    drop(tier);
    std::fs::remove_dir(segment.with_extension("dead")).unwrap();
    let tier = open(&root);
    assert_eq!(read(&tier, id, large.len()).await.unwrap(), large);
}

/// Deletes race reads and each other while segments are compacted and
/// removed: every read returns the right bytes or NotFound for a deleted
/// id, and what is left is exactly what was not deleted, before and after
/// a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deletes_racing_reads_and_compactions_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("burst");
    let tier = Arc::new(open(&root));
    let mut all = Vec::new();
    for batch in 0..4 {
        let some = objects(60, 3000 + batch * 100, batch as u64 * 1000);
        put_all(&tier, &some).await;
        all.extend(some);
    }
    let all = Arc::new(all);
    // Every third object survives.
    let doomed: Vec<ObjectId> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, (id, _))| *id)
        .collect();
    let mut tasks = Vec::new();
    for part in doomed.chunks(doomed.len().div_ceil(4)) {
        let (tier, part) = (tier.clone(), part.to_vec());
        tasks.push(tokio::spawn(async move {
            for id in part {
                assert!(tier.delete(id).await.unwrap());
            }
        }));
    }
    for reader in 0..2 {
        let (tier, all) = (tier.clone(), all.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..3 {
                for (i, (id, bytes)) in all.iter().enumerate() {
                    if (i + reader + round) % 2 != 0 {
                        continue;
                    }
                    match read(tier.as_ref(), *id, bytes.len()).await {
                        Ok(got) => assert_eq!(&got, bytes, "{id}"),
                        Err(err) => {
                            assert_eq!(err.kind(), ErrorKind::ObjectNotFound, "{err}");
                            assert!(i % 3 != 0, "a kept object went missing: {err}");
                        }
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let kept: Vec<(ObjectId, Vec<u8>)> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 == 0)
        .map(|(_, o)| o.clone())
        .collect();
    let want: HashSet<ObjectId> = kept.iter().map(|(id, _)| *id).collect();
    assert_eq!(listed(&tier).await, want);
    assert_serves(&tier, &kept).await;
    let images: u64 = kept.iter().map(|(_, b)| 64 + b.len() as u64).sum();
    let used = tier.usage().used;
    assert!(
        used >= images && used < 2 * images,
        "used {used} for {images} bytes of live images: thinned segments were compacted"
    );
    drop(tier);
    let tier = open(&root);
    assert_eq!(listed(&tier).await, want);
    assert_serves(&tier, &kept).await;
}

/// Pages of `path` in the page cache (mincore over a mapping of it).
fn cached_pages(path: &Path) -> usize {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    let page = 4096;
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: a read-only shared mapping of a file we opened, unmapped below;
    // mincore only fills `vec` (one byte per page of the mapping).
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(map, libc::MAP_FAILED);
        assert_eq!(libc::mincore(map, len, vec.as_mut_ptr()), 0);
        libc::munmap(map, len);
    }
    vec.iter().filter(|b| *b & 1 == 1).count()
}

/// Writes back and drops the page cache of `path`.
fn drop_cache(path: &Path) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    file.sync_all().unwrap();
    // SAFETY: an advisory call on a descriptor we own.
    let advised = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(advised, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_packed_images_are_read_past_the_page_cache_and_still_checked() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("burst");
    let tier = open(&root);
    // Odd sizes: the images start and end off the 4 KiB blocks.
    let big = objects(6, 300_001, 7);
    put_all(&tier, &big).await;
    let segment = files(&root, "seg").pop().expect("packed");
    drop_cache(&segment);
    if cached_pages(&segment) > 0 {
        eprintln!("skipped: this file system keeps the segment cached after DONTNEED");
        return;
    }
    assert_serves(&tier, &big).await;
    let cached = cached_pages(&segment);
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&segment)
        .is_ok();
    if direct {
        assert_eq!(
            cached, 0,
            "restores of large packed images bypass the page cache"
        );
    } else {
        eprintln!("this file system has no O_DIRECT: the buffered path was used");
    }

    // A flipped byte in the middle of one image: that object is corrupt, the
    // others are served.
    let bytes = std::fs::read(&segment).unwrap();
    let needle = &big[2].1[150_000..150_064];
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the image is in the segment");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[bytes[at] ^ 0x40], at as u64).unwrap();
    drop_cache(&segment);
    let err = read(&tier, big[2].0, big[2].1.len()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectCorrupt, "{err}");
    for (i, (id, want)) in big.iter().enumerate().filter(|(i, _)| *i != 2) {
        assert_eq!(
            &read(&tier, *id, want.len()).await.unwrap(),
            want,
            "image {i}"
        );
    }
}

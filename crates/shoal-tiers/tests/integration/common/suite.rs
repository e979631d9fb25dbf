//! The conformance suite of the `Tier` trait (object_store's
//! `integration.rs` idea): every backend runs every check here.

use std::sync::Arc;

use shoal_core::error::ErrorKind;
use shoal_core::ids::ObjectId;
use shoal_tiers::format::HEADER_LEN;
use shoal_tiers::{DestRange, PutItem, SourceRange, Tier};

use super::{payload, read, sizes_of, write, Damage, Harness};

const BIG: u64 = 1 << 30;

/// Runs every check against tiers made by `harness`.
pub async fn run(harness: &dyn Harness) {
    round_trips(harness).await;
    missing_objects(harness).await;
    replaces_and_accounts(harness).await;
    lists_and_deletes(harness).await;
    refuses_bad_ranges(harness).await;
    full_tier_is_store_full(harness).await;
    detects_damage(harness).await;
    concurrent_puts(harness).await;
    batch_puts(harness).await;
}

async fn round_trips(harness: &dyn Harness) {
    let tier = harness.make(BIG).await;
    // Empty, tiny, and larger than one 4 MiB I/O chunk (odd length).
    for (i, (len, meta)) in [
        (0usize, 0u32),
        (1, 0),
        (1, 1),
        (100, 10),
        ((4 << 20) + 3, 7),
    ]
    .into_iter()
    .enumerate()
    {
        let id = ObjectId::random();
        let bytes = payload(len, i as u64);
        let header = tier
            .put(
                id,
                sizes_of(len, meta),
                SourceRange::from_vec(bytes.clone()),
            )
            .await
            .unwrap();
        assert_eq!(header.id, id);
        assert_eq!(
            header.checksum,
            crc32c::crc32c(&bytes),
            "checksum of the payload"
        );
        assert_eq!(header.meta_size, meta);
        assert_eq!(
            read(tier.as_ref(), id, len).await.unwrap(),
            bytes,
            "len {len}"
        );
        assert_eq!(tier.verify(id).await.unwrap(), header);
    }
    assert_eq!(
        tier.sweep().await.unwrap(),
        0,
        "a clean tier has nothing to sweep"
    );
}

async fn missing_objects(harness: &dyn Harness) {
    let tier = harness.make(BIG).await;
    let id = ObjectId::random();
    let err = read(tier.as_ref(), id, 10).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectNotFound, "{err}");
    assert_eq!(
        tier.verify(id).await.unwrap_err().kind(),
        ErrorKind::ObjectNotFound
    );
    assert!(!tier.delete(id).await.unwrap());
    assert!(tier.list().await.unwrap().is_empty());
}

async fn replaces_and_accounts(harness: &dyn Harness) {
    let tier = harness.make(BIG).await;
    let id = ObjectId::random();
    write(tier.as_ref(), id, &payload(1000, 1), 0)
        .await
        .unwrap();
    assert_eq!(tier.usage().used, HEADER_LEN as u64 + 1000);
    assert_eq!(tier.usage().objects, 1);
    let second = payload(300, 2);
    write(tier.as_ref(), id, &second, 3).await.unwrap();
    assert_eq!(read(tier.as_ref(), id, 300).await.unwrap(), second);
    let usage = tier.usage();
    assert_eq!(
        (usage.used, usage.objects, usage.capacity),
        (HEADER_LEN as u64 + 300, 1, BIG)
    );
    assert!(tier.delete(id).await.unwrap());
    assert_eq!(tier.usage().used, 0);
    assert_eq!(tier.usage().objects, 0);
}

async fn lists_and_deletes(harness: &dyn Harness) {
    let tier = harness.make(BIG).await;
    let mut ids: Vec<ObjectId> = (0..20).map(|_| ObjectId::random()).collect();
    for (i, id) in ids.iter().enumerate() {
        write(tier.as_ref(), *id, &payload(10 + i, i as u64), 0)
            .await
            .unwrap();
    }
    let mut listed = tier.list().await.unwrap();
    listed.sort();
    ids.sort();
    assert_eq!(listed, ids);
    for id in &ids[..5] {
        assert!(tier.delete(*id).await.unwrap());
        assert!(
            !tier.delete(*id).await.unwrap(),
            "second delete finds nothing"
        );
    }
    let mut listed = tier.list().await.unwrap();
    listed.sort();
    assert_eq!(listed, ids[5..]);
}

async fn refuses_bad_ranges(harness: &dyn Harness) {
    let tier = harness.make(BIG).await;
    let id = ObjectId::random();
    let err = tier
        .put(id, sizes_of(10, 0), SourceRange::from_vec(vec![0; 9]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(tier.list().await.unwrap().is_empty());
    write(tier.as_ref(), id, &payload(10, 0), 0).await.unwrap();
    let (dst, _buffer) = DestRange::buffer(11);
    let (_, got) = tier.get(id, dst).await;
    assert_eq!(got.unwrap_err().kind(), ErrorKind::InvalidArgument);
}

async fn full_tier_is_store_full(harness: &dyn Harness) {
    let tier = harness.make(3 * (HEADER_LEN as u64 + 100)).await;
    for _ in 0..3 {
        write(tier.as_ref(), ObjectId::random(), &payload(100, 0), 0)
            .await
            .unwrap();
    }
    let id = ObjectId::random();
    let err = write(tier.as_ref(), id, &payload(1, 0), 0)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreFull, "{err}");
    assert!(err.message().contains("do not fit"), "{err}");
    assert_eq!(
        tier.list().await.unwrap().len(),
        3,
        "the refused object left nothing"
    );
    assert_eq!(tier.usage().used, 3 * (HEADER_LEN as u64 + 100));
    // Space comes back with a delete.
    let victim = tier.list().await.unwrap()[0];
    tier.delete(victim).await.unwrap();
    write(tier.as_ref(), id, &payload(100, 0), 0).await.unwrap();
}

async fn detects_damage(harness: &dyn Harness) {
    let tier = harness.make(BIG).await;
    let len = 10_000usize;
    let image_len = (HEADER_LEN + len) as u64;
    let cases = [
        Damage::Truncate(image_len - 1),
        Damage::Truncate(HEADER_LEN as u64 + 1),
        Damage::Truncate(10),
        Damage::Truncate(0),
        Damage::FlipBit(0),                     // magic
        Damage::FlipBit(33 * 8),                // data size
        Damage::FlipBit(44 * 8 + 3),            // stored checksum
        Damage::FlipBit(HEADER_LEN as u64 * 8), // first payload bit
        Damage::FlipBit(image_len * 8 - 1),     // last payload bit
        Damage::FlipBit((HEADER_LEN as u64 + 5000) * 8 + 4),
    ];
    for damage in cases {
        let id = ObjectId::random();
        write(tier.as_ref(), id, &payload(len, 9), 0).await.unwrap();
        harness.damage(&tier, id, damage).await;
        let err = read(tier.as_ref(), id, len).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectCorrupt, "{damage:?}: {err}");
        let err = tier.verify(id).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectCorrupt, "{damage:?}: {err}");
    }
}

async fn concurrent_puts(harness: &dyn Harness) {
    let tier: Arc<dyn Tier> = harness.make(BIG).await;
    let tasks: Vec<_> = (0..16u64)
        .map(|i| {
            let tier = tier.clone();
            tokio::spawn(async move {
                let id = ObjectId::random();
                let bytes = payload(50_000 + i as usize, i);
                write(tier.as_ref(), id, &bytes, 0).await.unwrap();
                (id, bytes)
            })
        })
        .collect();
    let mut expected = Vec::new();
    for task in tasks {
        expected.push(task.await.unwrap());
    }
    for (id, bytes) in &expected {
        assert_eq!(&read(tier.as_ref(), *id, bytes.len()).await.unwrap(), bytes);
    }
    assert_eq!(tier.list().await.unwrap().len(), 16);
    assert_eq!(tier.usage().objects, 16);
}

/// A batch: each image with `put`'s contract, outcomes in order; one that
/// does not fit fails alone and leaves nothing; a later batch replaces.
async fn batch_puts(harness: &dyn Harness) {
    let lens = [100usize, 0, (4 << 20) + 3, 1000];
    let room: u64 = lens.iter().map(|&l| (HEADER_LEN + l) as u64).sum();
    // Slack for the replacements below (a replacing image takes its room
    // before the one it replaces gives its own back).
    let capacity = room + 200;
    let tier = harness.make(capacity).await;
    // The third item of this batch is too big for what is left.
    let ids: Vec<ObjectId> = (0..5).map(|_| ObjectId::random()).collect();
    let mut bytes: Vec<Vec<u8>> = lens
        .iter()
        .enumerate()
        .map(|(i, &l)| payload(l, i as u64))
        .collect();
    bytes.insert(2, payload(capacity as usize, 99));
    let items = ids
        .iter()
        .zip(&bytes)
        .map(|(&id, b)| PutItem {
            id,
            sizes: sizes_of(b.len(), 0),
            src: SourceRange::from_vec(b.clone()),
        })
        .collect();
    let outcomes = tier.put_batch(items).await;
    assert_eq!(outcomes.len(), 5);
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == 2 {
            let err = outcome.as_ref().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::StoreFull, "{err}");
            continue;
        }
        let header = outcome.as_ref().unwrap();
        assert_eq!(
            (header.id, header.checksum),
            (ids[i], crc32c::crc32c(&bytes[i]))
        );
        assert_eq!(
            read(tier.as_ref(), ids[i], bytes[i].len()).await.unwrap(),
            bytes[i]
        );
    }
    let mut listed = tier.list().await.unwrap();
    listed.sort();
    let mut want: Vec<ObjectId> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, id)| *id)
        .collect();
    want.sort();
    assert_eq!(listed, want, "the refused image left nothing");
    assert_eq!((tier.usage().used, tier.usage().objects), (room, 4));

    // A second batch replacing two of them (smaller) and adding none.
    let again = [(ids[0], payload(10, 7)), (ids[4], payload(20, 8))];
    let items = again
        .iter()
        .map(|(id, b)| PutItem {
            id: *id,
            sizes: sizes_of(b.len(), 0),
            src: SourceRange::from_vec(b.clone()),
        })
        .collect();
    for outcome in tier.put_batch(items).await {
        outcome.unwrap();
    }
    for (id, b) in &again {
        assert_eq!(&read(tier.as_ref(), *id, b.len()).await.unwrap(), b);
    }
    assert_eq!(tier.usage().objects, 4);
    assert_eq!(
        tier.usage().used,
        room - (100 + 1000) as u64 + (10 + 20) as u64,
        "replaced images give their space back"
    );
    assert!(tier.put_batch(Vec::new()).await.is_empty());
}

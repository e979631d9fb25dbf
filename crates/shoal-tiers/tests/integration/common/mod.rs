//! Shared by the integration tests: the conformance suite every tier backend
//! passes, and helpers to make payloads and ranges.

pub mod suite;

use std::sync::Arc;

use async_trait::async_trait;
use shoal_core::ids::ObjectId;
use shoal_tiers::{DestRange, ObjectSizes, SourceRange, Tier};

/// A deterministic payload of `len` bytes for `seed`.
pub fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

pub fn sizes_of(len: usize, meta: u32) -> ObjectSizes {
    ObjectSizes {
        data_size: len as u64 - u64::from(meta),
        meta_size: meta,
    }
}

/// Reads `id` from `tier` into a fresh buffer of `len` bytes.
pub async fn read(tier: &dyn Tier, id: ObjectId, len: usize) -> shoal_core::error::Result<Vec<u8>> {
    let (dst, buffer) = DestRange::buffer(len);
    let (dst, got) = tier.get(id, dst).await;
    drop(dst);
    got.map(|_| buffer.take().expect("range dropped"))
}

pub async fn write(
    tier: &dyn Tier,
    id: ObjectId,
    bytes: &[u8],
    meta: u32,
) -> shoal_core::error::Result<()> {
    tier.put(
        id,
        sizes_of(bytes.len(), meta),
        SourceRange::from_vec(bytes.to_vec()),
    )
    .await
    .map(drop)
}

/// How a test damages a stored image, as a failing disk or a stray process
/// would.
#[derive(Debug, Clone, Copy)]
pub enum Damage {
    /// Keep only the first `n` bytes of the image.
    Truncate(u64),
    /// Flip one bit, counted from the start of the image (header included).
    FlipBit(u64),
}

/// A backend under test: makes fresh, empty tiers and damages their images.
#[async_trait]
pub trait Harness: Send + Sync {
    async fn make(&self, capacity: u64) -> Arc<dyn Tier>;
    async fn damage(&self, tier: &Arc<dyn Tier>, id: ObjectId, damage: Damage);
}

/// Applies `damage` to the image of `id` on a directory tier, in place
/// (a packed image is damaged inside its segment; truncating it cuts the
/// segment there).
pub fn damage_dir_image(tier: &shoal_tiers::DirTier, id: &ObjectId, damage: Damage) {
    use std::os::unix::fs::FileExt;
    let (path, offset, _) = tier.image_location(id).expect("the image exists");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    match damage {
        Damage::Truncate(n) => file.set_len(offset + n).unwrap(),
        Damage::FlipBit(bit) => {
            let at = offset + bit / 8;
            let mut byte = [0u8];
            file.read_exact_at(&mut byte, at).unwrap();
            byte[0] ^= 1 << (bit % 8);
            file.write_all_at(&byte, at).unwrap();
        }
    }
}

/// Applies `damage` to an image's bytes (for the S3 tests: the `s3` feature).
#[cfg_attr(not(feature = "s3"), allow(dead_code))]
pub fn damaged(mut image: Vec<u8>, damage: Damage) -> Vec<u8> {
    match damage {
        Damage::Truncate(n) => image.truncate(n as usize),
        Damage::FlipBit(bit) => image[(bit / 8) as usize] ^= 1 << (bit % 8),
    }
    image
}

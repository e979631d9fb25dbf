//! The tier backend trait: one trait, many backends (a directory, an
//! S3-compatible store, a fault-injecting wrapper), one conformance suite
//! (`tests/integration/conformance.rs`) that every backend passes.
//!
//! A backend stores whole object images (`format.rs`) under their ids and
//! knows nothing of the manifest or of other tiers: the engine
//! (`engine.rs`) orders writes against the manifest.

use std::fmt;

use async_trait::async_trait;
use futures_util::StreamExt;
use shoal_core::error::Result;
use shoal_core::ids::ObjectId;

use crate::format::{ObjectHeader, ObjectSizes};
use crate::identity::TierIdentity;
use crate::range::{DestRange, SourceRange};

/// Bytes a tier may hold and holds now (object images, headers included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierUsage {
    /// Bytes of images the tier may hold, as configured (`u64::MAX` for an
    /// S3 tier given no limit). A put past it fails `StoreFull` at once.
    pub capacity: u64,
    /// Bytes of images held now, header + payload each. A directory tier
    /// counts a packed image, dead or not, until its segment is removed or
    /// compacted, and is short until it has summed what it found at open
    /// (`DirTier::wait_counted`).
    pub used: u64,
    /// Images held now: one per object id, live ones only.
    pub objects: u64,
}

/// Puts of a batch run at once by the default [`Tier::put_batch`].
const PUT_BATCH_PARALLEL: usize = 4;

/// One image of a [`Tier::put_batch`].
#[derive(Debug)]
pub struct PutItem {
    /// The id the image is stored under; distinct within one batch.
    pub id: ObjectId,
    /// Data and metadata sizes, which the header records; `src` is exactly
    /// their sum long.
    pub sizes: ObjectSizes,
    /// The payload (data then metadata), read in place from memory.
    pub src: SourceRange,
}

/// A storage tier below memory.
///
/// Contract, checked by the conformance suite:
/// - `put` is durable when it returns `Ok`: the image is complete under its
///   final name and survives a crash (files fsync'ed and renamed, their
///   directory fsync'ed; an S3 PUT acknowledged). A `put` that fails or is
///   cancelled leaves either no image or the previous one, never a partial one
///   under the final name. A `put` over an existing id replaces it.
/// - A `put` that would exceed the capacity fails at once with `StoreFull`
///   (also when the medium itself runs out of space); it is never retried
///   here. Errors of the medium are `Io`; an unreachable remote store is
///   `NodeUnavailable`.
/// - `get` fills `dst` with the payload only after checking the header
///   against `id` and `dst.len()`, and verifies the payload's checksum:
///   a mismatch, a truncated or a damaged image is `ObjectCorrupt`, a missing
///   one `ObjectNotFound`.
/// - `delete` of a missing id is `Ok(false)`.
/// - `list` returns the ids of the complete images (never in-flight ones).
/// - Operations on one id are not run concurrently by the engine; operations
///   on different ids may be.
#[async_trait]
pub trait Tier: Send + Sync + fmt::Debug {
    /// A short human name for errors and `shoal stat` (a path, a URL).
    fn describe(&self) -> String;

    /// Capacity and current use, from the tier's own accounting.
    fn usage(&self) -> TierUsage;

    /// Stores `src` (data then metadata, `sizes` long) durably as `id`.
    /// Returns the header written, whose `checksum` the manifest records.
    async fn put(&self, id: ObjectId, sizes: ObjectSizes, src: SourceRange)
        -> Result<ObjectHeader>;

    /// Stores several images (distinct ids), each with `put`'s contract, and
    /// returns their outcomes in order. Backends that can make a batch
    /// durable with one sync pass override this (the directory tier: one
    /// fsync wave, one fsync per directory); the default runs the puts a few
    /// at a time.
    async fn put_batch(&self, items: Vec<PutItem>) -> Vec<Result<ObjectHeader>> {
        futures_util::stream::iter(items)
            .map(|item| self.put(item.id, item.sizes, item.src))
            .buffered(PUT_BATCH_PARALLEL)
            .collect()
            .await
    }

    /// Reads the payload of `id` into `dst`, whose length must be the object's
    /// payload length, verifying header and checksum. The range comes back
    /// (whatever the outcome) so a failed read can be retried on another tier.
    async fn get(&self, id: ObjectId, dst: DestRange) -> (DestRange, Result<ObjectHeader>);

    /// Reads and checks the whole image of `id` without keeping the payload:
    /// what recovery runs before adopting a file it has no record of.
    async fn verify(&self, id: ObjectId) -> Result<ObjectHeader>;

    /// The header of `id`'s image, checked (its own checksum, the id, the
    /// image's length) without reading the payload: what an adoption trusts
    /// (the payload's checksum is verified by every `get`). The default
    /// reads the whole image (`verify`).
    async fn header(&self, id: ObjectId) -> Result<ObjectHeader> {
        self.verify(id).await
    }

    /// Removes `id`'s image; `Ok(false)` if there was none.
    async fn delete(&self, id: ObjectId) -> Result<bool>;

    /// The ids of every complete image on the tier.
    async fn list(&self) -> Result<Vec<ObjectId>>;

    /// Who the tier's marker says owns it (and who adopted it, if anyone):
    /// read again from the medium. `None` for a tier without one (a test's).
    async fn marker(&self) -> Result<Option<TierIdentity>> {
        Ok(None)
    }

    /// Marks the tier's owner as stopped cleanly (`true`: it is expected
    /// back, so no other node adopts the tier), or clears the mark at its
    /// start. Durable when it returns. The default (a tier without a
    /// marker) does nothing.
    async fn mark_stopped(&self, _stopped: bool) -> Result<()> {
        Ok(())
    }

    /// Removes what an interrupted `put` may have left (temporary files,
    /// unfinished uploads); run by recovery before anything else. Returns how
    /// many leftovers it removed.
    async fn sweep(&self) -> Result<u64>;
}

//! The S3 client behind [`S3Tier`], through the `object_store` crate (with
//! reqwest, rustls and the rest: a fifth of an extension build's compile time
//! before it became the `s3` feature).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, PutPayload, RetryConfig};
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ObjectId;

use super::config::S3Config;
use crate::format::{check_destination, checksum_mismatch, ObjectHeader, ObjectSizes, HEADER_LEN};
use crate::identity::{Adoption, TierIdentity};
use crate::range::{DestRange, SourceRange};
use crate::tier::{Tier, TierUsage};

/// The owner marker's key under the prefix (`identity.rs`).
const MARKER: &str = "shoal-tier.id";
/// Beside the marker while the owner is stopped cleanly (see `Tier::mark_stopped`).
const STOPPED: &str = "shoal-tier.stopped";

impl S3Tier {
    /// Whether the owner's clean stop is marked.
    async fn is_stopped(&self) -> Result<bool> {
        let inner = &self.inner;
        match inner.store.head(&inner.key(STOPPED)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(inner.error("read the stop mark", e)),
        }
    }
}

/// Whose tier [`S3Tier::connect`] opens.
#[derive(Clone, Copy)]
enum Claim<'a> {
    /// This node's own (or a new, empty prefix made its own).
    Own(&'a TierIdentity),
    /// A removed node's, for the adopter named in the identity; the
    /// predicate says which nodes are members.
    Adopt(&'a TierIdentity, &'a (dyn Fn(Option<u32>) -> bool + Sync)),
}

/// A tier in an S3 bucket. Cheap to clone.
#[derive(Clone)]
pub struct S3Tier {
    inner: Arc<Inner>,
}

struct Inner {
    store: AmazonS3,
    prefix: String,
    describe: String,
    capacity: u64,
    used: AtomicU64,
    objects: AtomicU64,
}

impl std::fmt::Debug for S3Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3Tier({})", self.inner.describe)
    }
}

impl S3Tier {
    /// Connects, checks (or writes) the owner marker, and counts what the tier
    /// holds. Refuses a prefix owned by another node or cluster, and a
    /// non-empty prefix without a marker.
    pub async fn open(config: S3Config, owner: &TierIdentity) -> Result<Self> {
        Self::connect(config, Claim::Own(owner)).await
    }

    /// Opens another node's tier for `adopter` (`adopter.adopted_by` names
    /// it) once that node was removed from the cluster: the prefix must hold
    /// that node's marker, adopted by this adopter already or by one
    /// `may_take` accepts ([`TierIdentity::adoption`]); the marker is rewritten to name the
    /// adopter before this returns. A prefix without a marker is
    /// `ObjectNotFound`.
    pub async fn adopt(
        config: S3Config,
        adopter: &TierIdentity,
        may_take: impl Fn(Option<u32>) -> bool + Sync,
    ) -> Result<Self> {
        Self::connect(config, Claim::Adopt(adopter, &may_take)).await
    }

    async fn connect(config: S3Config, claim: Claim<'_>) -> Result<Self> {
        let describe = format!("{}/{}/{}", config.endpoint, config.bucket, config.prefix);
        let store = AmazonS3Builder::new()
            .with_endpoint(&config.endpoint)
            .with_bucket_name(&config.bucket)
            .with_access_key_id(&config.access_key)
            .with_secret_access_key(&config.secret_key)
            .with_region(&config.region)
            .with_retry(retry(&config))
            // The client options hold allow_http too: set them together.
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(config.allow_http)
                    .with_connect_timeout(config.connect_timeout),
            )
            .build()
            .map_err(|e| ShoalError::invalid(format!("S3 tier {describe}: {e}")))?;
        let tier = Self {
            inner: Arc::new(Inner {
                store,
                prefix: config.prefix,
                describe,
                capacity: config.capacity,
                used: AtomicU64::new(0),
                objects: AtomicU64::new(0),
            }),
        };
        let inner = &tier.inner;
        match (inner.read_marker().await?, claim) {
            (Some(found), Claim::Own(owner)) => {
                owner.check(&found, &inner.describe)?;
                tier.mark_stopped(false).await?;
            }
            (Some(found), Claim::Adopt(adopter, may_take)) => {
                if found.adopted_by.is_none() && tier.is_stopped().await? {
                    return Err(found.stopped_cleanly(&inner.describe));
                }
                if adopter.adoption(&found, &inner.describe, may_take)? == Adoption::TakeOver {
                    inner.write_marker(adopter).await?;
                }
            }
            (None, Claim::Adopt(..)) => {
                return Err(ShoalError::new(
                    ErrorKind::ObjectNotFound,
                    format!("no shoal tier at {} (no {MARKER})", inner.describe),
                ));
            }
            (None, Claim::Own(owner)) => {
                let prefix = (!inner.prefix.is_empty()).then(|| Path::from(inner.prefix.as_str()));
                let mut listing = inner.store.list(prefix.as_ref());
                if let Some(first) = listing.next().await {
                    let first = first.map_err(|e| inner.error("list", e))?;
                    return Err(ShoalError::invalid(format!(
                        "S3 tier {} is not empty ({}) and has no {MARKER}: \
                         refusing to use a prefix shoal did not make",
                        inner.describe, first.location
                    )));
                }
                inner.write_marker(owner).await?;
            }
        }
        let (mut used, mut objects) = (0, 0);
        let mut listing = inner.store.list(Some(&inner.key("objects")));
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|e| inner.error("list", e))?;
            if inner.id_of(&meta.location).is_some() {
                used += meta.size;
                objects += 1;
            }
        }
        inner.used.store(used, Ordering::Release);
        inner.objects.store(objects, Ordering::Relaxed);
        Ok(tier)
    }

    /// The key of `id`'s image (for tests that damage images on purpose).
    pub fn object_key(&self, id: &ObjectId) -> Path {
        self.inner.object_key(id)
    }

    /// The underlying store (for tests and tools).
    pub fn store(&self) -> &AmazonS3 {
        &self.inner.store
    }
}

/// [`S3Config`]'s retries as `object_store` takes them.
fn retry(config: &S3Config) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: config.init_backoff,
            max_backoff: config.max_backoff,
            base: 2.0,
        },
        max_retries: config.max_retries,
        retry_timeout: config.retry_timeout,
    }
}

impl Inner {
    fn key(&self, name: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(name)
        } else {
            Path::from(format!("{}/{name}", self.prefix))
        }
    }

    fn object_key(&self, id: &ObjectId) -> Path {
        self.key(&format!("objects/{}", id.to_hex()))
    }

    /// The owner marker, `None` where the prefix has none.
    async fn read_marker(&self) -> Result<Option<TierIdentity>> {
        let key = self.key(MARKER);
        let found = match self.store.get(&key).await {
            Ok(found) => found,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.error("read marker", e)),
        };
        let bytes = found
            .bytes()
            .await
            .map_err(|e| self.error("read marker", e))?;
        TierIdentity::decode(&String::from_utf8_lossy(&bytes), key.as_ref()).map(Some)
    }

    async fn write_marker(&self, identity: &TierIdentity) -> Result<()> {
        let payload = PutPayload::from(identity.encode()?.into_bytes());
        self.store
            .put(&self.key(MARKER), payload)
            .await
            .map(drop)
            .map_err(|e| self.error("write marker", e))
    }

    /// The id a key names, exactly as `object_key` writes it (lower-case).
    fn id_of(&self, key: &Path) -> Option<ObjectId> {
        let name = key.filename()?;
        ObjectId::from_hex(name).filter(|id| id.to_hex() == name)
    }

    /// `object_store` errors to kinds: a missing key is `ObjectNotFound`,
    /// configuration and permission problems are `Io`, and the rest
    /// (connection refused, timeouts, 5xx after retries) `NodeUnavailable`.
    fn error(&self, context: &str, err: object_store::Error) -> ShoalError {
        let kind = match &err {
            object_store::Error::NotFound { .. } => ErrorKind::ObjectNotFound,
            object_store::Error::Generic { .. } => ErrorKind::NodeUnavailable,
            _ => ErrorKind::Io,
        };
        ShoalError::new(kind, format!("S3 tier {}: {context}: {err}", self.describe))
    }

    fn reserve(&self, bytes: u64) -> Result<()> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes)
                    .filter(|&total| total <= self.capacity)
            })
            .map(drop)
            .map_err(|used| {
                ShoalError::new(
                    ErrorKind::StoreFull,
                    format!(
                        "S3 tier {}: {bytes} bytes do not fit ({used} of {} used)",
                        self.describe, self.capacity
                    ),
                )
            })
    }

    fn unreserve(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// The size of `key`'s object, `None` if there is none.
    async fn size_of(&self, key: &Path) -> Result<Option<u64>> {
        match self.store.head(key).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(&format!("head {key}"), e)),
        }
    }

    /// Streams `id`'s image, checking the header against `id` and the length,
    /// and hands each payload chunk to `sink`. Returns the header and the
    /// payload's computed checksum.
    async fn read_image(
        &self,
        id: &ObjectId,
        mut sink: impl FnMut(u64, &[u8]) -> Result<()>,
        expect_len: Option<u64>,
    ) -> Result<ObjectHeader> {
        let key = self.object_key(id);
        let what = format!("{}:{key}", self.describe);
        let result = self
            .store
            .get(&key)
            .await
            .map_err(|e| self.error(&format!("get {key}"), e))?;
        let size = result.meta.size;
        let mut stream = result.into_stream();
        let mut head = Vec::with_capacity(HEADER_LEN);
        let mut header: Option<ObjectHeader> = None;
        let (mut offset, mut crc) = (0u64, 0u32);
        while let Some(chunk) = stream.next().await {
            let mut chunk: Bytes = chunk.map_err(|e| self.error(&format!("read {key}"), e))?;
            if header.is_none() {
                let need = (HEADER_LEN - head.len()).min(chunk.len());
                head.extend_from_slice(&chunk.split_to(need));
                if head.len() < HEADER_LEN {
                    continue;
                }
                let decoded = ObjectHeader::decode(&head, &what)?;
                check_header(&decoded, id, size, &what)?;
                if let Some(len) = expect_len {
                    check_destination(id, len, decoded.payload_len())?;
                }
                header = Some(decoded);
            }
            if chunk.is_empty() {
                continue;
            }
            let payload_len = header.expect("decoded above").payload_len();
            if offset + chunk.len() as u64 > payload_len {
                return Err(ShoalError::new(
                    ErrorKind::ObjectCorrupt,
                    format!("{what}: longer than its header says"),
                ));
            }
            crc = crc32c::crc32c_append(crc, &chunk);
            sink(offset, &chunk)?;
            offset += chunk.len() as u64;
        }
        let header = match header {
            Some(header) => header,
            None => ObjectHeader::decode(&head, &what)?, // fails: too short
        };
        if offset != header.payload_len() {
            return Err(ShoalError::new(
                ErrorKind::ObjectCorrupt,
                format!(
                    "{what}: truncated ({offset} of {} payload bytes)",
                    header.payload_len()
                ),
            ));
        }
        if crc != header.checksum {
            return Err(checksum_mismatch(&what, header.checksum, crc));
        }
        Ok(header)
    }
}

fn check_header(header: &ObjectHeader, id: &ObjectId, size: u64, what: &str) -> Result<()> {
    if header.id != *id {
        return Err(ShoalError::new(
            ErrorKind::ObjectCorrupt,
            format!("{what}: holds object {} instead", header.id),
        ));
    }
    if size != header.stored_len() {
        return Err(ShoalError::new(
            ErrorKind::ObjectCorrupt,
            format!(
                "{what}: {size} bytes, the header says {}",
                header.stored_len()
            ),
        ));
    }
    Ok(())
}

#[async_trait]
impl Tier for S3Tier {
    fn describe(&self) -> String {
        self.inner.describe.clone()
    }

    fn usage(&self) -> TierUsage {
        TierUsage {
            capacity: self.inner.capacity,
            used: self.inner.used.load(Ordering::Acquire),
            objects: self.inner.objects.load(Ordering::Relaxed),
        }
    }

    async fn put(
        &self,
        id: ObjectId,
        sizes: ObjectSizes,
        src: SourceRange,
    ) -> Result<ObjectHeader> {
        let inner = &self.inner;
        if src.len() as u64 != sizes.payload_len() {
            return Err(ShoalError::invalid(format!(
                "object {id}: source range of {} bytes for {} + {} bytes",
                src.len(),
                sizes.data_size,
                sizes.meta_size
            )));
        }
        let stored = HEADER_LEN as u64 + sizes.payload_len();
        inner.reserve(stored)?;
        let key = inner.object_key(&id);
        let result = async {
            let replaced = inner.size_of(&key).await?;
            let header = ObjectHeader {
                id,
                data_size: sizes.data_size,
                meta_size: sizes.meta_size,
                checksum: crc32c::crc32c(src.as_slice()),
            };
            let payload: PutPayload = [
                Bytes::copy_from_slice(&header.encode()),
                Bytes::from_owner(src),
            ]
            .into_iter()
            .collect();
            inner
                .store
                .put(&key, payload)
                .await
                .map_err(|e| inner.error(&format!("put {key}"), e))?;
            Ok((header, replaced))
        }
        .await;
        match result {
            Ok((header, replaced)) => {
                match replaced {
                    Some(old) => inner.unreserve(old),
                    None => {
                        inner.objects.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(header)
            }
            Err(err) => {
                inner.unreserve(stored);
                Err(err)
            }
        }
    }

    async fn get(&self, id: ObjectId, dst: DestRange) -> (DestRange, Result<ObjectHeader>) {
        let mut dst = dst;
        let len = dst.len() as u64;
        let target = dst.as_mut_slice();
        let got = self
            .inner
            .read_image(
                &id,
                |offset, chunk| {
                    target[offset as usize..offset as usize + chunk.len()].copy_from_slice(chunk);
                    Ok(())
                },
                Some(len),
            )
            .await;
        (dst, got)
    }

    async fn verify(&self, id: ObjectId) -> Result<ObjectHeader> {
        self.inner.read_image(&id, |_, _| Ok(()), None).await
    }

    async fn delete(&self, id: ObjectId) -> Result<bool> {
        let inner = &self.inner;
        let key = inner.object_key(&id);
        let Some(size) = inner.size_of(&key).await? else {
            return Ok(false);
        };
        match inner.store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(inner.error(&format!("delete {key}"), e)),
        }
        inner.unreserve(size);
        inner.objects.fetch_sub(1, Ordering::Relaxed);
        Ok(true)
    }

    async fn list(&self) -> Result<Vec<ObjectId>> {
        let inner = &self.inner;
        let mut ids = Vec::new();
        let mut listing = inner.store.list(Some(&inner.key("objects")));
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|e| inner.error("list", e))?;
            if let Some(id) = inner.id_of(&meta.location) {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    async fn mark_stopped(&self, stopped: bool) -> Result<()> {
        let inner = &self.inner;
        let key = inner.key(STOPPED);
        let done = if stopped {
            inner
                .store
                .put(
                    &key,
                    PutPayload::from_static(b"stopped cleanly: expected back\n"),
                )
                .await
                .map(drop)
        } else {
            match inner.store.delete(&key).await {
                Err(object_store::Error::NotFound { .. }) => Ok(()),
                other => other,
            }
        };
        done.map_err(|e| inner.error("mark stopped", e))
    }

    async fn marker(&self) -> Result<Option<TierIdentity>> {
        self.inner.read_marker().await
    }

    /// PUTs are whole, so nothing half-written can exist; keys under
    /// `objects/` that are not ids are removed.
    async fn sweep(&self) -> Result<u64> {
        let inner = &self.inner;
        let mut foreign = Vec::new();
        let mut listing = inner.store.list(Some(&inner.key("objects")));
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|e| inner.error("list", e))?;
            if inner.id_of(&meta.location).is_none() {
                foreign.push(meta.location);
            }
        }
        for key in &foreign {
            inner
                .store
                .delete(key)
                .await
                .map_err(|e| inner.error(&format!("delete {key}"), e))?;
        }
        Ok(foreign.len() as u64)
    }
}

//! [`S3Tier`] in a build without the `s3` feature: a type with no values,
//! so no code path can hold one; its `open` refuses, naming the feature.

use async_trait::async_trait;
use shoal_core::error::{MissingFeature, Result};
use shoal_core::ids::ObjectId;

use super::config::S3Config;
use crate::format::{ObjectHeader, ObjectSizes};
use crate::identity::TierIdentity;
use crate::range::{DestRange, SourceRange};
use crate::tier::{Tier, TierUsage};

/// The S3 tier of a build with the `s3` feature; in this one, none exists.
#[derive(Debug, Clone)]
pub enum S3Tier {}

impl S3Tier {
    /// Refuses: this build has no S3 client.
    pub async fn open(_config: S3Config, _owner: &TierIdentity) -> Result<Self> {
        Err(MissingFeature::new("s3", "an s3:// backing store").into())
    }

    /// Refuses: this build has no S3 client.
    pub async fn adopt(
        _config: S3Config,
        _adopter: &TierIdentity,
        _may_take: impl Fn(Option<u32>) -> bool + Sync,
    ) -> Result<Self> {
        Err(MissingFeature::new("s3", "adopting an s3:// backing store").into())
    }
}

#[async_trait]
impl Tier for S3Tier {
    fn describe(&self) -> String {
        match *self {}
    }

    fn usage(&self) -> TierUsage {
        match *self {}
    }

    async fn put(&self, _: ObjectId, _: ObjectSizes, _: SourceRange) -> Result<ObjectHeader> {
        match *self {}
    }

    async fn get(&self, _: ObjectId, _: DestRange) -> (DestRange, Result<ObjectHeader>) {
        match *self {}
    }

    async fn verify(&self, _: ObjectId) -> Result<ObjectHeader> {
        match *self {}
    }

    async fn delete(&self, _: ObjectId) -> Result<bool> {
        match *self {}
    }

    async fn list(&self) -> Result<Vec<ObjectId>> {
        match *self {}
    }

    async fn sweep(&self) -> Result<u64> {
        match *self {}
    }
}

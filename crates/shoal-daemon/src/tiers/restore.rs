//! What a restore ([`Tiers::restore`](super::Tiers::restore), in
//! `restoring.rs`) comes to, and what gives it memory. A leaf: the tiers'
//! methods name these types, so this module names nothing of the tiers'.

use std::future::Future;
use std::pin::Pin;

use shoal_core::error::{Result, ShoalError};
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;
use shoal_tiers::ObjectSizes;
use tokio::sync::watch;

/// What a restore came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreOutcome {
    /// The object is in memory again: this call's restore, or the one in
    /// flight it waited for.
    Restored,
    /// Nothing to do: no tier holds it, or memory does already (or it is
    /// being written).
    NotBelow,
}

/// Where a restore's memory comes from and who hears of it: the operations
/// above the tiers in the daemon's layers implement it (`ops/restore.rs`),
/// because an allocation may wait for room, evict and borrow idle loans,
/// and a cluster's home learns where the object lives now.
pub trait RestoreTarget {
    /// An unsealed block for `id` of `sizes`, allocated for the tiers
    /// principal (`principals::TIERS`).
    fn allocate(
        &self,
        id: ObjectId,
        sizes: ObjectSizes,
    ) -> Pin<Box<dyn Future<Output = Result<ObjectLocation>> + '_>>;

    /// `id` is sealed in memory again.
    fn restored(&self, id: ObjectId) -> Pin<Box<dyn Future<Output = ()> + '_>>;
}

/// A restore in flight: its outcome, once known.
pub(super) type InFlight = watch::Receiver<Option<std::result::Result<(), ShoalError>>>;

//! What a restore ([`Tiers::restore`](super::Tiers::restore), in
//! `restoring.rs`) comes to, and what gives it memory. A leaf: the tiers'
//! methods name these types, so this module names nothing of the tiers'.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use shoal_core::error::{Result, ShoalError};
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;
use shoal_tiers::ObjectSizes;
use tokio::sync::watch;

use crate::node::Node;
use crate::principals;

/// What a restore came to.
#[derive(Clone)]
pub enum RestoreOutcome {
    /// The object is in memory again (this call's restore, or the one in
    /// flight it waited for), and stays there while the hold lives.
    Restored(Rc<RestoredHold>),
    /// Nothing to do: no tier holds it, or memory does already (or it is
    /// being written).
    NotBelow,
}

/// A restored object kept in memory for the callers that waited for its
/// restore: the tiers principal's reference from its seal, released when
/// the last of them drops the hold. A caller takes its own reference first
/// (a get), so another allocation cannot evict the object between the
/// restore's seal and the caller's reference, which would send a get
/// back to the tier forever under pressure or answer a `timeout_ms=0` get
/// with "not found" for an object that exists.
///
/// Drop it outside [`Node::mutate`] (it releases through it).
pub struct RestoredHold {
    node: Rc<Node>,
    id: ObjectId,
}

impl RestoredHold {
    /// Takes over the reference the tiers principal kept at `id`'s seal.
    pub(super) fn new(node: Rc<Node>, id: ObjectId) -> Self {
        Self { node, id }
    }
}

impl Drop for RestoredHold {
    fn drop(&mut self) {
        // Deleted meanwhile: the reference went with it.
        let _ = self.node.mutate(|s| s.release(principals::TIERS, &self.id));
    }
}

/// Where a restore's memory comes from and who hears of it: the operations
/// above the tiers in the daemon's layers implement it (`ops/restore.rs`),
/// because an allocation may wait for room, evict and borrow idle loans,
/// and a cluster's home learns where the object lives now.
pub trait RestoreTarget {
    /// An unsealed block for `id` of `sizes`, allocated for the tiers
    /// principal (`principals::TIERS`), waiting up to `wait_ms` for others
    /// to leave memory.
    fn allocate(
        &self,
        id: ObjectId,
        sizes: ObjectSizes,
        wait_ms: u32,
    ) -> Pin<Box<dyn Future<Output = Result<ObjectLocation>> + '_>>;

    /// `id` is sealed in memory again.
    fn restored(&self, id: ObjectId) -> Pin<Box<dyn Future<Output = ()> + '_>>;
}

/// A restore in flight: its outcome, once known.
pub(super) type InFlight =
    watch::Receiver<Option<std::result::Result<Rc<RestoredHold>, ShoalError>>>;

//! What lies below the node's memory: the tiers keep objects that left it.
//! The node knows only this trait, so the layers above it (the cluster)
//! can tell "evicted and gone" from "evicted down a tier" without knowing
//! the tiers.

use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

pub trait Below {
    /// Whether a tier below memory holds `id` (a durable copy, or one being
    /// restored): the object still exists on this node.
    fn holds(&self, id: &ObjectId) -> bool;

    /// Every object held below and not in memory, with its sizes (the
    /// offset is meaningless: 0), for a cluster's directory rebuild.
    fn held_only_below(&self) -> Vec<(ObjectId, ObjectLocation)>;
}

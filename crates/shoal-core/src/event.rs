//! What happens to an object that others hear of: the one event type the
//! store emits, the daemon's node hands to its listeners (tiers, cluster,
//! prefetch, metrics) and subscribers receive over the wire
//! (`Reply::Notification`).

use crate::ids::ObjectId;

/// One change to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectEvent {
    /// Sealed: readable from now on, with these sizes.
    Sealed {
        /// The object sealed.
        id: ObjectId,
        /// Bytes of data, not counting metadata.
        data_size: u64,
        /// Bytes of metadata, stored right after the data.
        meta_size: u32,
    },
    /// A sealed object left memory: `deleted` by a delete (its memory freed
    /// when the last reference goes; in a cluster its caller unregisters
    /// the id), else evicted (down a tier if one takes it, else gone). Each
    /// sealed object is removed once.
    Removed {
        /// The object that left.
        id: ObjectId,
        /// True for a delete (notification kind 3), false for an eviction (kind 2).
        deleted: bool,
    },
    /// An unsealed object went: aborted, or its creator disconnected.
    /// Subscribers never saw it and are not told; a cluster node
    /// unregisters the id.
    Aborted {
        /// The unsealed object that went.
        id: ObjectId,
    },
}

impl ObjectEvent {
    /// The object it is about.
    pub fn id(&self) -> ObjectId {
        match self {
            Self::Sealed { id, .. } | Self::Removed { id, .. } | Self::Aborted { id } => *id,
        }
    }

    /// Whether subscribers hear of it (they see sealed objects only).
    pub fn is_for_subscribers(&self) -> bool {
        !matches!(self, Self::Aborted { .. })
    }
}

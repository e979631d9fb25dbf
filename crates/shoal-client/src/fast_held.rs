//! A reference the fast path took (fast.rs): a leaf, so that `Client` can
//! keep them without a cycle.

use std::sync::Arc;

use shoal_core::fast_path::readers::FastReads;

/// A reference taken without a round trip: counted at an index position in
/// this client's table at its own node (`table` `None`) or at an owner.
pub(crate) struct FastHeld {
    /// The owner's table, `None` for this node's.
    pub(crate) table: Option<Arc<FastReads>>,
    /// The index position counted.
    pub(crate) position: u32,
}

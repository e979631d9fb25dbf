//! What a `Subscribe`d connection is told: an object sealed or removed.

use crate::ids::ObjectId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notification {
    Sealed {
        id: ObjectId,
        data_size: u64,
        meta_size: u32,
    },
    Removed {
        id: ObjectId,
    },
}

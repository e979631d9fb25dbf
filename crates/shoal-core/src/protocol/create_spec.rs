//! One object a `Create` or `CreateOn` asks for: its id and sizes.

use crate::ids::ObjectId;

/// One object a `Create` or `CreateOn` asks for (a 32-byte entry on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSpec {
    /// The new object's id: a create of an id this node already holds fails `ObjectExists`.
    pub id: ObjectId,
    /// Bytes of data; the block is padded to whole lines, and is at least one line.
    pub data_size: u64,
    /// Bytes of metadata, placed right after the data in the same block.
    pub meta_size: u32,
}

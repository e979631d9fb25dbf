//! One object a `Create` or `CreateOn` asks for: its id and sizes.

use crate::ids::ObjectId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSpec {
    pub id: ObjectId,
    pub data_size: u64,
    pub meta_size: u32,
}

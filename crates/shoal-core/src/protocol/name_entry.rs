//! A name of the POSIX view as `Named` and `Names` answer it, and its
//! wire form (one layout for both replies).

use crate::error::Result;
use crate::ids::ObjectId;

use super::codec::{Reader, Writer};

/// An object's name and what a file listing shows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameEntry {
    pub name: String,
    pub id: ObjectId,
    pub data_size: u64,
    pub meta_size: u32,
    /// When the name was bound to this object (its seal), ms since the epoch.
    pub mtime_ms: u64,
}

pub(super) fn encode_name_entry(w: &mut Writer, e: &NameEntry) {
    w.id(&e.id)
        .u64(e.data_size)
        .u32(e.meta_size)
        .u64(e.mtime_ms)
        .str(&e.name);
}

pub(super) fn decode_name_entry(r: &mut Reader<'_>) -> Result<NameEntry> {
    Ok(NameEntry {
        id: r.id()?,
        data_size: r.u64()?,
        meta_size: r.u32()?,
        mtime_ms: r.u64()?,
        name: r.str()?,
    })
}

//! A name of the POSIX view as `Named` and `Names` answer it, and its
//! wire form (one layout for both replies).

use crate::error::Result;
use crate::ids::ObjectId;

use super::codec::{Reader, Writer};

/// An object's name and what a file listing shows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameEntry {
    /// The name: `/`-separated components, relative (the rules of `names::check`).
    pub name: String,
    /// The object the name is bound to.
    pub id: ObjectId,
    /// The object's bytes of data: a file's length on the mount.
    pub data_size: u64,
    /// The object's bytes of metadata.
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

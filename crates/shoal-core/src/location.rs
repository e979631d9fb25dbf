//! Where an object lives in a region and how big it is, and the blocks a
//! region is carved into.

/// Where an object lives and how big it is: what a client needs to map it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectLocation {
    /// Bytes from the start of the region of the object's node to its data (the start of its
    /// block, which the allocator places on a line boundary).
    pub offset: u64,
    /// Bytes of data, not counting metadata or padding.
    pub data_size: u64,
    /// Bytes of metadata, right after the data (at `offset + data_size`).
    pub meta_size: u32,
}

impl ObjectLocation {
    /// Bytes of data and metadata. Saturating, so a forged location whose
    /// sizes overflow fails every bounds check instead of wrapping.
    pub fn size(&self) -> u64 {
        self.data_size.saturating_add(u64::from(self.meta_size))
    }
}

/// A block of the region: `[offset, offset + len)`, both multiples of the
/// line size (an object's bytes, or space lent to a client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Where the block starts, in bytes from the start of the region.
    pub offset: u64,
    /// Its length in bytes, padding included.
    pub len: u64,
}

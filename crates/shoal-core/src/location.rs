//! Where an object lives in a region and how big it is, and the blocks a
//! region is carved into.

/// Where an object lives and how big it is: what a client needs to map it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectLocation {
    pub offset: u64,
    pub data_size: u64,
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
    pub offset: u64,
    pub len: u64,
}

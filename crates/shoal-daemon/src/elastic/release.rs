//! Gives the memory of the region's free ranges back to the kernel, so a
//! shrink frees real memory (MemAvailable rises) instead of only lowering
//! a number: the region is a tmpfs (or hugetlbfs) file, whose pages stay
//! allocated when the allocator frees a block.

use shoal_core::error::Result;

use crate::node::Node;

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pass {
    /// Bytes the region held less after the pass: the memory given back.
    /// (Not the punched ranges' length: the largest free range is usually
    /// the region's never-used tail, a hole already; counting it made the
    /// experiment report 298 GiB "given back" in 75 s.)
    pub released: u64,
    /// The region's allocated bytes after the pass.
    pub resident: u64,
}

/// Punches holes in the region's free ranges, largest first, until the
/// region holds at most `budget` bytes of memory or no free range is left.
/// Nothing when it already holds no more than `budget`.
///
/// Synchronous on the store's thread: between listing the free ranges and
/// punching them no create can take one (a hole punched under a new object
/// would zero it). Only whole pages inside a free range are released, so
/// the objects beside it keep their bytes.
pub(super) fn release_above(node: &Node, budget: u64) -> Result<Pass> {
    let region = node.region();
    let mut resident = region.resident_bytes()?;
    let mut released = 0;
    if resident <= budget {
        return Ok(Pass { released, resident });
    }
    let ranges: Vec<_> = node.read(|store| store.free_ranges().collect());
    for range in ranges {
        region.release_pages(range.offset, range.len)?;
        let after = region.resident_bytes()?;
        released += resident.saturating_sub(after);
        resident = after;
        if resident <= budget {
            break;
        }
    }
    Ok(Pass { released, resident })
}

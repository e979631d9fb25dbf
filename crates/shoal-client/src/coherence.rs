//! Non-coherent fabrics (docs/cluster.md "Coherency on non-coherent
//! fabrics"): the writer flushes an object's lines before its seal, a
//! reader on another node invalidates them before its first read; and the
//! simulated fabric, where a private copy of each region stands for the
//! caches so that a missing flush or invalidate shows as wrong bytes.

use std::sync::Arc;

use shoal_core::error::{Result, ShoalError};
use shoal_core::protocol::Located;
use shoal_core::region::Mapping;
use shoal_core::ObjectId;

impl crate::Client {
    /// Whether the cluster's fabric does not keep caches coherent.
    pub(crate) fn noncoherent(&self) -> bool {
        self.cluster.as_ref().is_some_and(|c| !c.coherent)
    }

    /// Whether this node's caches may hold stale lines of a found object, so
    /// that it must be invalidated before its first read here: only on a
    /// non-coherent fabric, for every object on another node, and for an
    /// object on our own node that a client of another node wrote (the
    /// owner's daemon flags those, [`Located::invalidate`]).
    pub fn needs_invalidate(&self, located: &Located) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| !c.coherent && (located.node != c.node || located.invalidate))
    }

    /// Checks a descriptor against the mapping it points into, before
    /// anything reads it, and drops this node's stale lines of the object
    /// when it [needs an invalidate](Self::needs_invalidate).
    pub(crate) fn check_located(&mut self, located: Located) -> Result<Located> {
        let mapping = self.peer_mapping(located.node, located.generation, false)?;
        let l = located.location;
        if !mapping.holds(&l) {
            return Err(ShoalError::protocol(format!(
                "daemon sent a descriptor outside node {}'s region: {l:?}",
                located.node
            )));
        }
        // About to be read: no page faults while the caller does (peers'
        // regions were populated whole when mapped).
        mapping.populate_on_use(l.offset, l.size(), false);
        if !self.needs_invalidate(&located) {
            return Ok(located);
        }
        if cfg!(feature = "broken-skip-owner-invalidate") && located.node == self.node() {
            // The deliberately broken build: the owner node reads a peer's
            // object through whatever its caches held of the range.
            return Ok(located);
        }
        if let Some(cache) = self.simulated_cache(&located, false)? {
            // Simulated invalidate: refill this process's copy of the range.
            copy_range(&mapping, &cache, l.offset, l.size());
            return Ok(located);
        }
        // First read after the seal on this node: drop stale lines.
        // SAFETY: bounds checked above; the range is mapped.
        unsafe {
            shoal_core::coherence::invalidate_range(
                mapping.base().add(l.offset as usize),
                l.size() as usize,
            )
        };
        Ok(located)
    }

    /// The simulated cache copy through which this process writes
    /// (`for_write`) or reads `located` (`None` unless simulating). Reads of
    /// objects that need no invalidate, i.e. objects our own node wrote, go
    /// to the region itself: a node's caches see its own writes.
    pub(crate) fn simulated_cache(
        &mut self,
        located: &Located,
        for_write: bool,
    ) -> Result<Option<Arc<Mapping>>> {
        if !for_write && !self.needs_invalidate(located) {
            return Ok(None);
        }
        let Some(cluster) = self.cluster.as_mut().filter(|c| c.simulated) else {
            return Ok(None);
        };
        let node = located.node;
        let Some(index) = cluster.index_of(node) else {
            return Err(ShoalError::protocol(format!("unknown node {node}")));
        };
        let peer = &cluster.nodes[index];
        let size = peer.region_size.max(self.info.region_size);
        let cache = lazily(&mut cluster.peers[index].cache, || Mapping::anonymous(size))?;
        Ok(Some(cache))
    }

    /// Writes back now what [`seal`](Self::seal) would write back for these
    /// objects (every line of each one this client created and has not
    /// sealed, on a non-coherent fabric; nothing on a coherent one) and
    /// returns how many bytes that covered.
    ///
    /// A diagnostic hook: it lets a benchmark time the cache write-back apart
    /// from the seal message. The seal then does not flush these objects
    /// again, so nothing may be written to them in between (such writes could
    /// stay in this CPU's cache past the seal).
    pub fn flush_unsealed(&mut self, ids: &[ObjectId]) -> u64 {
        self.flush_written(ids)
    }

    /// On a non-coherent fabric the writer's dirty lines must reach memory
    /// before the seal (or the free of an aborted object) is announced.
    /// Returns the bytes flushed.
    pub(crate) fn flush_written(&mut self, ids: &[ObjectId]) -> u64 {
        let mut flushed = 0;
        if !self.noncoherent() {
            return flushed;
        }
        for id in ids {
            if let Some(located) = self.unsealed.remove(id) {
                if cfg!(feature = "broken-skip-flush") {
                    // The deliberately broken build: the seal overtakes the data.
                    continue;
                }
                let (node, l) = (located.node, located.location);
                // Not if the node restarted since: the object went with its
                // old region, and the new one must not get these bytes.
                let Ok(mapping) = self.peer_mapping(node, located.generation, true) else {
                    continue;
                };
                flushed += l.size();
                if let Ok(Some(cache)) = self.simulated_cache(&located, true) {
                    // Simulated flush: the written lines reach the region.
                    copy_range(&cache, &mapping, l.offset, l.size());
                    continue;
                }
                // SAFETY: the location was bounds-checked against this mapping at create.
                unsafe {
                    shoal_core::coherence::flush_range(
                        mapping.base().add(l.offset as usize),
                        l.size() as usize,
                    )
                };
            }
        }
        flushed
    }
}

/// Copies `len` bytes at `offset` between two mappings of the same size class.
fn copy_range(from: &Mapping, to: &Mapping, offset: u64, len: u64) {
    if len == 0 || !from.contains(offset, len) || !to.contains(offset, len) {
        return;
    }
    // SAFETY: both ranges are inside their mappings (checked above); the
    // mappings are distinct, so the ranges do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            from.base().add(offset as usize),
            to.base().add(offset as usize),
            len as usize,
        )
    }
}

/// The mapping in `slot`, made by `map` on first use.
fn lazily(
    slot: &mut Option<Arc<Mapping>>,
    map: impl FnOnce() -> Result<Mapping>,
) -> Result<Arc<Mapping>> {
    if let Some(mapping) = slot {
        return Ok(mapping.clone());
    }
    let mapping = Arc::new(map()?);
    *slot = Some(mapping.clone());
    Ok(mapping)
}

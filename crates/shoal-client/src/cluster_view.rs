//! The cluster as this client sees it: which node its daemon is, the peers'
//! regions, and what this process maps of each (read-only, writable, one
//! generation at a time). A leaf: the client's methods over it are
//! cluster.rs's, so `Client` can hold a view without a cycle.

use std::path::Path;
use std::sync::Arc;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::protocol::PeerRegion;
use shoal_core::region::Mapping;

/// The cluster as this client sees it: which node its daemon is, and the
/// peers' regions it maps (read-only) when a get returns objects there.
pub struct ClusterView {
    /// This client's daemon's node number.
    pub node: u32,
    /// Whether the fabric is cache-coherent (else seals flush and reads
    /// invalidate: docs/cluster.md).
    pub coherent: bool,
    /// The cluster's identity (`ClusterInfo`): equal for clients of nodes
    /// of one cluster, different for any other.
    pub identity: String,
    /// How the daemon's traffic with its peers is protected (`ClusterInfo`).
    pub encryption: String,
    /// Every node's region, as the daemon reported them at connect.
    pub nodes: Vec<PeerRegion>,
    /// Simulated non-coherent fabric: this process's private "cache" copy of
    /// each node's region. Writes of new objects go to the copy and reach the
    /// region only when flushed; reads of objects that need an invalidate
    /// (see [`crate::Client::needs_invalidate`]) come from the copy, refreshed
    /// only by that invalidate. A missing flush or invalidate shows as wrong
    /// bytes, as it would on the hardware.
    ///
    /// Our own node's copy stands for that node's caches, shared by all its
    /// processes in reality: it holds what this process wrote there (a
    /// flush keeps the lines, as CLWB does) and what it read of objects other
    /// nodes wrote there. Objects our node wrote are read from the region
    /// itself: a node's caches see its own writes, so those reads cost
    /// nothing extra and need no invalidate.
    pub simulated: bool,
    /// Per node, what this process maps of its region.
    pub(crate) peers: Vec<PeerMaps>,
}

impl ClusterView {
    /// The view of a cluster the daemon described, nothing mapped yet.
    pub(crate) fn new(
        node: u32,
        coherent: bool,
        simulated: bool,
        identity: String,
        nodes: Vec<PeerRegion>,
    ) -> Self {
        Self {
            node,
            coherent,
            identity,
            encryption: String::new(),
            simulated,
            peers: nodes.iter().map(|_| PeerMaps::default()).collect(),
            nodes,
        }
    }

    /// Where node `node` is in `nodes` (and `peers`): node ids may have
    /// gaps with a membership, and members join after the client connected.
    pub(crate) fn index_of(&self, node: u32) -> Option<usize> {
        match self.nodes.get(node as usize) {
            Some(p) if p.node == node => Some(node as usize),
            _ => self.nodes.iter().position(|p| p.node == node),
        }
    }

    /// Takes the daemon's newer list of nodes: members that joined since
    /// are added; a node whose region moved (another path or size: it came
    /// back on another host) loses what was mapped of the old one.
    pub(crate) fn update(&mut self, nodes: Vec<PeerRegion>) {
        for region in nodes {
            match self.index_of(region.node) {
                Some(at) => {
                    let old = &self.nodes[at];
                    if old.path != region.path || old.region_size != region.region_size {
                        self.peers[at] = PeerMaps::default();
                    }
                    self.nodes[at] = region;
                }
                None => {
                    self.nodes.push(region);
                    self.peers.push(PeerMaps::default());
                }
            }
        }
    }
}

/// One node's region as this process maps it, all of one generation (the
/// incarnation of the node's daemon that made the region file). A node that
/// restarts makes a new file: descriptors then name the new generation and
/// everything mapped of the old one is replaced (buffers still pointing into
/// it keep their `Arc`).
#[derive(Default)]
pub(crate) struct PeerMaps {
    /// 0 until something is mapped.
    generation: u64,
    /// Read-only, mapped on the first object found on the node.
    readonly: Option<Arc<Mapping>>,
    /// Writable, for objects this client allocates on the node.
    writable: Option<Arc<Mapping>>,
    /// The simulated fabric's cache copy of the region.
    pub(crate) cache: Option<Arc<Mapping>>,
}

impl PeerMaps {
    /// The mapping (read-only, or writable with `write`) of node `node`'s
    /// region at `path` in generation `generation`; see `Client::peer_mapping`.
    pub(crate) fn resolve(
        &mut self,
        node: u32,
        path: &Path,
        size: u64,
        generation: u64,
        write: bool,
    ) -> Result<Arc<Mapping>> {
        let slot = if write {
            &self.writable
        } else {
            &self.readonly
        };
        if let Some(mapping) = slot.as_ref().filter(|m| m.generation() == generation) {
            return Ok(mapping.clone());
        }
        if self.generation != 0 && self.generation != generation {
            // Unchanged file (the node has not restarted since we mapped
            // it): the descriptor is the stale one. No file: the region is
            // gone with its node. Either way, never read it.
            let now = shoal_core::region::file_generation(path, size).unwrap_or(0);
            if now == self.generation || now == 0 {
                return Err(stale_descriptor(node, generation));
            }
        }
        let fresh = Arc::new(if write {
            Mapping::map_path_writable(path, size)?
        } else {
            Mapping::map_path_readonly(path, size)?
        });
        if fresh.generation() != self.generation {
            // A new region (the node restarted, or a first mapping): drop
            // every mapping and cache of the previous one.
            *self = Self {
                generation: fresh.generation(),
                ..Self::default()
            };
        }
        if write {
            self.writable = Some(fresh.clone());
        } else {
            self.readonly = Some(fresh.clone());
        }
        if fresh.generation() != generation {
            return Err(stale_descriptor(node, generation));
        }
        Ok(fresh)
    }
}

/// A descriptor of a region generation the node's file no longer carries.
fn stale_descriptor(node: u32, generation: u64) -> ShoalError {
    ShoalError::new(
        ErrorKind::ObjectNotFound,
        format!(
            "object on node {node}'s region of generation {generation}, which is gone \
             (the node restarted)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_core::region::Region;

    const LEN: u64 = 1 << 16;

    fn byte(mapping: &Mapping) -> u8 {
        // SAFETY: offset 100 is inside every 64 KiB mapping of these tests.
        unsafe { *mapping.base().add(100) }
    }

    #[test]
    fn a_restarted_peer_is_mapped_anew_and_stale_descriptors_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n1");
        let first = Region::create_shared(&path, LEN, 7).unwrap();
        // SAFETY: inside the region.
        unsafe { *first.base().add(100) = 1 };
        let mut maps = PeerMaps::default();
        let old = maps.resolve(1, &path, LEN, 7, false).unwrap();
        assert_eq!((old.generation(), byte(&old)), (7, 1));
        let old_writable = maps.resolve(1, &path, LEN, 7, true).unwrap();
        maps.cache = Some(Arc::new(Mapping::anonymous(LEN).unwrap()));
        assert!(Arc::ptr_eq(
            &maps.resolve(1, &path, LEN, 7, false).unwrap(),
            &old
        ));
        // A descriptor of a generation the file never had is refused, and
        // nothing is remapped for it.
        let err = maps.resolve(1, &path, LEN, 8, false).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
        assert!(Arc::ptr_eq(
            &maps.resolve(1, &path, LEN, 7, false).unwrap(),
            &old
        ));

        // The node dies (its region is not dropped) and restarts: new file.
        std::mem::forget(first);
        let second = Region::create_shared(&path, LEN, 9).unwrap();
        // SAFETY: inside the region.
        unsafe { *second.base().add(100) = 2 };
        // A descriptor the old incarnation made reads the old file only.
        assert!(Arc::ptr_eq(
            &maps.resolve(1, &path, LEN, 7, false).unwrap(),
            &old
        ));
        // The new generation's descriptor remaps; everything of the old
        // region is dropped here (buffers keep their own Arc).
        let new = maps.resolve(1, &path, LEN, 9, false).unwrap();
        assert_eq!((new.generation(), byte(&new)), (9, 2));
        assert_eq!(maps.generation, 9);
        assert!(maps.writable.is_none() && maps.cache.is_none());
        assert_eq!(byte(&old), 1, "the old mapping stays valid while held");
        // From now on the old generation's descriptors are refused.
        let err = maps.resolve(1, &path, LEN, 7, false).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
        let err = maps.resolve(1, &path, LEN, 7, true).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
        assert_eq!(
            maps.resolve(1, &path, LEN, 9, true).unwrap().generation(),
            9
        );
        drop(old_writable);

        // A descriptor newer than the file we see (made after yet another
        // restart we have not seen the file of) is refused, never guessed.
        drop(second);
        let err = maps.resolve(1, &path, LEN, 11, false).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
    }
}

//! Other nodes of a cluster: the view this client has of them, their
//! regions mapped here (read-only, writable, one generation at a time),
//! remote allocation, and where a found or created object is in this
//! process. Caches on non-coherent fabrics are coherence.rs's.

use std::path::Path;
use std::sync::Arc;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::location::ObjectLocation;
use shoal_core::protocol::{CreateSpec, Located, PeerRegion, Reply, Request};
use shoal_core::region::Mapping;

use crate::channel::unexpected;

/// The cluster as this client sees it: which node its daemon is, and the
/// peers' regions it maps (read-only) when a get returns objects there.
pub struct ClusterView {
    /// This client's daemon's node number.
    pub node: u32,
    /// Whether the fabric is cache-coherent (else seals flush and reads
    /// invalidate: docs/cluster.md).
    pub coherent: bool,
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
    pub(crate) fn new(node: u32, coherent: bool, simulated: bool, nodes: Vec<PeerRegion>) -> Self {
        Self {
            node,
            coherent,
            simulated,
            peers: nodes.iter().map(|_| PeerMaps::default()).collect(),
            nodes,
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
    fn resolve(
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

impl crate::Client {
    /// The cluster, if the daemon is a cluster node.
    pub fn cluster(&self) -> Option<&ClusterView> {
        self.cluster.as_ref()
    }

    /// The cluster's nodes as the daemon sees them now; `alive` means the
    /// node answers its heartbeats (a partition or a dead node shows as
    /// `false` once a heartbeat has gone unanswered).
    pub fn cluster_nodes(&mut self) -> Result<Vec<PeerRegion>> {
        match self.channel.call(&Request::ClusterInfo)? {
            Reply::ClusterInfo { nodes, .. } => Ok(nodes),
            other => Err(unexpected(other)),
        }
    }

    /// This client's node id (0 for a single store).
    pub fn node(&self) -> u32 {
        self.cluster.as_ref().map_or(0, |c| c.node)
    }

    /// The mapping that holds objects of `node` in generation `generation`
    /// of its region: ours, or the peer's region mapped by path (read-only,
    /// or writable for objects this client allocated there) on first use.
    ///
    /// A descriptor of another generation than the one mapped means the
    /// node restarted: the file now at the path is mapped instead, if it is
    /// that generation. A descriptor of a generation the file no longer
    /// carries (the node restarted since it was made) fails with
    /// `ObjectNotFound`: its object went with the old incarnation, and the
    /// new region's bytes at that offset are someone else's.
    pub(crate) fn peer_mapping(
        &mut self,
        node: u32,
        generation: u64,
        write: bool,
    ) -> Result<Arc<Mapping>> {
        let Some(cluster) = self.cluster.as_mut() else {
            return if node == 0 {
                Ok(self.mapping.clone())
            } else {
                Err(ShoalError::protocol(format!(
                    "daemon sent an object on node {node}, but it is not a cluster node"
                )))
            };
        };
        if node == cluster.node {
            return Ok(self.mapping.clone());
        }
        let index = node as usize;
        let Some(peer) = cluster.nodes.get(index).filter(|p| p.node == node) else {
            return Err(ShoalError::protocol(format!(
                "object on unknown node {node}"
            )));
        };
        if !peer.mapped {
            return Err(if write {
                ShoalError::invalid(format!(
                    "node {node} is not a node whose memory is mapped here"
                ))
            } else {
                ShoalError::protocol(format!(
                    "object on node {node}, whose memory cannot be mapped here"
                ))
            });
        }
        let (path, size) = (Path::new(&peer.path), peer.region_size);
        cluster.peers[index].resolve(node, path, size, generation, write)
    }

    /// Remote allocation: creates objects in cluster node `node`'s memory
    /// (all or none). Write them at [`located_ptr_mut`](Self::located_ptr_mut),
    /// then seal as usual. Where `node`'s region is mapped here they are
    /// written in place; a node reached over the network only has them
    /// written into staging buffers in our own node's region (the
    /// `Located`s say so), whose seal pushes the bytes to `node`.
    pub fn create_on(
        &mut self,
        node: u32,
        objects: &[CreateSpec],
        timeout_ms: u32,
    ) -> Result<Vec<Located>> {
        let me = self.node();
        if node == me {
            let locations = self.create_batch(objects, timeout_ms)?;
            return Ok(locations
                .into_iter()
                .map(|location| Located::local(node, location))
                .collect());
        }
        let request = Request::CreateOn {
            node,
            timeout_ms,
            objects: objects.to_vec(),
        };
        let (generation, offsets) = match self.channel.call(&request)? {
            Reply::Created {
                generation,
                offsets,
            } if offsets.len() == objects.len() => (generation, offsets),
            Reply::Staged { offsets } if offsets.len() == objects.len() => {
                return self.staged(objects, &offsets);
            }
            other => return Err(unexpected(other)),
        };
        let mapping = match self.peer_mapping(node, generation, true) {
            Ok(mapping) => mapping,
            Err(err) => {
                // Allocated in a region we cannot write (the node restarted
                // meanwhile): give the objects back.
                for o in objects {
                    let _ = self.channel.call(&Request::Abort { id: o.id });
                }
                return Err(err);
            }
        };
        let mut out = Vec::with_capacity(objects.len());
        for (&offset, o) in offsets.iter().zip(objects) {
            let location = ObjectLocation {
                offset,
                data_size: o.data_size,
                meta_size: o.meta_size,
            };
            if !mapping.holds(&location) {
                return Err(ShoalError::protocol(format!(
                    "daemon sent a location outside node {node}'s region: {location:?}"
                )));
            }
            let located = Located {
                node,
                generation,
                location,
                invalidate: false,
            };
            if self.noncoherent() {
                self.unsealed.insert(o.id, located);
            }
            out.push(located);
        }
        Ok(out)
    }

    /// The staging buffers (in our own node's region) of objects allocated
    /// on a node reached over the network.
    fn staged(&mut self, objects: &[CreateSpec], offsets: &[u64]) -> Result<Vec<Located>> {
        let me = self.node();
        let mut out = Vec::with_capacity(objects.len());
        for (&offset, o) in offsets.iter().zip(objects) {
            let location = self.check(ObjectLocation {
                offset,
                data_size: o.data_size,
                meta_size: o.meta_size,
            })?;
            let located = Located::local(me, location);
            if self.noncoherent() {
                // Flushed at the seal like any object written here: the
                // daemon sends the bytes from the region.
                self.unsealed.insert(o.id, located);
            }
            out.push(located);
        }
        Ok(out)
    }

    /// Writable address of an object this client allocated (here or remotely).
    pub fn located_ptr_mut(&mut self, located: Located) -> Result<*mut u8> {
        self.address(located, true).map(|(_, address)| address)
    }

    /// Address of a found object's data in this process, valid while the
    /// object is referenced and its node's region stays mapped (hold
    /// [`located_region`](Self::located_region)'s `Arc` to be sure).
    pub fn located_ptr(&mut self, located: Located) -> Result<*const u8> {
        self.address(located, false)
            .map(|(_, address)| address.cast_const())
    }

    /// Where `located` is in this process, and the mapping that holds it:
    /// for writing (`write`: the simulated cache or a writable mapping) or
    /// for reading (the cache or the mapping the descriptor was checked
    /// against when it was received). The address stays valid while the
    /// `Arc` is held, even after the node restarts and is mapped anew.
    pub fn located_region(
        &mut self,
        located: Located,
        write: bool,
    ) -> Result<(Arc<Mapping>, *mut u8)> {
        self.address(located, write)
    }

    /// Where a found object is read in this process: in our own region
    /// (`None`: the client keeps it mapped), or in the returned mapping —
    /// another node's region, or the simulated fabric's cache of an object
    /// to invalidate — which must be held while the bytes are read.
    pub fn read_place(&mut self, located: Located) -> Result<(Option<Arc<Mapping>>, *const u8)> {
        if located.node != self.node() || located.invalidate {
            let (region, address) = self.address(located, false)?;
            return Ok((Some(region), address.cast_const()));
        }
        Ok((None, self.data_ptr(located.location).cast_const()))
    }

    fn address(&mut self, located: Located, write: bool) -> Result<(Arc<Mapping>, *mut u8)> {
        let region = self.peer_mapping(located.node, located.generation, write)?;
        let mapping = match self.simulated_cache(&located, write)? {
            Some(cache) => cache,
            None => region,
        };
        if !mapping.holds(&located.location) {
            return Err(ShoalError::invalid(format!(
                "{located:?} lies outside node {}'s region",
                located.node
            )));
        }
        // SAFETY: inside the mapping (checked just above).
        let address = unsafe { mapping.base().add(located.location.offset as usize) };
        Ok((mapping, address))
    }
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

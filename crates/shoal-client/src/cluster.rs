//! Other nodes of a cluster as the client reaches them: their regions
//! mapped here (the view of them is cluster_view.rs's), remote allocation,
//! and where a found or created object is in this process. Caches on
//! non-coherent fabrics are coherence.rs's.

use std::path::Path;
use std::sync::Arc;

use shoal_core::error::{Result, ShoalError};
use shoal_core::location::ObjectLocation;
use shoal_core::protocol::{CreateSpec, Located, PeerRegion, Reply, Request};
use shoal_core::region::Mapping;

use crate::channel::unexpected;
use crate::cluster_view::ClusterView;

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
        let index = match cluster.index_of(node) {
            Some(index) => index,
            // A member that joined after this client connected: the daemon
            // knows it, since it named it.
            None => return self.peer_mapping_after_update(node, generation, write),
        };
        let peer = &cluster.nodes[index];
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

    /// [`Self::peer_mapping`] for a node this client did not know: asks the
    /// daemon for its nodes again, once.
    fn peer_mapping_after_update(
        &mut self,
        node: u32,
        generation: u64,
        write: bool,
    ) -> Result<Arc<Mapping>> {
        let nodes = self.cluster_nodes()?;
        let cluster = self.cluster.as_mut().expect("a cluster client");
        cluster.update(nodes);
        if cluster.index_of(node).is_none() {
            return Err(ShoalError::protocol(format!(
                "object on node {node}, which the daemon does not list"
            )));
        }
        self.peer_mapping(node, generation, write)
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

//! The fast path as the client drives it (docs/fast-path.md): gets of
//! published objects through the shared indexes (this node's, and other
//! nodes' in a mapped cluster), their releases, and creates in lent space.
//! Whatever it cannot serve goes to the daemon (objects.rs).

use std::os::fd::AsFd;
use std::sync::Arc;

use shoal_core::error::Result;
use shoal_core::fast_path::readers::FastReads;
use shoal_core::location::{Block, ObjectLocation};
use shoal_core::protocol::{CreateSpec, Located, Reply, Request};
use shoal_core::ObjectId;

use crate::channel::unexpected;
use crate::fast_held::FastHeld;
use crate::{lent, peer_reads};

impl crate::Client {
    /// The fast path's shared state, if this client has it (a
    /// [`crate::shared::SharedClient`] takes references through it without
    /// the connection).
    pub fn fast_reads(&self) -> Option<&Arc<FastReads>> {
        self.fast.as_ref()
    }

    /// Whether this client creates small objects in lent space and seals
    /// them through its write channel.
    pub fn has_fast_writes(&self) -> bool {
        self.writes.is_some()
    }

    /// A reference to `id` through the shared index, without a round trip:
    /// its location in our region (checked and populated for reading), and
    /// the index position the reference is counted at, to give to
    /// [`FastReads::release`]. `None`: ask the daemon.
    pub fn fast_get(&self, id: &ObjectId) -> Option<(ObjectLocation, u32)> {
        let found = self.fast.as_ref()?.acquire_in(id, &self.mapping)?;
        Some((found.location, found.position))
    }

    /// The part of a get the indexes serve: each id found in this node's
    /// index, then (a cluster) in other nodes' indexes, is referenced there
    /// and its place in `found` filled; `missed` keeps the positions (in
    /// `ids`) of the others, for the daemon. Call with the fast path only.
    pub(crate) fn get_through_indexes(
        &mut self,
        ids: &[ObjectId],
        found: &mut Vec<Option<Located>>,
        missed: &mut Vec<usize>,
    ) -> Result<()> {
        let me = self.node();
        for (i, id) in ids.iter().enumerate() {
            match self.fast_get(id) {
                Some((location, position)) => {
                    self.fast_held.entry(*id).or_default().push(FastHeld {
                        table: None,
                        position,
                    });
                    found.push(Some(Located::local(me, location)));
                }
                None => {
                    missed.push(i);
                    found.push(None);
                }
            }
        }
        if !missed.is_empty() && self.settle_seals(missed.iter().map(|&i| ids[i]))? {
            // Seals of ours the daemon had not applied yet: it has now.
            missed.retain(|&i| {
                let Some((location, position)) = self.fast_get(&ids[i]) else {
                    return true;
                };
                self.fast_held.entry(ids[i]).or_default().push(FastHeld {
                    table: None,
                    position,
                });
                found[i] = Some(Located::local(me, location));
                false
            });
        }
        if missed.is_empty() {
            return Ok(());
        }
        // Other nodes' objects through their indexes (a cluster).
        if self.fast.as_ref().is_some_and(|f| !f.is_closed()) {
            self.refresh_peer_views()?;
            missed.retain(|&i| {
                let Some((view, hit)) = self.peer_views.acquire(&ids[i]) else {
                    return true;
                };
                self.fast_held.entry(ids[i]).or_default().push(FastHeld {
                    table: Some(Arc::clone(&view.fast)),
                    position: hit.position,
                });
                found[i] = Some(view.located(&hit));
                false
            });
        }
        Ok(())
    }

    /// The daemon found objects the indexes missed: an owner whose objects
    /// it found and whose index this client has no working view of is
    /// asked for again soon.
    pub(crate) fn note_owners<'a>(&self, answers: impl IntoIterator<Item = &'a Option<Located>>) {
        let me = self.node();
        let mut noted = u32::MAX;
        for answer in answers {
            if let Some(l) = answer.filter(|l| l.node != me && l.node != noted) {
                noted = l.node;
                self.peer_views.found_at(l.node);
            }
        }
    }

    /// Gives back one reference to `id` taken through the fast path, if
    /// this client holds one: `false` when the daemon holds it instead.
    pub(crate) fn release_fast(&mut self, id: &ObjectId) -> bool {
        let held = self.fast_held.get_mut(id).and_then(|held| held.pop());
        let table = match &held {
            Some(FastHeld { table: Some(t), .. }) => Some(t),
            Some(FastHeld { table: None, .. }) => self.fast.as_ref(),
            None => None,
        };
        match (held.as_ref(), table) {
            (Some(held), Some(table)) => {
                table.release(held.position);
                if self.fast_held.get(id).is_some_and(Vec::is_empty) {
                    self.fast_held.remove(id);
                }
                true
            }
            _ => false,
        }
    }

    /// Asks the daemon for other nodes' indexes and tables there, when it
    /// is time to (`PeerViews::should_ask`). A view that cannot be mapped
    /// is left out: gets of that owner's objects ask the daemon.
    fn refresh_peer_views(&mut self) -> Result<()> {
        if !self.peer_views.should_ask() {
            return Ok(());
        }
        let (owners, fds) = match self.channel.call_with_fds(&Request::PeerReads)? {
            (Reply::PeerReads { owners }, fds) if fds.len() == 2 * owners.len() => (owners, fds),
            (Reply::PeerReads { .. } | Reply::Error { .. }, _) => (Vec::new(), Vec::new()),
            (other, _) => return Err(unexpected(other)),
        };
        let mut views = Vec::with_capacity(owners.len());
        for ((owner, generation), pair) in owners.into_iter().zip(fds.chunks_exact(2)) {
            let Ok(mapping) = self.peer_mapping(owner, generation, false) else {
                continue;
            };
            if let Ok(fast) = FastReads::attach(pair[0].as_fd(), pair[1].as_fd()) {
                views.push(peer_reads::PeerView {
                    owner,
                    generation,
                    fast: Arc::new(fast),
                    mapping,
                });
            }
        }
        self.peer_views.replace(views);
        Ok(())
    }

    /// Other nodes' indexes, for a [`crate::shared::SharedClient`] to read.
    pub(crate) fn peer_views(&self) -> Arc<peer_reads::PeerViews> {
        self.peer_views.clone()
    }

    /// Creates one object in lent space, asking for a lease if needed:
    /// `None` when it goes through the socket instead.
    pub(crate) fn create_lent(&mut self, spec: &CreateSpec) -> Result<Option<ObjectLocation>> {
        if self.fast.as_ref().is_some_and(|f| f.is_closed()) {
            // The connection failed: the socket says so.
            self.writes = None;
        }
        let Some(writes) = self.writes.as_mut() else {
            return Ok(None);
        };
        if !writes.wants(spec.data_size, spec.meta_size) || writes.maybe_taken(&spec.id) {
            return Ok(None);
        }
        if let Some(location) = writes.carve(spec.id, spec.data_size, spec.meta_size)? {
            return Ok(Some(location));
        }
        let block = match self.channel.call(&Request::Lend { bytes: lent::LEASE })? {
            Reply::Lent { len: 0, .. } => None,
            Reply::Lent { lease, offset, len } => {
                let inside = offset
                    .checked_add(len)
                    .is_some_and(|end| end <= self.info.region_size);
                if !inside || !offset.is_multiple_of(self.info.line_size) {
                    return Err(shoal_core::error::ShoalError::protocol(format!(
                        "the daemon lent [{offset}, +{len}) outside its region"
                    )));
                }
                Some((lease, Block { offset, len }))
            }
            other => return Err(unexpected(other)),
        };
        let writes = self.writes.as_mut().expect("checked above");
        let lent = block.is_some();
        writes.take_lease(block)?;
        if !lent {
            return Ok(None);
        }
        writes.carve(spec.id, spec.data_size, spec.meta_size)
    }

    /// Waits until the daemon applied this client's unanswered seals of
    /// `ids` (seals to memory return before it does): whether any was.
    pub(crate) fn settle_seals(&mut self, ids: impl IntoIterator<Item = ObjectId>) -> Result<bool> {
        let daemon = self.channel.daemon();
        match self.writes.as_mut() {
            Some(writes) => writes.settle(ids, &daemon),
            None => Ok(false),
        }
    }

    /// Whether `id` is an object this client is writing in lent space.
    pub(crate) fn writing_lent(&self, id: &ObjectId) -> bool {
        self.writes.as_ref().is_some_and(|w| w.writing(id))
    }
}

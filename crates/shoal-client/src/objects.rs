//! An object's life: create, write, seal (or abort, or resize while
//! written), get, release, delete; contains and list. Each call takes the
//! fast path where it can (fast.rs) and the socket otherwise.

use shoal_core::durability::Durability;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::fast_path::writes::Record;
use shoal_core::location::ObjectLocation;
use shoal_core::protocol::{CreateSpec, Located, ObjectInfo, Reply, Request};
use shoal_core::ObjectId;

use crate::channel::{expect_ok, per_id, unexpected};
use crate::lent;

/// Random ids a create that chooses its own id tries before giving up: with
/// one node of n unreachable each try fails with probability 1/n (3^-32 for
/// all 32 at n = 3).
const FRESH_ID_TRIES: usize = 32;

impl crate::Client {
    /// Creates one object; write its bytes at [`data_ptr`](Self::data_ptr), then seal.
    pub fn create(
        &mut self,
        id: ObjectId,
        data_size: u64,
        meta_size: u32,
        timeout_ms: u32,
    ) -> Result<ObjectLocation> {
        Ok(self.create_batch(
            &[CreateSpec {
                id,
                data_size,
                meta_size,
            }],
            timeout_ms,
        )?[0])
    }

    /// Creates one object that will grow through [`resize`](Self::resize)
    /// (a file being written): the daemon places it with free room after
    /// it where it has some, so several written at once each grow in place.
    /// Always through the socket (an object in lent space cannot be
    /// resized).
    pub fn create_growing(
        &mut self,
        id: ObjectId,
        data_size: u64,
        timeout_ms: u32,
    ) -> Result<ObjectLocation> {
        let spec = CreateSpec {
            id,
            data_size,
            meta_size: 0,
        };
        Ok(self.create_on_socket(&[spec], timeout_ms, true)?[0])
    }

    /// Creates several objects in one round trip, all or none.
    pub fn create_batch(
        &mut self,
        objects: &[CreateSpec],
        timeout_ms: u32,
    ) -> Result<Vec<ObjectLocation>> {
        if let [spec] = objects {
            if let Some(location) = self.create_lent(spec)? {
                return Ok(vec![location]);
            }
        }
        self.create_on_socket(objects, timeout_ms, false)
    }

    /// A `Create` round trip (`growing`: see the protocol's `Create`).
    fn create_on_socket(
        &mut self,
        objects: &[CreateSpec],
        timeout_ms: u32,
        growing: bool,
    ) -> Result<Vec<ObjectLocation>> {
        let request = Request::Create {
            timeout_ms,
            objects: objects.to_vec(),
            growing,
        };
        let reply = match self.channel.call(&request) {
            // Space lent to this client and unused must not be what fills
            // the store: give it back (applied before the next request) and
            // try once more.
            Err(err) if err.kind() == ErrorKind::StoreFull => {
                let gave_back = match self.writes.as_mut() {
                    Some(writes) => writes.give_back_idle()?,
                    None => false,
                };
                if !gave_back {
                    return Err(err);
                }
                self.channel.call(&request)?
            }
            reply => reply?,
        };
        let locations: Vec<ObjectLocation> = match reply {
            Reply::Created { offsets, .. } if offsets.len() == objects.len() => offsets
                .iter()
                .zip(objects)
                .map(|(&offset, o)| {
                    self.check(ObjectLocation {
                        offset,
                        data_size: o.data_size,
                        meta_size: o.meta_size,
                    })
                })
                .collect::<Result<_>>()?,
            other => return Err(unexpected(other)),
        };
        if self.noncoherent() {
            let me = self.node();
            for (o, l) in objects.iter().zip(&locations) {
                self.unsealed.insert(o.id, Located::local(me, *l));
            }
        }
        Ok(locations)
    }

    /// Creates an object under a new random id; an id whose home node
    /// cannot be reached (`HomeUnavailable`) is swapped for another, so the
    /// create never waits on a node that will hold nothing of the object.
    pub fn create_fresh(
        &mut self,
        data_size: u64,
        meta_size: u32,
        timeout_ms: u32,
    ) -> Result<(ObjectId, ObjectLocation)> {
        let mut tries = FRESH_ID_TRIES;
        loop {
            let id = ObjectId::random();
            match self.create(id, data_size, meta_size, timeout_ms) {
                Err(err) if err.kind() == ErrorKind::HomeUnavailable && tries > 1 => tries -= 1,
                created => return created.map(|location| (id, location)),
            }
        }
    }

    /// A location the daemon sent for an object we are about to write,
    /// checked against our region (and populated for writing).
    pub(crate) fn check(&self, location: ObjectLocation) -> Result<ObjectLocation> {
        if self.mapping.holds(&location) {
            // About to be written by us: no page faults while we do.
            self.mapping
                .populate_on_use(location.offset, location.size(), true);
            Ok(location)
        } else {
            Err(ShoalError::protocol(format!(
                "daemon sent a location outside the region: {location:?}"
            )))
        }
    }

    /// Address of an object's data in this process.
    pub fn data_ptr(&self, location: ObjectLocation) -> *mut u8 {
        debug_assert!(self.mapping.holds(&location));
        // SAFETY: locations are bounds-checked against the mapping when received.
        unsafe { self.mapping.base().add(location.offset as usize) }
    }

    /// Reads an object's bytes (a view into shared memory valid while referenced).
    ///
    /// # Safety
    /// The caller must hold a reference to the object for the slice's lifetime.
    pub unsafe fn data(&self, location: ObjectLocation) -> &[u8] {
        // SAFETY: see the function's contract; range checked on receipt.
        unsafe { std::slice::from_raw_parts(self.data_ptr(location), location.data_size as usize) }
    }

    /// Copies `data` and `meta` into a created object.
    pub fn write(&mut self, location: ObjectLocation, data: &[u8], meta: &[u8]) -> Result<()> {
        if data.len() as u64 != location.data_size || meta.len() as u64 != location.meta_size as u64
        {
            return Err(ShoalError::invalid(
                "write sizes differ from the created object's",
            ));
        }
        let dst = self.located_ptr_mut(Located::local(self.node(), location))?;
        // SAFETY: the object's range is inside our mapping (checked on
        // receipt) and belongs to us until sealed; sources are ordinary memory.
        unsafe {
            shoal_core::copy::copy_to_shared(dst, data);
            std::ptr::copy_nonoverlapping(meta.as_ptr(), dst.add(data.len()), meta.len());
        }
        Ok(())
    }

    /// Seals objects this client created; with `release` also drops the
    /// creator's reference (nothing left to release afterwards).
    pub fn seal(&mut self, ids: &[ObjectId], release: bool) -> Result<()> {
        self.seal_durable(ids, release, None)
    }

    /// [`seal`](Self::seal), answered only once every object reached
    /// `durability` on the tiers below memory (`None`: the node's default).
    pub fn seal_durable(
        &mut self,
        ids: &[ObjectId],
        release: bool,
        durability: Option<Durability>,
    ) -> Result<()> {
        let (lent, rest): (Vec<ObjectId>, Vec<ObjectId>) = match &self.writes {
            Some(writes) => ids.iter().partition(|id| writes.writing(id)),
            None => (Vec::new(), ids.to_vec()),
        };
        if lent.is_empty() {
            self.flush_written(&rest);
            return expect_ok(self.channel.call(&Request::Seal {
                release,
                durability,
                ids: rest,
            })?);
        }
        // As on the socket: an id twice, or one that cannot be sealed, and
        // nothing is (the daemon's part first; the lent part is refused
        // only for a durability the node lacks, checked there too).
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        if let Some(twice) = ids.iter().find(|id| !seen.insert(**id)) {
            return Err(ShoalError::invalid(format!(
                "object {twice} appears twice in one seal"
            )));
        }
        if !rest.is_empty() {
            self.flush_written(&rest);
            expect_ok(self.channel.call(&Request::Seal {
                release,
                durability,
                ids: rest,
            })?)?;
        }
        let writes = self.writes.as_mut().expect("lent ids come from it");
        let outcomes = writes.seal(&lent, release, durability, &self.channel.daemon())?;
        outcomes
            .into_iter()
            .find_map(Result::err)
            .map_or(Ok(()), Err)
    }

    /// Gives up an object this client created and has not sealed: its
    /// space is freed and the id is free again.
    pub fn abort(&mut self, id: ObjectId) -> Result<()> {
        if let Some(writes) = self.writes.as_mut() {
            if writes.abort(&id)? {
                return Ok(());
            }
        }
        self.flush_written(&[id]);
        expect_ok(self.channel.call(&Request::Abort { id })?)
    }

    /// Resizes an unsealed object this client created to `data_size` data
    /// bytes, in place: a shrink frees the tail at once (true); a growth
    /// takes the free space right after the object if the store has it
    /// (true) and otherwise changes nothing (false: create a larger object
    /// and copy). Objects with metadata, created in lent space (small
    /// ones) or on another node are refused (`InvalidArgument`).
    pub fn resize(&mut self, id: ObjectId, data_size: u64) -> Result<bool> {
        if self.writing_lent(&id) {
            return Err(ShoalError::invalid(format!(
                "object {id} was created in lent space and cannot be resized"
            )));
        }
        // On a non-coherent fabric a shrink gives the tail to the next
        // create: this cache's dirty lines there must reach memory first.
        let flushed = self
            .unsealed
            .get(&id)
            .copied()
            .filter(|l| self.noncoherent() && data_size < l.location.data_size);
        if flushed.is_some() {
            self.flush_written(&[id]);
        }
        let reply = self.channel.call(&Request::Resize { id, data_size });
        if let Some(located) = flushed {
            self.unsealed.insert(id, located);
        }
        match reply? {
            Reply::Bool(resized) => {
                if resized {
                    // What the flush before the seal covers.
                    if let Some(located) = self.unsealed.get_mut(&id) {
                        located.location.data_size = data_size;
                    }
                }
                Ok(resized)
            }
            other => Err(unexpected(other)),
        }
    }

    /// create + write + seal of many objects in two round trips, sealed at
    /// `durability` (`None`: the node's default; see
    /// [`seal_durable`](Self::seal_durable)); no references are left behind.
    pub fn put_batch(
        &mut self,
        objects: &[(ObjectId, &[u8], &[u8])],
        durability: Option<Durability>,
        timeout_ms: u32,
    ) -> Result<()> {
        let specs: Vec<_> = objects
            .iter()
            .map(|(id, data, meta)| CreateSpec {
                id: *id,
                data_size: data.len() as u64,
                meta_size: meta.len() as u32,
            })
            .collect();
        let locations = self.create_batch(&specs, timeout_ms)?;
        for ((_, data, meta), location) in objects.iter().zip(&locations) {
            self.write(*location, data, meta)?;
        }
        let ids: Vec<_> = objects.iter().map(|(id, _, _)| *id).collect();
        self.seal_durable(&ids, true, durability)
    }

    /// Creates, writes and seals one object (at the node's default
    /// durability), holding no reference afterwards.
    pub fn put(&mut self, id: ObjectId, data: &[u8], meta: &[u8]) -> Result<()> {
        self.put_batch(&[(id, data, meta)], None, 0)
    }

    /// Gets objects, waiting up to `timeout_ms` (or [`crate::WAIT_FOREVER`])
    /// for the ones not sealed yet. Found objects are referenced until
    /// released. Each found object's descriptor says which node's region
    /// holds it (this daemon's, or a peer's in a cluster).
    ///
    /// Published objects come from the shared indexes without a round trip
    /// (fast.rs); the daemon is asked for the rest, in one request.
    ///
    /// An object whose descriptor names a region its node no longer has
    /// (the node restarted after answering) is not found: it went with the
    /// node's previous incarnation. Its reference is given back.
    pub fn get(&mut self, ids: &[ObjectId], timeout_ms: i64) -> Result<Vec<Option<Located>>> {
        if self.fast.is_none() {
            return self.get_from_daemon(ids, timeout_ms);
        }
        let mut found = Vec::with_capacity(ids.len());
        let mut missed = Vec::new();
        self.get_through_indexes(ids, &mut found, &mut missed)?;
        if missed.is_empty() {
            return Ok(found);
        }
        let asked: Vec<ObjectId> = missed.iter().map(|&i| ids[i]).collect();
        let answers = self.get_from_daemon(&asked, timeout_ms)?;
        self.note_owners(&answers);
        for (i, answer) in missed.into_iter().zip(answers) {
            found[i] = answer;
        }
        Ok(found)
    }

    fn get_from_daemon(
        &mut self,
        ids: &[ObjectId],
        timeout_ms: i64,
    ) -> Result<Vec<Option<Located>>> {
        let objects = match self.channel.call(&Request::Get {
            timeout_ms,
            ids: ids.to_vec(),
        })? {
            Reply::Objects { objects } if objects.len() == ids.len() => objects,
            other => return Err(unexpected(other)),
        };
        let mut gone = Vec::new();
        let found = objects
            .into_iter()
            .zip(ids)
            .map(
                |(o, id)| match o.map(|l| self.check_located(l)).transpose() {
                    Err(err) if err.kind() == ErrorKind::ObjectNotFound => {
                        gone.push(*id);
                        Ok(None)
                    }
                    other => other,
                },
            )
            .collect();
        self.release(&gone)?;
        found
    }

    /// Drops references taken by get or create. One-way: does not wait.
    pub fn release(&mut self, ids: &[ObjectId]) -> Result<()> {
        self.release_deferred(ids);
        self.send_deferred()
    }

    /// Queues the release of references: sent with the next request (one
    /// write, one wake-up of the daemon for both) or by
    /// [`send_deferred`](Self::send_deferred), whichever comes first. The
    /// daemon sees them before that next request.
    pub fn release_deferred(&mut self, ids: &[ObjectId]) {
        if ids.is_empty() {
            return;
        }
        let mut to_daemon = Vec::new();
        for id in ids {
            // A reference taken through the fast path is given back there.
            if !self.release_fast(id) {
                to_daemon.push(*id);
            }
        }
        if to_daemon.is_empty() {
            return;
        }
        // Through the write channel when there is one: no system call, and
        // the daemon applies it before this client's next request.
        let sent = self
            .writes
            .as_mut()
            .is_some_and(|w| w.release(&to_daemon).is_ok());
        if !sent {
            self.channel.queue(&Request::Release { ids: to_daemon });
        }
    }

    /// Sends what [`release_deferred`](Self::release_deferred) queued, now.
    pub fn send_deferred(&mut self) -> Result<()> {
        self.channel.flush()
    }

    /// Deletes objects; one result per id. A few at a time go through the
    /// write channel when there is one (answered once no get on the node
    /// can find them, as on the socket).
    pub fn delete(&mut self, ids: &[ObjectId]) -> Result<Vec<Result<()>>> {
        if let Some(answers) = self.ask_lent(ids, |id| Record::Delete { id })? {
            return Ok(answers
                .into_iter()
                .zip(ids)
                .map(|(answer, id)| match answer {
                    None => Ok(()),
                    Some(ErrorKind::ObjectNotFound) => Err(ShoalError::not_found(id)),
                    Some(kind) => Err(ShoalError::new(
                        kind,
                        format!("delete of object {id}: {kind:?}"),
                    )),
                })
                .collect());
        }
        let reply = self.channel.call(&Request::Delete { ids: ids.to_vec() })?;
        per_id(reply, ids, "delete of object")
    }

    /// Whether a sealed object `id` is in the store (the shared index
    /// answers without a round trip when it has it; the daemon otherwise,
    /// through the write channel when there is one).
    pub fn contains(&mut self, id: ObjectId) -> Result<bool> {
        if self.fast.as_ref().is_some_and(|f| f.published(&id)) {
            return Ok(true);
        }
        if self.settle_seals([id])? && self.fast.as_ref().is_some_and(|f| f.published(&id)) {
            return Ok(true);
        }
        if let Some(answers) = self.ask_lent(&[id], |id| Record::Contains { id })? {
            return match answers[0] {
                None => Ok(true),
                Some(ErrorKind::ObjectNotFound) => Ok(false),
                Some(kind) => Err(ShoalError::new(kind, format!("contains {id}: {kind:?}"))),
            };
        }
        match self.channel.call(&Request::Contains { id })? {
            Reply::Bool(b) => Ok(b),
            other => Err(unexpected(other)),
        }
    }

    /// One query record per id through the write channel, and the answers;
    /// `None`: no channel (or too many ids), ask on the socket. Records
    /// queued for the socket go first, so the daemon sees them before.
    fn ask_lent(
        &mut self,
        ids: &[ObjectId],
        record: impl Fn(ObjectId) -> Record,
    ) -> Result<Option<Vec<Option<ErrorKind>>>> {
        if self.fast.as_ref().is_some_and(|f| f.is_closed()) {
            // The connection failed: the socket says so.
            self.writes = None;
        }
        let Some(writes) = self.writes.as_mut() else {
            return Ok(None);
        };
        if ids.is_empty() || ids.len() > lent::MAX_QUERIES {
            return Ok(None);
        }
        // Releases queued for the socket (a client without room in its
        // ring) are sent first: the daemon reads them before the records.
        self.channel.flush()?;
        let records: Vec<Record> = ids.iter().map(|&id| record(id)).collect();
        writes.ask(&records, &self.channel.daemon()).map(Some)
    }

    /// Every object in the store, sealed or not.
    pub fn list(&mut self) -> Result<Vec<ObjectInfo>> {
        match self.channel.call(&Request::List)? {
            Reply::List { objects } => Ok(objects),
            other => Err(unexpected(other)),
        }
    }
}

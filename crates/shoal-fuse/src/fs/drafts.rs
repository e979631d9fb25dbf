//! Where drafts (files being written, draft.rs) get their store memory:
//! `DraftStore` for the mount, on its drafts connections.

use std::time::{Duration, Instant};

use libc::c_int;
use shoal_client::Located;
use shoal_core::error::ErrorKind;
use shoal_core::ObjectId;

use super::ShoalFs;
use crate::draft::{DraftStore, Held};
use crate::handles::lock;

/// A draft's create waits for room this long at a time, letting go of its
/// connection in between.
const CREATE_WAIT_SLICE: Duration = Duration::from_millis(50);

/// Drafts live in the store, through the mount's drafts connection (its
/// lock taken per call: a draft's copies run without it).
impl DraftStore for ShoalFs {
    fn create(&self, data_size: u64, wait: bool) -> Result<(Held, *mut u8), c_int> {
        let id = ObjectId::random();
        let conn = self.next_draft();
        // A create that waits for room does so in slices, letting go of the
        // connection between them: the seals and shrinks of other drafts
        // on it are what may free that room.
        let deadline = Instant::now() + Duration::from_millis(u64::from(self.space_wait_ms));
        let (mut client, location) = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = if wait {
                left.min(CREATE_WAIT_SLICE)
            } else {
                Duration::ZERO
            };
            let mut client = lock(&self.drafts[conn]);
            match client.create_growing(id, data_size, slice.as_millis() as u32) {
                Ok(location) => break (client, location),
                Err(err) if wait && err.kind() == ErrorKind::StoreFull && !left.is_zero() => {}
                Err(err) => return Err(self.fail(&err)),
            }
        };
        let node = client.node();
        match client.located_ptr_mut(Located::local(node, location)) {
            Ok(address) => Ok((Held { id, conn }, address)),
            Err(err) => {
                let _ = client.abort(id);
                Err(self.fail(&err))
            }
        }
    }

    fn resize(&self, object: Held, data_size: u64) -> Result<bool, c_int> {
        let resized = lock(&self.drafts[object.conn]).resize(object.id, data_size);
        resized.map_err(|e| self.fail(&e))
    }

    fn prepare_write(&self, object: Held, at: *mut u8, len: usize) {
        // The connection's mapping, without its lock (other drafts' store
        // calls hold it): a mapping is never replaced while its client lives.
        let mapping = &self.draft_maps[object.conn];
        let offset = (at as usize).wrapping_sub(mapping.base() as usize) as u64;
        mapping.populate_for_writing(offset, len as u64);
    }

    fn seal_named(&self, object: Held, name: &str) -> Result<(), c_int> {
        let mut client = lock(&self.drafts[object.conn]);
        client.name(object.id, name).map_err(|e| self.fail(&e))?;
        // The seal waits for the node's default durability.
        client
            .seal_durable(&[object.id], false, None)
            .map_err(|e| self.fail(&e))
    }

    fn is_sealed(&self, object: Held) -> Option<bool> {
        let sealed = lock(&self.drafts[object.conn]).contains(object.id);
        sealed.ok()
    }

    fn abort(&self, object: Held) {
        let aborted = lock(&self.drafts[object.conn]).abort(object.id);
        if let Err(err) = aborted {
            self.fail(&err);
        }
    }

    fn release(&self, object: Held) {
        self.release_on(&self.drafts[object.conn], object.id);
    }
}

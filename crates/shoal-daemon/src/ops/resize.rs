//! Resize: an unsealed object shrinks, or grows in place, before its seal
//! (the POSIX view writes a file into an object as it grows).

use shoal_core::error::{Result, ShoalError};
use shoal_core::ids::ClientId;
use shoal_core::ObjectId;

use crate::ops::Ops;

impl Ops {
    /// True when resized; false when a growth found no room right after the
    /// object (unchanged: the client creates a larger one). A shrink wakes
    /// creates waiting for room (the store says so when it frees).
    pub(crate) fn resize(&self, client: ClientId, id: &ObjectId, data_size: u64) -> Result<bool> {
        if self.remote_creation(client, id).is_some() {
            return Err(ShoalError::invalid(format!(
                "object {id} was allocated on another node and cannot be resized"
            )));
        }
        self.node
            .mutate(|store| store.resize(client, id, data_size))
    }
}

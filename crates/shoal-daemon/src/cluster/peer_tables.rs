//! As a holder, what this node keeps for its clients' gets of other nodes'
//! objects through those nodes' indexes (`peer_reads` has the behaviour):
//! the owners' indexes it opened, each client's tables at them, and the
//! tables it stopped while their clients may still hold what they counted.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{BorrowedFd, OwnedFd};

use shoal_core::error::{Result, ShoalError};
use shoal_core::fast_path::index::IndexReader;
use shoal_core::fast_path::readers::PeerTable;
use shoal_core::ids::ClientId;

/// An owner's index as this node opened it, for one incarnation.
pub(crate) struct OwnerIndex {
    pub(crate) generation: u64,
    pub(crate) file: File,
    pub(crate) reader: IndexReader,
}

/// One client's table at one owner.
pub(crate) struct Attached {
    pub(crate) client: ClientId,
    pub(crate) owner: u32,
    pub(crate) generation: u64,
    pub(crate) table: PeerTable,
}

/// What one client is handed per owner: the owner, its incarnation, its
/// index and the client's table there.
pub struct PeerView {
    pub owner: u32,
    pub generation: u64,
    pub index: OwnedFd,
    pub table: OwnedFd,
}

/// A second descriptor of `fd` (one goes to the client, one stays here).
pub(crate) fn dup(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
    fd.try_clone_to_owned()
        .map_err(|e| ShoalError::io("dup a peer-read descriptor", e))
}

/// The holder's side.
#[derive(Default)]
pub(crate) struct PeerReads {
    /// Per owner, its index as opened here.
    pub(crate) indexes: HashMap<u32, OwnerIndex>,
    /// Owners whose index cannot be opened here (another host), by
    /// incarnation: not asked again until it restarts.
    pub(crate) refused: HashMap<u32, u64>,
    pub(crate) tables: HashMap<ClientId, Vec<Attached>>,
    /// Tables stopped while their clients may still hold what they counted
    /// there: a fence is confirmed to their owner only once they let go.
    pub(crate) stopped: Vec<Attached>,
    pub(crate) next_key: u64,
}

impl PeerReads {
    pub(crate) fn stop_owner(&mut self, owner: u32) -> usize {
        self.indexes.remove(&owner);
        self.refused.remove(&owner);
        let mut stopped = Vec::new();
        for attached in self.tables.values_mut() {
            let (gone, kept) = std::mem::take(attached)
                .into_iter()
                .partition(|a| a.owner == owner);
            *attached = kept;
            stopped.extend(gone);
        }
        self.tables.retain(|_, t| !t.is_empty());
        let count = stopped.len();
        for attached in &stopped {
            attached.table.stop();
        }
        self.stopped.extend(stopped);
        self.prune_stopped();
        count
    }

    /// Stopped tables that hold nothing any more are revoked and dropped.
    pub(crate) fn prune_stopped(&mut self) {
        self.stopped.retain(|a| {
            let holds = a.table.holding() != 0;
            if !holds {
                a.table.revoke();
            }
            holds
        });
    }
}

//! Who holds references in the store: how the daemon divides the store's
//! client-id space. One id is not the daemon's to give: the store itself
//! holds fast-path readers' references as `ClientId::MAX`
//! ([`FAST_READERS`](shoal_store::store::FAST_READERS), in shoal-store).
//!
//! - `1 .. RESERVED_BASE`: local connections, numbered as they come;
//! - `RESERVED_BASE .. PEER_BASE`: the daemon's own principals (network
//!   copies being pulled, objects pinned while sent, the tiers, objects
//!   held while pushed bytes arrive, staging buffers);
//! - `PEER_BASE + node`: each other node of the cluster (its references
//!   here, its remote allocations);
//! - `FENCED_BASE + node`: what a node cut off past its lease held here,
//!   in quarantine until it confirms (`cluster/fencing.rs`).

use shoal_core::ids::ClientId;

const PEER_BASE: ClientId = 0xF000_0000;
/// Nodes are numbered below 2^27; fence principals follow the peers'.
const FENCED_BASE: ClientId = 0xF800_0000;
const RESERVED_BASE: ClientId = PEER_BASE - 16;

/// Owns network-mode copies while they are pulled.
pub const COPY: ClientId = RESERVED_BASE;
/// Pins objects while the data channel sends them.
pub const SEND: ClientId = RESERVED_BASE + 1;
/// The tiers below memory: pins objects while they drain, and creates the
/// objects restores fill.
pub const TIERS: ClientId = RESERVED_BASE + 2;
/// Holds a peer's unsealed object while the data channel receives its
/// bytes (a push), so an abort meanwhile cannot free the memory under it.
pub const RECEIVE: ClientId = RESERVED_BASE + 3;
/// Owns the staging buffers of remote allocations on nodes reached over
/// the network: clients write there, the seal pushes the bytes.
pub const STAGE: ClientId = RESERVED_BASE + 4;

/// The store client standing for node `node`.
pub fn peer(node: u32) -> ClientId {
    PEER_BASE + node
}

/// The store client holding what node `node` held here when it was fenced.
pub fn fenced(node: u32) -> ClientId {
    FENCED_BASE + node
}

/// The node a peer principal stands for.
pub fn node_of(client: ClientId) -> Option<u32> {
    client
        .checked_sub(PEER_BASE)
        .filter(|_| client < FENCED_BASE)
}

/// Whether `client` is another node, or stands for one that was fenced
/// (its clients wrote what it created).
pub fn is_peer(client: ClientId) -> bool {
    client >= PEER_BASE
}

/// Numbers local connections, never handing out a reserved id nor one
/// still in use (after 2^32 connections the numbers wrap).
#[derive(Debug)]
pub struct LocalIds {
    next: ClientId,
}

impl Default for LocalIds {
    fn default() -> Self {
        Self { next: 1 }
    }
}

impl LocalIds {
    pub fn next(&mut self, in_use: impl Fn(ClientId) -> bool) -> ClientId {
        loop {
            let id = self.next;
            self.next = if id + 1 >= RESERVED_BASE { 1 } else { id + 1 };
            if !in_use(id) {
                return id;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spaces_do_not_overlap() {
        assert!(!is_peer(COPY) && !is_peer(SEND) && !is_peer(TIERS));
        const { assert!(COPY != SEND && SEND != TIERS && COPY != TIERS) };
        assert_eq!(node_of(peer(3)), Some(3));
        assert_eq!(node_of(SEND), None);
        assert_eq!(node_of(fenced(3)), None);
        assert!(fenced(3) != peer(3) && is_peer(fenced(3)));
        let mut ids = LocalIds {
            next: RESERVED_BASE - 2,
        };
        assert_eq!(ids.next(|_| false), RESERVED_BASE - 2);
        assert_eq!(ids.next(|_| false), RESERVED_BASE - 1);
        assert_eq!(ids.next(|id| id == 1), 2, "wraps, skipping ids in use");
    }
}

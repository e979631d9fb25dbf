//! The single-object fast path (issue 14, docs/fast-path.md): state clients
//! and the daemon share through memory instead of the socket.
//!
//! - [`ring`]: one-way messages from a client to the daemon.
//! - [`index`]: the object index the daemon publishes sealed objects in.
//! - [`readers`]: each client's reference counts, read by the daemon before
//!   it frees memory, and the client's get without a round trip.
//! - [`writes`]: each client's write channel (seals, releases and lent
//!   space given back, answered through shared memory).
//! - [`lease`]: space lent to a client, as the client carves objects from
//!   it (the daemon's record of it is `shoal_store::lent`).

pub mod index;
pub mod lease;
pub mod readers;
pub mod ring;
pub mod writes;

//! The single-object fast path (issue 14, docs/fast-path.md): state clients
//! and the daemon share through memory instead of the socket.
//!
//! - [`ring`]: one-way messages from a client to the daemon.
//! - [`index`]: the object index the daemon publishes sealed objects in.
//! - [`readers`]: each client's reference counts, read by the daemon before
//!   it frees memory, and the client's get without a round trip.

pub mod index;
pub mod readers;
pub mod ring;

#[cfg(test)]
mod store_tests;

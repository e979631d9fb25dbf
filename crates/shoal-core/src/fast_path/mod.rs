//! The single-object fast path (issue 14, docs/fast-path.md): state clients
//! and the daemon share through the region's memory instead of the socket.
//! Built so far: the one-way message ring.

pub mod ring;

//! shoal core: everything about the store that needs no runtime.
//!
//! The daemon (`shoal-daemon`) drives these types from its event loop; the
//! client (`shoal-client`) shares the wire protocol and ids. Everything here is
//! synchronous and deterministic so it can be tested without sockets or time.

pub mod allocator;
pub mod busy_poll;
pub mod capacity;
pub mod coherence;
pub mod copy;
pub mod durability;
pub mod error;
pub mod eviction;
pub mod fast_path;
pub mod fd_passing;
pub mod ghost_reads;
pub mod ids;
pub mod local_auth;
pub mod location;
pub mod names;
pub mod object_table;
pub mod populate;
pub mod protocol;
pub mod region;
pub mod store;
pub mod units;

pub use error::{ErrorKind, ShoalError};
pub use ids::ObjectId;

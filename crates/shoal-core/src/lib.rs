//! shoal core: the contract every shoal process shares.
//!
//! Ids, errors, the local wire protocol and the vocabulary it carries,
//! fast-path layouts in shared memory, regions and their mappings, cache
//! coherence, copies, fd passing and local authentication. The daemon's
//! engine (`shoal-store`) and its capacity law (`shoal-capacity`) build on
//! this crate; clients, the FUSE view and the Python binding need nothing
//! else from the server side. Everything here is synchronous and needs no
//! runtime.

#![warn(missing_docs)]

pub mod busy_poll;
pub mod coherence;
pub mod copy;
pub mod durability;
pub mod error;
pub mod event;
pub mod fast_path;
pub mod fd_passing;
pub mod ids;
pub mod local_auth;
pub mod location;
pub mod names;
pub mod populate;
pub mod protocol;
pub mod region;
pub mod units;

pub use error::{ErrorKind, MissingFeature, ShoalError};
pub use ids::ObjectId;

//! shoal's store engine: the object life cycle of one daemon's memory.
//!
//! The object table, the allocator, the eviction policies and the store
//! that ties them to clients' references (create → write → seal →
//! get/release → delete, as synchronous state transitions), and the record
//! of space lent to clients for the fast path's creates. Only the daemon
//! compiles this crate; what the wire says about a store (`ObjectInfo`,
//! `StoreStats`, `ObjectLocation`) is the contract's (`shoal-core`).

pub mod allocator;
pub mod eviction;
pub mod ghost_reads;
pub mod lent;
pub mod object_table;
pub mod store;

#[cfg(test)]
mod fast_path_tests;

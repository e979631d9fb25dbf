//! The shoal daemon: one region, one object store, many local clients, and
//! its peers when it is a node of a cluster.
//!
//! Layers, each importing only those below it:
//! - [`supervisor`], [`principals`], `accept`, [`metrics`], [`names`],
//!   [`shutdown`]: leaves (background tasks, the store's client-id space,
//!   accept backoff, what a node counts, the POSIX view's name index, the
//!   stop signal);
//! - [`node`]: the store, region, waiters, subscribers and listeners; every
//!   change goes through it and is published by it;
//! - [`tiers`]: the tiers below memory (drain, spill, burst pressure), a
//!   listener of the node and what lies `Below` it;
//! - [`cluster`]: this daemon as a node of a cluster, a listener of its node;
//! - [`elastic`]: the capacity controller, which resizes the node's store
//!   (taking the cluster's idle loans back first);
//! - [`config`]: what a daemon serves ([`DaemonConfig`]), with the tiers',
//!   cluster's and capacity controller's own configurations;
//! - `ops`: the operations (create, get, seal, abort, release, delete,
//!   evict, restore, names, ...), shared by local clients and peers;
//! - `connection` (local clients), `write_poller` (what local clients
//!   record in their write channels: the fast path) and `peer_service`
//!   (other nodes), which serve requests with `ops`;
//! - `adoption`: the backing stores of nodes removed from the cluster for
//!   good, served by a survivor (over `tiers` and `cluster`);
//! - `observe`: the `/metrics` endpoint and status page, fed by a
//!   listener of the node and a snapshot of its store;
//! - [`server`]: wires the layers, listens, and stops them all.
//!
//! The daemon runs on a single-threaded tokio runtime: the store is touched
//! by one thread only, so it needs no lock, and a request costs one wake-up.
//! Clients do the copying into and out of shared memory themselves; the
//! daemon only does bookkeeping, which one core handles at millions of
//! operations per second.

// What is `pub` is reachable from outside the crate: the rest is `pub(crate)`,
// so the daemon's API is what `lib.rs` exports and nothing else.
#![warn(unreachable_pub)]

mod accept;
mod adoption;
pub mod cluster;
pub mod config;
mod connection;
pub mod elastic;
pub mod metrics;
pub mod names;
pub mod node;
mod observe;
mod ops;
mod peer_service;
pub mod principals;
pub mod server;
pub mod shutdown;
pub mod supervisor;
pub mod tiers;
mod write_poller;

/// Whether this build can keep a cluster's membership in etcd (the `etcd`
/// feature).
pub const ETCD_BUILT: bool = cfg!(feature = "etcd");

pub use cluster::ClusterConfig;
pub use config::DaemonConfig;
pub use server::{run, serve_blocking};
pub use shutdown::Shutdown;

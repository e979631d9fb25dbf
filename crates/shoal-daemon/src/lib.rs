//! The shoal daemon: one region, one object store, many local clients.
//!
//! Layout: [`config`] (what to serve), [`server`] (listener, region, shared
//! state, idle exit), [`connection`] (one client's requests), [`shutdown`]
//! (a value the caller triggers to stop the server cleanly).
//!
//! The server runs on a single-threaded tokio runtime: the store is touched
//! by one thread only, so it needs no lock, and a request costs one wake-up.
//! Clients do the copying into and out of shared memory themselves; the
//! daemon only does bookkeeping, which one core handles at millions of
//! operations per second.

pub mod cluster;
pub mod config;
mod connection;
pub mod server;
pub mod shutdown;

pub use cluster::ClusterConfig;
pub use config::DaemonConfig;
pub use server::{run, serve_blocking};
pub use shutdown::Shutdown;

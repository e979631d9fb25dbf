//! The daemon against real clients and peers, one test binary (one link
//! instead of one per file; `cargo test -p shoal-daemon --test integration
//! tiers::` runs one module). What every module starts its daemons with is
//! `shoal-testing`. `lifecycle.rs` stays a binary of its own: it counts
//! the process's threads and descriptors, which other tests would move.

mod daemon;
mod elastic;
mod elastic_cluster;
mod hosts;
// Needs the daemon's `etcd` feature (on in the workspace's test build).
#[cfg(feature = "etcd")]
mod membership;
mod metrics;
mod names;
mod names_cluster;
mod network_alloc;
mod peer_calls;
mod peer_identity;
mod peer_reads;
mod peer_tls;
mod tiers;

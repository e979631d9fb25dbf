//! The `shoal` command end to end, one test binary (one link instead of one
//! per file; `cargo test -p shoal-cli --test integration mount::` runs one
//! module): daemons as processes, mounts, kill -9 with tiers, the
//! operations surface; what a build without an optional part says
//! (`features`). Shared harnesses: `shoal-testing`, and `support` for what
//! needs this crate's binary.

mod cluster_check;
mod connection_limits;
mod features;
mod logs;
#[cfg(feature = "etcd")]
mod membership;
#[cfg(feature = "fuse")]
mod mount;
mod prometheus;
mod put_get;
mod status_page;
mod support;
mod tier_crash;
mod tls;
#[cfg(feature = "top")]
mod top;

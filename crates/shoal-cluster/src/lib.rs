//! shoal cluster: several daemons, one object namespace.
//!
//! - [`topology`]: the cluster file (static membership, access modes);
//!   [`address`]: its addresses (IP or host name); [`check`]: the rules a
//!   file keeps (errors, warnings) and which nodes share a host.
//! - [`epoch`]: the view epoch every peer call carries, and the check on it.
//! - [`membership_url`]: `etcd://host:port,…/prefix`, where a cluster's
//!   membership lives when it is not the file's static list.
//! - [`view`]: the members now, numbered by epochs, and which member is an
//!   id's home (rendezvous hashing).
//! - [`directory`]: the home's table of owners and locations (ids are unique
//!   cluster-wide).
//! - [`proto`]: the peer RPC messages and gRPC service (tonic), generated from
//!   `proto/shoal/peer/v1/peer.proto` (checked in: `generated/`, by `proto/codegen`).
//! - [`auth`]: the check on every peer call (per-node credentials, or the
//!   shared token of older cluster files).
//! - [`node_keys`]: per-node key pairs and the credentials derived from them.
//! - [`bulk`]: the TCP data channel network-mode pulls read object bytes from.
//! - [`tls`]: both channels over TLS 1.3, certificates of the cluster's CA
//!   bound to node identities ([`cert_name`]).
//! - [`ids`]: packing ids into the RPC's byte fields.
//! - [`rebuild`]: rebuilding a (re)started home's directory from its peers.

pub mod address;
pub mod auth;
pub mod bulk;
pub mod cert_name;
pub mod check;
pub mod directory;
pub mod epoch;
pub mod ids;
pub mod membership_url;
pub mod node_keys;
pub mod rebuild;
pub mod tls;
pub mod topology;
pub mod view;

/// Generated from proto/shoal/peer/v1/peer.proto by `proto/codegen` and checked
/// in, so that no build runs protox and tonic-build; after a change to the
/// proto, `cargo run` there rewrites it (its `cargo test`, in scripts/test.sh,
/// fails while the two differ).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    include!("../generated/shoal.peer.v1.rs");
}

pub use address::Address;
pub use directory::{Directory, DirectoryEntry};
pub use topology::{
    Access, Checked, MembershipConfig, Node, NodeElastic, NodeIdentity, NodeTiers, NodeTls,
    TlsTrust, Topology,
};
pub use view::{home_of, View};

//! shoal's cluster membership on etcd: nodes join and leave a running
//! cluster, and every change of who is a member is a numbered view.
//!
//! - `MembershipUrl` (in shoal-cluster, which the cluster file parses it
//!   with): `etcd://host:port,…/prefix`, where a cluster's keys live.
//! - [`keys`]: the 2N + 2 keys of N nodes (never one per object).
//! - [`roster`]: what etcd says now, and the [`roster::Steward`]'s rules for
//!   the next view (live nodes join, members gone longer than the grace
//!   leave).
//! - [`etcd`]: a member: join, keep the lease, follow the keys, propose,
//!   leave.
//!
//! Only the daemon uses it, behind its `etcd` feature; nothing on the data
//! path talks to etcd.

pub mod etcd;
pub mod keys;
pub mod repeated;
pub mod roster;

pub use etcd::{Joining, Membership, RenewalClock, Settings};
pub use roster::Roster;
pub use shoal_cluster::membership_url::MembershipUrl;

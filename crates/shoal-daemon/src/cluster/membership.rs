//! This node's place in a membership kept in etcd (`[cluster] membership`,
//! the `etcd` feature): it joins once its peer service listens, adopts every
//! view etcd brings (`view_change.rs`), and leaves on a clean stop. Nothing
//! on the data path waits for etcd: the roster arrives on a watch channel.
//!
//! The cluster file still lists every node that may be a member (their
//! addresses and keys); etcd says which of them are members now.

use std::rc::Rc;

use shoal_core::error::Result;

use crate::cluster::state::Cluster;

/// A daemon's membership, while it is a member.
pub struct Members {
    #[cfg(feature = "etcd")]
    membership: shoal_membership::Membership,
}

/// How long a stopping node waits for etcd to take its leave; past it the
/// others remove it when its lease lapses.
#[cfg(feature = "etcd")]
const LEAVE_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// How often a member looks at when its lease was last renewed.
#[cfg(feature = "etcd")]
const LINK_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

impl Members {
    /// Joins the cluster's membership if the file keeps one (`None` for a
    /// static file), adopts the view that has this node, and follows the
    /// views after it under the cluster's supervisor.
    pub async fn join(cluster: &Rc<Cluster>) -> Result<Option<Self>> {
        let Some(config) = cluster.topology.membership.clone() else {
            return Ok(None);
        };
        #[cfg(feature = "etcd")]
        {
            use shoal_membership::{Joining, Membership, Settings};
            let settings = Settings {
                ttl: config.ttl,
                grace: config.grace,
                ..Settings::default()
            };
            let joining = Joining {
                node: cluster.me,
                incarnation: cluster.incarnation,
                record: cluster.topology.node_record(cluster.me)?,
                stamp: cluster.topology.membership_stamp(),
            };
            let membership = Membership::join(&config.url, settings, joining).await?;
            let mut roster = membership.roster();
            let first = roster.borrow_and_update().view.clone();
            cluster.adopt_view(first);
            let renewals = membership.renewals();
            let in_touch_within = config.ttl / 2;
            let following = Rc::downgrade(cluster);
            cluster.supervisor.spawn_local("membership", async move {
                let mut tick = tokio::time::interval(LINK_CHECK);
                loop {
                    let changed = tokio::select! {
                        changed = roster.changed() => changed.is_ok(),
                        _ = tick.tick() => true,
                    };
                    let Some(cluster) = following.upgrade().filter(|_| changed) else {
                        return;
                    };
                    // Out of touch well before the lease can lapse: the
                    // others may remove this node a TTL after its last
                    // renewal reached etcd, and by then it must not act as
                    // a home (a renewal every TTL/3 keeps it under TTL/2).
                    cluster.set_membership_link(renewals.since() < in_touch_within);
                    let view = roster.borrow_and_update().view.clone();
                    cluster.adopt_view(view);
                }
            });
            Ok(Some(Self { membership }))
        }
        #[cfg(not(feature = "etcd"))]
        {
            Err(shoal_core::MissingFeature::new(
                "etcd",
                format!("a cluster whose membership is in etcd ({})", config.url),
            )
            .into())
        }
    }

    /// Leaves at once (the others move this node's homes now instead of
    /// after its lease); a failure is logged: the lease lapses anyway.
    pub async fn leave(self) {
        #[cfg(feature = "etcd")]
        match tokio::time::timeout(LEAVE_WITHIN, self.membership.leave()).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "leaving the cluster's membership failed"),
            Err(_) => tracing::warn!("leaving the cluster's membership took too long"),
        }
    }
}

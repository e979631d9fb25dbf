//! This node's place in a membership kept in etcd (`[cluster] membership`,
//! the `etcd` feature): it joins once its peer service listens, adopts every
//! view etcd brings (`view_change.rs`), and leaves on a clean stop. Nothing
//! on the data path waits for etcd: the roster arrives on a watch channel.
//!
//! etcd says which nodes are members now; the nodes the cluster file does
//! not list are learned from the records members publish there
//! (`learning.rs`).

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

/// The most a member's "in touch" ends before its lease could lapse.
#[cfg(feature = "etcd")]
const TOUCH_MARGIN: std::time::Duration = std::time::Duration::from_millis(500);

/// How often a member looks at when its lease was last renewed.
#[cfg(feature = "etcd")]
const LINK_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

impl Members {
    /// Joins the cluster's membership if the file keeps one (`None` for a
    /// static file), adopts the view that has this node, and follows the
    /// views after it under the cluster's supervisor.
    pub async fn join(cluster: &Rc<Cluster>) -> Result<Option<Self>> {
        let Some(config) = cluster.topology().membership.clone() else {
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
                record: cluster.topology().node_record(cluster.me)?,
                stamp: cluster.topology().membership_stamp(),
            };
            let membership = Membership::join(&config.url, settings, joining).await?;
            let mut roster = membership.roster();
            let first = {
                let now = roster.borrow_and_update();
                cluster.learn_members(&now.records);
                now.view.clone()
            };
            cluster.adopt_view(first);
            let renewals = membership.renewals();
            // Out of touch before the lease can lapse: the others may remove
            // this node a TTL after its last renewal reached etcd, and by then
            // it must not act as a home. The margin (a third of the TTL, at
            // most 500 ms) covers a renewal's answer on its way back; an etcd
            // leader election (~1.3 s here) between renewals every TTL/3
            // stays inside it at the default TTL.
            let in_touch_within = config.ttl - (config.ttl / 3).min(TOUCH_MARGIN);
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
                    let (view, current) = {
                        let now = roster.borrow_and_update();
                        // Before the view that may have them as members.
                        cluster.learn_members(&now.records);
                        (now.view.clone(), now.current)
                    };
                    cluster.adopt_view(view);
                    // And only with the views it may have missed read again: a
                    // node back in touch acts on the view of now, not of before.
                    cluster.set_membership_link(current && renewals.since() < in_touch_within);
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

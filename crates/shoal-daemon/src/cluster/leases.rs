//! Heartbeats and leases. Every node heartbeats every peer; a peer's
//! heartbeats renew its lease on the references it holds here, and a lease
//! that runs out (the peer died or is cut off) or a new incarnation (it
//! restarted) drops them. The same tick returns idle loans, forgets loans of
//! silent owners and drives the directory rebuild.

use std::cell::RefCell;
use std::rc::Rc;

use shoal_cluster::proto::{HeartbeatReply, HeartbeatRequest};

use crate::cluster::peers::Reach;
use crate::cluster::state::Cluster;
use crate::principals;

impl Cluster {
    pub fn heartbeat_reply(&self) -> HeartbeatReply {
        HeartbeatReply {
            node: self.me,
            incarnation: self.incarnation,
        }
    }

    /// One heartbeat to `node`, bounded by half a lease (so a peer that
    /// hangs is declared down well before our lease at it runs out);
    /// records whether it answered.
    async fn heartbeat(&self, node: u32) {
        let request = HeartbeatRequest {
            node: self.me,
            incarnation: self.incarnation,
            fence_epoch: self.fence_epoch_for(node),
            fence_confirmed: self.fence_confirmed_to(node),
        };
        let call = self
            .peers
            .call(node, Reach::Try, "heartbeat", |mut p| async move {
                p.heartbeat(request).await
            });
        // `call` records it in the metrics; one not answered in time counts
        // as an error there (a miss).
        let limit = self.topology().lease / 2;
        let ok = matches!(tokio::time::timeout(limit, call).await, Ok(Ok(_)));
        if ok {
            self.peers.answered(node);
            // Before it counts as alive again (so before any create here can
            // claim those ids there anew).
            self.unregister_missed(node).await;
            // Drops of copies it missed (deleted objects it still serves).
            self.drops_missed(node).await;
            // Releases and undos of acquires whose answers were lost.
            self.resend_reference_calls(node).await;
        }
        self.peers.heartbeat_answered(node, ok);
        if !ok {
            // Known down from now: its objects are not read through its
            // index either (as no loan of it serves).
            self.stop_peer_reads_of_gone_owners();
        }
        self.heartbeats_sent.set(self.heartbeats_sent.get() + 1);
        self.rebuild.borrow_mut().readiness.heartbeat(node, ok);
    }

    /// The heartbeat loop, run under the supervisor for the daemon's life.
    /// Each peer's heartbeats run on their own task, so a slow peer never
    /// delays the others'.
    pub async fn run_heartbeats(self: Rc<Self>) {
        let mut ticker = tokio::time::interval(self.topology().heartbeat);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let in_flight = Rc::new(RefCell::new(vec![false; self.topology().slots()]));
        loop {
            ticker.tick().await;
            for node in self.others() {
                if std::mem::replace(&mut in_flight.borrow_mut()[node as usize], true) {
                    continue; // the previous heartbeat to it is still waiting
                }
                let (cluster, in_flight) = (self.clone(), in_flight.clone());
                self.supervisor.spawn_local("heartbeat", async move {
                    cluster.heartbeat(node).await;
                    in_flight.borrow_mut()[node as usize] = false;
                });
            }
            for node in self.peers.expired_leases() {
                // Not freed: its clients may still map what it held.
                self.fence(node);
            }
            self.confirm_fences();
            self.expire_quarantines();
            self.forget_loans_of_silent_owners();
            self.stop_peer_reads_of_gone_owners();
            let expired = self.expired_loans();
            self.release_later(expired);
            self.rebuild_tick();
            self.send_witness();
        }
    }

    /// Drops every reference `node` holds here (it died or restarted).
    fn reclaim_references_of(&self, node: u32, why: &str) {
        let client = principals::peer(node);
        self.node.mutate(|store| {
            store.disconnect(client);
            store.register_client(client);
        });
        // It numbers its calls afresh.
        self.ledger.borrow_mut().forget(node);
        tracing::warn!(node, "released the references node {node} held: {why}");
    }

    /// `from` is alive at `incarnation` (0: unknown, ignored): renews its
    /// lease; if the incarnation is new, drops its references here (it
    /// restarted) and lets the directory rebuild deal with it.
    pub fn heard_incarnation(self: &Rc<Self>, from: u32, incarnation: u64) {
        if incarnation == 0 {
            return;
        }
        if self.peers.heard_from(from, incarnation) {
            self.reclaim_references_of(from, "it restarted");
            self.release_quarantine(from, "it restarted");
        }
        self.heard(from, incarnation);
    }
}

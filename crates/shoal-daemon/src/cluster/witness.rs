//! Witnesses of the ids a node is home of itself (docs/cluster.md,
//! "Adoption"). When a member is removed for good, each home reports the
//! removed node's objects it knew of that no adopted backing store holds
//! as lost; the ids whose home was the removed node itself would die with
//! its directory, reported by nobody. So every member keeps, at the member
//! that becomes their home if it leaves ([`View::runner_up`]), the ids it
//! owns, has sealed and is home of: changes in a batch every heartbeat, and
//! all of them again after every view change (`reset`), since the runner-up
//! of each id moves with the view. At the removal, the witness hands them to
//! the departed node's reckoning (`departed.rs`) beside the ids it was home
//! of. What a node sealed within its last heartbeat before dying may not
//! have reached its witness: lost unreported. Only with a membership; a
//! static file removes nobody.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use shoal_cluster::ids::pack;
use shoal_cluster::proto::WitnessRequest;
use shoal_core::ObjectId;

use crate::cluster::peers::{join_all, Reach};
use crate::cluster::state::Cluster;

/// How long after a batch that failed (its witness down or behind) all is
/// sent again.
const RESET_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// Ids per call (5 MiB): a node home of millions of ids sends them in
/// several calls, each well under the peer RPC's message cap and timeout.
const CHUNK_IDS: usize = 1 << 18;

impl Cluster {
    fn witnessing(&self) -> bool {
        self.topology().membership.is_some()
    }

    /// Ids this node owns were published in its own directory (it is their
    /// home): their witness is told with the next batch.
    pub(crate) fn witness_sealed(&self, ids: &[ObjectId]) {
        if self.witnessing() {
            self.witness.borrow_mut().seal(ids.iter().copied());
        }
    }

    /// Ids this node owned and was home of are gone (deleted, evicted for
    /// good, aborted).
    pub(crate) fn witness_gone(&self, ids: &[ObjectId]) {
        if self.witnessing() {
            self.witness.borrow_mut().forget(ids.iter().copied());
        }
    }

    /// A new view: every id's runner-up may have moved; all is sent again
    /// (the reset drops the changes noted meanwhile: it carries them).
    pub(crate) fn witness_view_changed(&self) {
        self.witness.borrow_mut().reset_due = Some(Instant::now());
    }

    /// What `owner` asked this node to witness.
    pub(crate) fn witness_received(
        &self,
        owner: u32,
        epoch: u64,
        reset: bool,
        sealed: Vec<ObjectId>,
        gone: Vec<ObjectId>,
    ) {
        self.witness
            .borrow_mut()
            .receive(owner, epoch, reset, sealed, gone);
    }

    /// The ids `node` (removed from the view) was home of and owned, as
    /// this node witnessed them.
    pub(crate) fn witnessed_of(&self, node: u32) -> Vec<ObjectId> {
        self.witness
            .borrow_mut()
            .held
            .remove(&node)
            .map(|(_, ids)| ids.into_iter().collect())
            .unwrap_or_default()
    }

    /// Sends what changed since the last batch, or everything after a view
    /// change (each heartbeat; one batch at a time).
    pub(crate) fn send_witness(self: &Rc<Self>) {
        if !self.witnessing() {
            return;
        }
        let view = self.view();
        let me = self.me;
        let (reset, sealed, gone) = {
            let mut witness = self.witness.borrow_mut();
            if witness.sending {
                return;
            }
            let reset = witness.reset_due.is_some_and(|at| at <= Instant::now());
            if reset {
                witness.sealed.clear();
                witness.gone.clear();
                witness.reset_due = None;
                let mine = self.directory.borrow().sealed_of(me);
                (true, mine, Vec::new())
            } else if witness.sealed.is_empty() && witness.gone.is_empty() {
                return;
            } else {
                let sealed = witness.sealed.drain().collect();
                let gone = witness.gone.drain().collect();
                (false, sealed, gone)
            }
        };
        if !view.contains(me) {
            return;
        }
        // Per witness: a reset goes to every other member (an empty one
        // drops what it kept under an older view); a batch only where ids go.
        let mut batches: HashMap<u32, (Vec<ObjectId>, Vec<ObjectId>)> = HashMap::new();
        if reset {
            for &member in view.members().iter().filter(|&&m| m != me) {
                batches.entry(member).or_default();
            }
        }
        for id in sealed {
            if let Some(witness) = view.runner_up(&id) {
                batches.entry(witness).or_default().0.push(id);
            }
        }
        for id in gone {
            if let Some(witness) = view.runner_up(&id) {
                batches.entry(witness).or_default().1.push(id);
            }
        }
        if batches.is_empty() {
            return;
        }
        self.witness.borrow_mut().sending = true;
        let cluster = self.clone();
        let epoch = view.epoch();
        self.supervisor.spawn_local("witness", async move {
            // Per witness one call after another (the reset first: a later
            // chunk adds to it), the witnesses at once.
            let calls = batches.into_iter().map(|(node, (sealed, gone))| {
                let cluster = cluster.clone();
                async move {
                    for request in requests(epoch, reset, &sealed, &gone, CHUNK_IDS) {
                        cluster
                            .peers
                            .call(node, Reach::Try, "witness", |mut p| async move {
                                p.witness(request).await
                            })
                            .await?;
                    }
                    Ok(())
                }
            });
            let failed = join_all(calls)
                .await
                .iter()
                .filter(|r: &&shoal_core::error::Result<()>| r.is_err())
                .count();
            let mut witness = cluster.witness.borrow_mut();
            witness.sending = false;
            if failed > 0 {
                // Lost changes are not sent again one by one: all are, a
                // little later (a witness that is down is removed meanwhile,
                // or answers again).
                witness
                    .reset_due
                    .get_or_insert(Instant::now() + RESET_AFTER_FAILURE);
                tracing::debug!(failed, "witness batches failed; all is sent again");
            }
        });
    }
}

/// One witness's batch as calls of at most `chunk` ids each way: the first
/// carries `reset`, the rest add to it; at least one call (an empty reset
/// drops what the witness kept).
fn requests(
    epoch: u64,
    reset: bool,
    sealed: &[ObjectId],
    gone: &[ObjectId],
    chunk: usize,
) -> Vec<WitnessRequest> {
    let calls = sealed
        .len()
        .div_ceil(chunk)
        .max(gone.len().div_ceil(chunk))
        .max(1);
    let part = |ids: &[ObjectId], i: usize| {
        let start = (i * chunk).min(ids.len());
        pack(&ids[start..(start + chunk).min(ids.len())])
    };
    (0..calls)
        .map(|i| WitnessRequest {
            epoch,
            reset: reset && i == 0,
            adds: part(sealed, i),
            removes: part(gone, i),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_goes_in_chunks_with_the_reset_first() {
        let ids: Vec<ObjectId> = (0..7u8).map(|i| ObjectId([i; 20])).collect();
        let calls = requests(9, true, &ids, &ids[..2], 3);
        let counts: Vec<(bool, usize, usize)> = calls
            .iter()
            .map(|r| (r.reset, r.adds.len() / 20, r.removes.len() / 20))
            .collect();
        assert_eq!(counts, [(true, 3, 2), (false, 3, 0), (false, 1, 0)]);
        assert!(calls.iter().all(|r| r.epoch == 9));
        let sent: Vec<u8> = calls.iter().flat_map(|r| r.adds.clone()).collect();
        assert_eq!(sent, pack(&ids));
        // An empty reset is still sent; an empty change is one empty call.
        let empty = requests(9, true, &[], &[], 3);
        assert_eq!(empty.len(), 1);
        assert!(empty[0].reset && empty[0].adds.is_empty());
    }
}

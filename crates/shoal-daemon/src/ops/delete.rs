//! Delete: an object goes from view now and its memory when its last
//! reference does. In a cluster, the loans other nodes hold on it are
//! revoked and its id leaves its home's directory before the delete is
//! answered, so no get anywhere sees the old object afterwards and the id
//! can be created again at once.

use shoal_core::error::ErrorKind;
use shoal_core::ObjectId;

use crate::ops::Ops;

impl Ops {
    /// Per id, `None` or why it could not be deleted. With `forward`, ids
    /// not here are deleted at their owners (a local client's delete; a
    /// peer's delete names only ids it found here).
    pub(crate) async fn delete(&self, ids: &[ObjectId], forward: bool) -> Vec<Option<ErrorKind>> {
        let _timed = self.node.metrics().time(crate::metrics::Op::Delete);
        let errors = self.delete_here(ids, forward);
        self.finish_delete(ids, errors, forward).await
    }

    /// The first half of [`delete`](Self::delete), which never waits: the
    /// objects leave the store and the name index (no get here finds them
    /// from now on). Per id, `None` or why not; [`finish_delete`] commits
    /// it below and in the cluster, and is needed only where there are
    /// tiers or peers ([`delete_waits`](Self::delete_waits)).
    ///
    /// [`finish_delete`]: Self::finish_delete
    pub(crate) fn delete_here(&self, ids: &[ObjectId], forward: bool) -> Vec<Option<ErrorKind>> {
        let cluster = self.cluster.as_ref();
        let errors: Vec<Option<ErrorKind>> = self.node.mutate(|store| {
            ids.iter()
                .map(|id| {
                    // Deleting a network-mode copy deletes the object at its owner.
                    if forward && cluster.is_some_and(|c| c.is_copy(id)) {
                        let _ = store.delete(id);
                        return Some(ErrorKind::ObjectNotFound);
                    }
                    match store.delete(id) {
                        Ok(()) => None,
                        // On a tier only, or being restored from one.
                        Err(_) if self.node.held_below(id) => None,
                        Err(err) => Some(err.kind()),
                    }
                })
                .collect()
        });
        let mut names = self.node.names().borrow_mut();
        for (id, _) in ids.iter().zip(&errors).filter(|(_, e)| e.is_none()) {
            names.forget(id);
        }
        errors
    }

    /// Whether a delete has more to do after [`delete_here`](Self::delete_here):
    /// tiers to commit it to, or peers to tell.
    pub(crate) fn delete_waits(&self) -> bool {
        self.tiers.is_some() || self.cluster.is_some()
    }

    /// The second half of [`delete`](Self::delete): the deletes
    /// [`delete_here`](Self::delete_here) made (`errors[i]` is `None`) are
    /// committed on the tiers, the cluster's loans revoked and its
    /// directory told; with `forward`, ids not here are deleted at their
    /// owners.
    pub(crate) async fn finish_delete(
        &self,
        ids: &[ObjectId],
        mut errors: Vec<Option<ErrorKind>>,
        forward: bool,
    ) -> Vec<Option<ErrorKind>> {
        let cluster = self.cluster.as_ref();
        if let Some(tiers) = &self.tiers {
            // Answered only once the deletes are committed below: no crash
            // brings these objects back.
            let deleted: Vec<usize> = (0..ids.len()).filter(|&i| errors[i].is_none()).collect();
            let wanted: Vec<ObjectId> = deleted.iter().map(|&i| ids[i]).collect();
            // A delete not committed there is not acknowledged: the object
            // is still on its tier (and served from it).
            for (&i, err) in deleted.iter().zip(tiers.delete(&wanted).await) {
                if let Some(err) = err {
                    errors[i] = Some(err.kind());
                }
            }
        }
        let Some(cluster) = cluster else {
            return errors;
        };
        let deleted: Vec<ObjectId> = (0..ids.len())
            .filter(|&i| errors[i].is_none())
            .map(|i| ids[i])
            .collect();
        cluster.revoke(cluster.holders(&deleted)).await;
        cluster.unregister(&deleted).await;
        if forward {
            // Not here: maybe on another node, which deletes it there.
            let elsewhere: Vec<usize> = (0..ids.len())
                .filter(|&i| errors[i] == Some(ErrorKind::ObjectNotFound))
                .collect();
            if !elsewhere.is_empty() {
                let wanted: Vec<ObjectId> = elsewhere.iter().map(|&i| ids[i]).collect();
                let results = cluster.delete_remote(&wanted).await;
                for (&i, result) in elsewhere.iter().zip(results) {
                    errors[i] = result;
                }
            }
        }
        errors
    }
}

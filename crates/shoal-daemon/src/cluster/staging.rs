//! Staging buffers: where this node's clients write objects they
//! allocated on nodes reached over the network, until the seal pushes them
//! there (`push`). Bookkeeping only.

use std::collections::{HashMap, HashSet};

use shoal_core::ids::ClientId;
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

/// Where a client writes an object allocated on a node reached over the
/// network.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stage {
    /// The buffer's own id in this node's store.
    pub id: ObjectId,
    pub location: ObjectLocation,
    /// Pushed and sealed on its node, sealed without releasing: kept until
    /// the client releases the object (its buffer still shows the bytes).
    pub sealed: bool,
}

/// The staging buffers of this node's clients.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    /// client → object id → its buffer.
    by_client: HashMap<ClientId, HashMap<ObjectId, Stage>>,
    /// The buffers' own ids: freeing one unregisters nothing.
    ids: HashSet<ObjectId>,
}

impl Staging {
    /// Records the buffers `stages` (at `locations`) a client writes
    /// `objects` into.
    pub(crate) fn add(
        &mut self,
        client: ClientId,
        objects: &[ObjectId],
        stages: &[ObjectId],
        locations: &[ObjectLocation],
    ) {
        self.ids.extend(stages);
        let mine = self.by_client.entry(client).or_default();
        for ((object, &id), &location) in objects.iter().zip(stages).zip(locations) {
            mine.insert(
                *object,
                Stage {
                    id,
                    location,
                    sealed: false,
                },
            );
        }
    }

    /// Whether `id` is a buffer's own id.
    pub(crate) fn is_stage(&self, id: &ObjectId) -> bool {
        self.ids.contains(id)
    }

    /// The buffer of `client`'s object `id`.
    pub(crate) fn get(&self, client: ClientId, id: &ObjectId) -> Option<Stage> {
        self.by_client.get(&client)?.get(id).copied()
    }

    /// Marks the buffers of `ids` pushed and sealed.
    pub(crate) fn sealed(&mut self, client: ClientId, ids: &[ObjectId]) {
        if let Some(mine) = self.by_client.get_mut(&client) {
            for id in ids {
                if let Some(stage) = mine.get_mut(id) {
                    stage.sealed = true;
                }
            }
        }
    }

    /// Takes out the buffers of `client`'s objects `ids` (`None`: all of
    /// them; `sealed_only`: of those, the ones sealed), still counted as
    /// buffers' ids until [`forget`](Self::forget).
    pub(crate) fn take(
        &mut self,
        client: ClientId,
        ids: Option<&[ObjectId]>,
        sealed_only: bool,
    ) -> Vec<Stage> {
        let Some(mine) = self.by_client.get_mut(&client) else {
            return Vec::new();
        };
        let picked: Vec<ObjectId> = match ids {
            Some(ids) => ids
                .iter()
                .filter(|id| mine.get(id).is_some_and(|s| s.sealed || !sealed_only))
                .copied()
                .collect(),
            None => mine
                .iter()
                .filter(|(_, s)| s.sealed || !sealed_only)
                .map(|(id, _)| *id)
                .collect(),
        };
        let taken = picked.iter().filter_map(|id| mine.remove(id)).collect();
        if mine.is_empty() {
            self.by_client.remove(&client);
        }
        taken
    }

    /// Forgets freed buffers' ids.
    pub(crate) fn forget(&mut self, stages: &[Stage]) {
        for stage in stages {
            self.ids.remove(&stage.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location(offset: u64) -> ObjectLocation {
        ObjectLocation {
            offset,
            data_size: 10,
            meta_size: 0,
        }
    }

    #[test]
    fn buffers_are_taken_by_client_and_object_and_their_ids_kept_until_forgotten() {
        let mut staging = Staging::default();
        let (a, b) = (ObjectId([1; 20]), ObjectId([2; 20]));
        let (sa, sb) = (ObjectId([11; 20]), ObjectId([12; 20]));
        staging.add(7, &[a, b], &[sa, sb], &[location(0), location(64)]);
        assert!(staging.is_stage(&sa) && !staging.is_stage(&a));
        assert_eq!(staging.get(7, &b).unwrap().location, location(64));
        assert!(staging.get(8, &b).is_none());
        staging.sealed(7, &[a]);
        assert!(staging.take(7, Some(&[b]), true).is_empty(), "not sealed");
        let taken = staging.take(7, None, true);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].id, sa);
        assert!(staging.is_stage(&sa), "until forgotten");
        staging.forget(&taken);
        assert!(!staging.is_stage(&sa));
        assert!(staging.get(7, &a).is_none() && staging.get(7, &b).is_some());
        let rest = staging.take(7, Some(&[a, b, b]), false);
        assert_eq!(rest.len(), 1);
        assert!(staging.take(7, None, false).is_empty());
    }
}

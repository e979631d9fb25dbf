//! One async lock per object id, so operations on one object (a drain, a
//! restore, a delete) run one at a time, in the order their futures first
//! run, while operations on different objects overlap. Entries exist only
//! while someone holds or waits for them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use shoal_core::ids::ObjectId;
use tokio::sync::OwnedMutexGuard;

#[derive(Default)]
pub(crate) struct IdLocks {
    map: Mutex<HashMap<ObjectId, Arc<tokio::sync::Mutex<()>>>>,
}

pub(crate) struct IdGuard<'a> {
    locks: &'a IdLocks,
    id: ObjectId,
    guard: Option<OwnedMutexGuard<()>>,
}

impl IdLocks {
    pub(crate) async fn lock(&self, id: ObjectId) -> IdGuard<'_> {
        let mutex = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_default()
            .clone();
        let guard = mutex.lock_owned().await;
        IdGuard {
            locks: self,
            id,
            guard: Some(guard),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

impl Drop for IdGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.map.lock().unwrap_or_else(|p| p.into_inner());
        // Clones are taken under the map lock, so a count of 1 (the map's own)
        // means nobody holds or waits for this id.
        if map.get(&self.id).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serialises_one_id_and_forgets_idle_ones() {
        let locks = Arc::new(IdLocks::default());
        let (a, b) = (ObjectId::random(), ObjectId::random());
        let first = locks.lock(a).await;
        let _other = locks.lock(b).await; // a different id does not wait
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let _g = locks.lock(a).await;
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(first);
        waiter.await.unwrap();
        assert_eq!(locks.len(), 1); // only b, still held
    }
}

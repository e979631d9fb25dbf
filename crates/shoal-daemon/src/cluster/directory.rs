//! As a home node: the directory of the ids homed here (who owns each,
//! where it is sealed, which nodes keep copies). Refused while this node's
//! own directory is being rebuilt after a restart (`rebuild.rs`).

use shoal_cluster::proto::{Entry, LookupReply, Statuses};
use shoal_cluster::rebuild::Holding;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

use crate::cluster::state::{to_proto, Cluster};

fn codes(statuses: Vec<Option<ErrorKind>>) -> Statuses {
    Statuses {
        codes: statuses
            .into_iter()
            .map(|s| s.map_or(0, |k| u32::from(k.code())))
            .collect(),
    }
}

pub(super) fn rebuilding(node: u32) -> ShoalError {
    ShoalError::new(
        ErrorKind::NodeUnavailable,
        format!("node {node} is rebuilding its directory after a restart or a view change"),
    )
}

fn cut_off(node: u32) -> ShoalError {
    ShoalError::new(
        ErrorKind::NodeUnavailable,
        format!(
            "node {node} lost the cluster's membership service while its peers did not: it \
             keeps no directory until it is back (its homes may have moved)"
        ),
    )
}

fn not_home(node: u32, id: &ObjectId) -> ShoalError {
    ShoalError::new(
        ErrorKind::NodeUnavailable,
        format!("node {node} is not the home of {id} in its view (the view changed)"),
    )
}

impl Cluster {
    /// Claims ids for `owner`; per id a status (`ObjectExists` if another
    /// node claimed it; `NodeUnavailable` while rebuilding).
    pub fn directory_register(&self, ids: &[ObjectId], owner: u32) -> Statuses {
        // Not ready, or asked by a node whose view has other homes for some
        // ids (the check of its epoch passed just before this node's view
        // changed): the caller asks again by its newer view.
        if !self.directory_ready()
            || !self.acts_as_home()
            || ids.iter().any(|id| self.home(id) != self.me)
        {
            // Ids held elsewhere may not be restored here yet.
            let code = u32::from(ErrorKind::NodeUnavailable.code());
            return Statuses {
                codes: vec![code; ids.len()],
            };
        }
        // An id whose deleted object still has a copy somewhere (a drop not
        // delivered yet) is not claimed again: the copy would answer gets
        // for it with the old bytes. All or none, as every register.
        if ids.iter().any(|id| self.drop_owed(id)) {
            let in_use = u32::from(ErrorKind::ObjectInUse.code());
            let exists = u32::from(ErrorKind::ObjectExists.code());
            let directory = self.directory.borrow();
            return Statuses {
                codes: ids
                    .iter()
                    .map(|id| {
                        if self.drop_owed(id) {
                            in_use
                        } else if directory.lookup(id).is_some() {
                            exists
                        } else {
                            0
                        }
                    })
                    .collect(),
            };
        }
        codes(self.directory.borrow_mut().register(ids, owner))
    }

    /// Forgets the ids; returns the copies (node, id) that must be dropped.
    pub fn directory_unregister(&self, ids: &[ObjectId], owner: u32) -> Vec<(u32, ObjectId)> {
        if owner == self.me {
            self.witness_gone(ids);
        }
        self.directory.borrow_mut().unregister(ids, owner)
    }

    pub fn directory_add_checked_copies(
        &self,
        ids: &[ObjectId],
        owner: u32,
        locations: &[ObjectLocation],
        node: u32,
    ) -> Vec<bool> {
        self.directory
            .borrow_mut()
            .add_checked_copies(ids, owner, locations, node)
    }

    pub fn directory_publish(&self, ids: &[ObjectId], locations: &[ObjectLocation], owner: u32) {
        if owner == self.me {
            self.witness_sealed(ids);
        }
        self.directory.borrow_mut().publish(ids, locations, owner);
    }

    /// A lookup at this node as a home; refused while it rebuilds.
    pub fn local_lookup(&self, ids: &[ObjectId]) -> Result<LookupReply> {
        if !self.directory_ready() {
            return Err(rebuilding(self.me));
        }
        if !self.acts_as_home() {
            return Err(cut_off(self.me));
        }
        if let Some(id) = ids.iter().find(|id| self.home(id) != self.me) {
            return Err(not_home(self.me, id));
        }
        let directory = self.directory.borrow();
        Ok(LookupReply {
            entries: ids
                .iter()
                .map(|id| match directory.lookup(id) {
                    Some(e) => Entry {
                        known: true,
                        owner: e.owner,
                        sealed: e.sealed.is_some(),
                        location: e.sealed.as_ref().map(to_proto),
                    },
                    None => Entry::default(),
                })
                .collect(),
        })
    }

    /// A peer's re-registration of what it holds whose home is this node.
    pub fn directory_restore(
        &self,
        from: u32,
        sealed: &[(ObjectId, ObjectLocation)],
        pending: &[ObjectId],
        copies: &[ObjectId],
    ) -> Statuses {
        let ids: Vec<ObjectId> = sealed
            .iter()
            .map(|(id, _)| *id)
            .chain(pending.iter().copied())
            .collect();
        let locations: Vec<Holding> = sealed
            .iter()
            .map(|(_, l)| Some(*l))
            .chain(pending.iter().map(|_| None))
            .collect();
        if from == self.me {
            let ids: Vec<ObjectId> = sealed.iter().map(|(id, _)| *id).collect();
            self.witness_sealed(&ids);
        }
        let ready = self.rebuild.borrow().readiness.is_ready();
        let mut directory = self.directory.borrow_mut();
        let statuses = directory.restore(&ids, &locations, from);
        if ready {
            directory.add_copies(copies, from);
        } else {
            directory.restore_copies(copies, from);
        }
        codes(statuses)
    }
}

//! Creates in lent space (docs/fast-path.md, pieces 2 and 3): the daemon
//! lends a client a block of free space (`Lend`), the client carves objects
//! from it without asking, and seals them, releases references and gives
//! blocks back through its write channel. This applies what the channel
//! carries, after checking every record against the daemon's own records
//! (`Store::create_lent`, `Store::give_back`): from then on the object is
//! an ordinary unsealed object, sealed, aborted and listed as one made
//! through the socket.

use shoal_core::durability::Durability;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::fast_path::writes::Record;
use shoal_core::ids::ClientId;
use shoal_core::ObjectId;

use crate::ops::Ops;
use crate::tiers::check_level;

/// The block a client is lent when it asks: objects up to an eighth of it
/// are created in it (the client decides; larger ones take the socket).
pub(super) const LEASE: u64 = 1 << 20;

impl Ops {
    /// Lends `client` a block for creates without a round trip: `None` when
    /// the store is too full to lend, or this daemon does not offer write
    /// channels (a cluster node: a seal there must reach the id's home
    /// before it is answered, which the channel does not wait for).
    pub(crate) fn lend(&self, client: ClientId, bytes: u64) -> Option<(u64, u64, u64)> {
        if self.cluster.is_some() || !self.node.write_channels().has(client) {
            return None;
        }
        let (lease, block) = self
            .node
            .mutate(|s| s.lend(client, bytes.clamp(1, LEASE)))?;
        Some((lease, block.offset, block.len))
    }

    /// Applies the records `client` published (up to a round's worth).
    /// Returns how many; a broken channel ends the client's connection.
    fn apply_writes(&self, client: ClientId) -> usize {
        let records = match self.node.write_channels().take(client) {
            Ok(records) => records,
            Err(err) => {
                tracing::warn!(client, %err, "write channel broken: dropping the client");
                self.node.kick(client);
                return 0;
            }
        };
        let n = records.len();
        if n > 0 {
            self.node.count_writes(client, n);
        }
        for (sequence, record) in records {
            match record {
                Record::Create { id, location } => {
                    let created = if self.node.held_below(&id) {
                        // An object that left memory for a tier still exists.
                        Err(ShoalError::exists(&id))
                    } else {
                        self.node.mutate(|s| s.create_lent(client, id, location))
                    };
                    self.answer(client, sequence, created);
                }
                Record::Seal {
                    id,
                    release,
                    durability,
                } => self.seal_written(client, sequence, id, release, durability),
                Record::Abort { id } => {
                    let aborted = self.node.mutate(|s| {
                        let aborted = s.abort(client, &id);
                        if aborted.is_ok() {
                            self.node.names().borrow_mut().forget(&id);
                        }
                        aborted
                    });
                    self.answer(client, sequence, aborted);
                }
                Record::Release { id } => {
                    self.release(client, &[id]);
                    self.node.write_channels().answer(client, sequence, None);
                }
                Record::GiveBack { lease } => {
                    let outcome = self.node.mutate(|s| s.give_back(client, lease));
                    self.answer(client, sequence, outcome);
                }
                Record::Delete { .. } | Record::Contains { .. } => self
                    .node
                    .write_channels()
                    .defer_query(client, sequence, record),
            }
        }
        n
    }

    /// Applies every client's pending records (a round: up to [`ROUND`]
    /// of each); returns how many. A round that finds none answers the
    /// queries taken before it: every record published before them is
    /// applied by then. Callers repeat rounds until one returns 0.
    ///
    /// [`ROUND`]: crate::node::write_channels::ROUND
    pub(crate) fn apply_all_writes(&self) -> usize {
        let clients = self.node.write_channels().pending();
        let n = clients.into_iter().map(|c| self.apply_writes(c)).sum();
        if n == 0 {
            self.answer_queries();
        }
        n
    }

    fn answer(&self, client: ClientId, sequence: u64, outcome: Result<()>) {
        let kind = outcome.err().map(|e| {
            tracing::debug!(client, %e, "write record refused");
            e.kind()
        });
        self.node.write_channels().answer(client, sequence, kind);
    }

    /// The deletes and contains asked through write channels, answered as
    /// the socket's, in the order they were taken. Called when a round
    /// found no record: every record published before them — their
    /// client's and every other client's (a seal there before this delete
    /// here) — is applied. Answered on the spot, no task: a delete leaves
    /// the store here and now, and only its commit to the tiers (a store
    /// with tiers) is waited for on a task of its own.
    fn answer_queries(&self) {
        for (client, sequence, record) in self.node.write_channels().take_queries() {
            match record {
                Record::Contains { id } => {
                    let absent = (!self.contains(&id)).then_some(ErrorKind::ObjectNotFound);
                    self.node.write_channels().answer(client, sequence, absent);
                }
                Record::Delete { id } => self.delete_written(client, sequence, id),
                _ => unreachable!("only queries are deferred"),
            }
        }
    }

    /// A delete record: the object leaves the store now; answered now, or
    /// once the tiers committed the delete.
    fn delete_written(&self, client: ClientId, sequence: u64, id: ObjectId) {
        let timed = self.node.metrics().time(crate::metrics::Op::Delete);
        let here = self.delete_here(&[id], true);
        if !self.delete_waits() {
            self.node.write_channels().answer(client, sequence, here[0]);
            return;
        }
        drop(timed);
        let ops = self.rc();
        self.supervisor
            .spawn_local("write channel delete", async move {
                let _timed = ops.node.metrics().time(crate::metrics::Op::Delete);
                let outcome = ops.finish_delete(&[id], here, true).await.remove(0);
                ops.node.write_channels().answer(client, sequence, outcome);
            });
    }

    /// A seal record: applied like the socket's seal, answered now (memory
    /// durability) or once the tiers hold a copy at the level asked.
    fn seal_written(
        &self,
        client: ClientId,
        sequence: u64,
        id: ObjectId,
        release: bool,
        durability: Option<Durability>,
    ) {
        let _timed = self.node.metrics().time(crate::metrics::Op::Seal);
        let level = durability.unwrap_or_else(|| {
            self.tiers
                .as_ref()
                .map_or(Durability::Memory, |t| t.default_durability())
        });
        let sealed = check_level(self.tiers.as_deref(), level)
            .and_then(|()| self.node.mutate(|s| s.seal(client, &[id], release)));
        if sealed.is_ok() {
            // A name given while it was written is bound before the tiers
            // write its record (so the name is durable with it) and before
            // the answer (so a resolve after the seal finds it).
            let replaced = self.bind_pending(&[id]);
            self.delete_replaced_soon(replaced);
        }
        if sealed.is_err() || level == Durability::Memory {
            if sealed.is_ok() {
                if let Some(tiers) = &self.tiers {
                    tiers.sealed_with(&[id], level);
                }
            }
            self.answer(client, sequence, sealed);
            return;
        }
        let tiers = self.tiers.clone().expect("checked by check_level");
        tiers.sealed_with(&[id], level);
        let ops = self.rc();
        self.supervisor
            .spawn_local("durable lent seal", async move {
                let failure = tiers.wait_durable(&[id], level, None).await.remove(0);
                let outcome = failure.map_or(Ok(()), |err| {
                    Err(ShoalError::new(
                        err.kind(),
                        format!(
                        "sealed in memory, but object {id} did not reach durability {level}: {}",
                        err.message()
                    ),
                    ))
                });
                ops.answer(client, sequence, outcome);
            });
    }
}

//! Gets of other nodes' objects without a round trip (docs/fast-path.md
//! "Gets of other nodes' objects"): in a mapped, coherent cluster whose
//! daemons share a host, a client reads an owner's index itself and counts
//! its references in a table the owner reads before it frees memory, as a
//! local client does.
//!
//! - As a holder: for each client that asks, one table per owner (a sealed
//!   memfd made here, attached at the owner with `AttachReads`), handed to
//!   the client with the owner's index. The table is revoked when the
//!   client leaves (the owner then ignores its counts) and stopped when the
//!   owner seems gone — silent for most of a lease, restarted, or fencing
//!   this node — so no new get counts where the owner may have stopped
//!   looking.
//! - As an owner: `AttachReads` maps a peer's table under the peer's
//!   principal; it goes with the peer's other references (its restart, or
//!   the end of its quarantine).
//!
//! Tables and the index cross between daemons as `/proc/PID/fd/FD`, which
//! reopens the same sealed memfd: so a client can neither resize what a
//! daemon maps nor write the index. It works between processes of one
//! host only; anywhere else the holder finds no index and its clients take
//! the Acquire path.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use shoal_cluster::proto::{AttachReadsReply, AttachReadsRequest};
use shoal_core::coherence::CoherenceMode;
use shoal_core::error::{Result, ShoalError};
use shoal_core::fast_path::index::IndexReader;
use shoal_core::fast_path::readers::PeerTable;
use shoal_core::ids::ClientId;
use tonic::Status;

use crate::cluster::peer_tables::{dup, Attached, OwnerIndex, PeerView};
use crate::cluster::peers::Reach;
use crate::cluster::state::Cluster;
use crate::principals;

impl Cluster {
    /// Whether this node's clients may read `owner`'s index: its memory is
    /// mapped here, the fabric is coherent, it is up at a known incarnation.
    fn peer_reads_possible(&self, owner: u32) -> Option<u64> {
        if owner == self.me
            || self.is_network(owner)
            || self.topology().coherence != CoherenceMode::Coherent
            || !self.is_alive(owner)
        {
            return None;
        }
        self.peers.incarnation_of(owner).filter(|&i| i != 0)
    }

    /// Tables for `client` at every owner that offers its index (one
    /// `AttachReads` per owner; an owner that refuses or fails is left out:
    /// the client's gets of its objects take the Acquire path).
    pub async fn peer_reads_for(&self, client: ClientId) -> Vec<PeerView> {
        // Asked again (an owner it had no view of may be up now): the tables
        // it has at owners still there are handed over again; the others are
        // stopped, never revoked, since it may still hold what it counted.
        let mut kept = self.keep_tables_of(client);
        let mut views = Vec::new();
        for owner in self.others().collect::<Vec<_>>() {
            let Some(generation) = self.peer_reads_possible(owner) else {
                continue;
            };
            if let Some(at) = kept.iter().position(|v| v.owner == owner) {
                views.push(kept.swap_remove(at));
                continue;
            }
            match self.attach_at(client, owner, generation).await {
                Ok(Some(view)) => views.push(view),
                Ok(None) => {}
                Err(err) => tracing::info!(owner, %err, "no peer reads at node {owner} for now"),
            }
        }
        views
    }

    /// `client`'s tables at owners still there at the same incarnation (as
    /// views to hand over again); the rest are stopped.
    fn keep_tables_of(&self, client: ClientId) -> Vec<PeerView> {
        let mut reads = self.peer_reads.borrow_mut();
        let Some(tables) = reads.tables.remove(&client) else {
            return Vec::new();
        };
        let (current, gone): (Vec<Attached>, Vec<Attached>) = tables
            .into_iter()
            .partition(|a| self.peer_reads_possible(a.owner) == Some(a.generation));
        for attached in &gone {
            attached.table.stop();
        }
        reads.stopped.extend(gone);
        reads.prune_stopped();
        let views = current
            .iter()
            .filter_map(|a| {
                let index = reads.indexes.get(&a.owner)?;
                Some(PeerView {
                    owner: a.owner,
                    generation: a.generation,
                    index: dup(index.file.as_fd()).ok()?,
                    table: dup(a.table.fd()).ok()?,
                })
            })
            .collect();
        if !current.is_empty() {
            reads.tables.insert(client, current);
        }
        views
    }

    async fn attach_at(
        &self,
        client: ClientId,
        owner: u32,
        generation: u64,
    ) -> Result<Option<PeerView>> {
        if self.peer_reads.borrow().refused.get(&owner) == Some(&generation) {
            return Ok(None);
        }
        let Some((index, slots)) = self.owner_index(owner, generation).await? else {
            return Ok(None);
        };
        let table = PeerTable::create(slots)?;
        let key = {
            let mut reads = self.peer_reads.borrow_mut();
            reads.next_key += 1;
            reads.next_key
        };
        let reply = self
            .call_attach_reads(owner, table.fd().as_raw_fd(), key)
            .await?;
        if reply.generation != generation {
            // It restarted meanwhile: the table went with our references there.
            return Ok(None);
        }
        let view = PeerView {
            owner,
            generation,
            index,
            table: dup(table.fd())?,
        };
        self.peer_reads
            .borrow_mut()
            .tables
            .entry(client)
            .or_default()
            .push(Attached {
                client,
                owner,
                generation,
                table,
            });
        Ok(Some(view))
    }

    /// `owner`'s index at `generation`, opened once per incarnation: a
    /// `dup` of it and its slots. `None`: it is not on this host.
    async fn owner_index(&self, owner: u32, generation: u64) -> Result<Option<(OwnedFd, u32)>> {
        let known = self
            .peer_reads
            .borrow()
            .indexes
            .get(&owner)
            .filter(|i| i.generation == generation)
            .map(|i| Ok::<_, ShoalError>((dup(i.file.as_fd())?, i.reader.slots())));
        if let Some(found) = known {
            return found.map(Some);
        }
        // An owner without a fast path, or not ready: asked again when a
        // client asks next.
        let reply = self.call_attach_reads(owner, -1, 0).await?;
        if reply.generation != generation {
            return Ok(None);
        }
        // Another host's process of that number, an fd that is no index:
        // not asked again at this incarnation.
        let opened = open_in(reply.pid, reply.index_fd, false).and_then(|file| {
            let index = IndexReader::attach(file.as_fd()).ok()?;
            (index.slots() == reply.slots).then_some((file, index))
        });
        let Some((file, reader)) = opened else {
            tracing::info!(
                owner,
                "node {owner}'s index cannot be opened here: its objects take the Acquire path"
            );
            self.peer_reads
                .borrow_mut()
                .refused
                .insert(owner, generation);
            return Ok(None);
        };
        let found = (dup(file.as_fd())?, reader.slots());
        self.peer_reads.borrow_mut().indexes.insert(
            owner,
            OwnerIndex {
                generation,
                file,
                reader,
            },
        );
        Ok(Some(found))
    }

    /// One `AttachReads` to `owner`: of this process's descriptor `fd` of a
    /// table under `key`, or (`fd` -1) only to learn its index.
    async fn call_attach_reads(&self, owner: u32, fd: i32, key: u64) -> Result<AttachReadsReply> {
        let request = AttachReadsRequest {
            incarnation: self.incarnation,
            pid: std::process::id(),
            fd,
            key,
        };
        self.peers
            .call(owner, Reach::FailFast, "attach_reads", |mut p| async move {
                p.attach_reads(request).await
            })
            .await
    }

    /// The owner whose index publishes `id` now, among the indexes this node
    /// opened for its clients: who to ask when the id's home cannot say.
    pub(crate) fn owner_by_index(&self, id: &shoal_core::ObjectId) -> Option<u32> {
        let reads = self.peer_reads.borrow();
        reads.indexes.iter().find_map(|(&owner, index)| {
            (self.peer_reads_possible(owner) == Some(index.generation)
                && index.reader.lookup(id).is_some())
            .then_some(owner)
        })
    }

    /// `client` left: its tables are revoked, so their owners stop
    /// counting what it held.
    pub fn peer_reads_gone(&self, client: ClientId) {
        let mut reads = self.peer_reads.borrow_mut();
        let gone = reads.tables.remove(&client);
        for attached in gone.into_iter().flatten() {
            attached.table.revoke();
        }
        reads.stopped.retain(|a| {
            if a.client == client {
                a.table.revoke();
            }
            a.client != client
        });
    }

    /// `owner` fenced this node: no new get counts at it (what was counted
    /// stands there, in quarantine, until the fence is confirmed).
    pub(crate) fn stop_peer_reads_at(&self, owner: u32) {
        let stopped = self.peer_reads.borrow_mut().stop_owner(owner);
        if stopped > 0 {
            tracing::info!(
                owner,
                stopped,
                "stopped the peer reads of node {owner}: it fenced us"
            );
        }
    }

    /// Stopped tables at `owner` whose clients may still hold references
    /// counted there (their own count: a client that lies about it only
    /// hurts itself).
    pub(crate) fn peer_reads_held(&self, owner: u32) -> usize {
        let mut reads = self.peer_reads.borrow_mut();
        reads.prune_stopped();
        reads.stopped.iter().filter(|a| a.owner == owner).count()
    }

    /// Stops the tables at owners that seem gone: silent for three quarters
    /// of a lease (ours there may run out), restarted (our references went
    /// with the old incarnation), or fencing us. Every heartbeat tick.
    pub fn stop_peer_reads_of_gone_owners(&self) {
        let limit = self.topology().lease * 3 / 4;
        let answers = self.peers.last_answers();
        let gone: Vec<u32> = {
            let reads = self.peer_reads.borrow();
            let mut owners: Vec<u32> = reads
                .tables
                .values()
                .flatten()
                .filter(|a| {
                    let silent = answers
                        .get(a.owner as usize)
                        .copied()
                        .flatten()
                        .is_none_or(|t| t.elapsed() > limit);
                    silent || self.peer_reads_possible(a.owner) != Some(a.generation)
                })
                .map(|a| a.owner)
                .collect();
            owners.sort_unstable();
            owners.dedup();
            owners
        };
        for owner in gone {
            let stopped = self.peer_reads.borrow_mut().stop_owner(owner);
            tracing::info!(
                owner,
                stopped,
                "stopped the peer reads of node {owner}: it seems gone"
            );
        }
    }

    /// As an owner: attaches a peer's table, or only describes the index.
    pub fn attach_reads(
        self: &std::rc::Rc<Self>,
        from: u32,
        incarnation: u64,
        table: Option<(u32, i32)>,
        key: u64,
    ) -> std::result::Result<AttachReadsReply, Status> {
        // Counted for an incarnation this node recorded: its restart drops them.
        self.heard_incarnation(from, incarnation);
        self.peers.touch(from);
        if self.peers.incarnation_of(from) != Some(incarnation) || incarnation == 0 {
            return Err(Status::failed_precondition(
                "attach from an incarnation this node does not know",
            ));
        }
        let index = self.node.read(|store| {
            store
                .fast_reads()
                .map(|r| (r.index().fd().as_raw_fd(), r.index().slots()))
        });
        let Some((index_fd, slots)) = index else {
            return Err(Status::failed_precondition("this node offers no fast path"));
        };
        if let Some((pid, fd)) = table {
            let file = open_in(pid, fd, true)
                .ok_or_else(|| Status::invalid_argument("cannot open the peer's table"))?;
            self.node
                .mutate(|store| store.attach_peer_reads(principals::peer(from), key, file.as_fd()))
                .map_err(|err| Status::invalid_argument(err.to_string()))?;
        }
        Ok(AttachReadsReply {
            pid: std::process::id(),
            index_fd,
            slots,
            generation: self.incarnation,
        })
    }
}

/// Opens descriptor `fd` of process `pid` anew (`/proc/PID/fd/FD`: the same
/// memfd, seals and all). `None` if that is not possible from here.
fn open_in(pid: u32, fd: i32, write: bool) -> Option<File> {
    if fd < 0 || pid == 0 {
        return None;
    }
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_CLOEXEC)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .ok()
}

//! The replies that carry file descriptors (SCM_RIGHTS): the `Welcome` with
//! the region, the fast path's read channel (index and reference table) and
//! write channel (ring and doorbell), and other nodes' read views. Each is
//! sent after the replies queued before it, so a client reads its answers
//! in order.

use std::os::fd::{AsFd, BorrowedFd};

use shoal_core::durability::Durability;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::fd_passing::send_with_fds;
use shoal_core::protocol::{Reply, PROTOCOL_VERSION};
use tokio::io::{AsyncWriteExt, Interest};

use super::{Connection, Next};

impl Connection {
    /// The handshake: the protocol versions must match; then the region's
    /// fd goes to the client with the store's sizes.
    pub(super) async fn hello(
        &mut self,
        version: u32,
        pid: u32,
        out: &mut Vec<u8>,
    ) -> Result<Next> {
        if self.welcomed {
            return Err(ShoalError::protocol("Hello sent twice"));
        }
        if version != PROTOCOL_VERSION {
            Reply::Error {
                kind: ErrorKind::VersionMismatch,
                message: format!("client speaks protocol {version}, daemon {PROTOCOL_VERSION}"),
            }
            .encode(out);
            return Ok(Next::Continue);
        }
        self.welcomed = true;
        self.activity.hello(pid);
        tracing::debug!(client = self.client, pid, "client connected");
        self.send_welcome(out).await?;
        Ok(Next::Continue)
    }

    /// The fast path's read channel: the shared object index and this
    /// client's reference table.
    pub(super) async fn open_fast_reads(&mut self, out: &mut Vec<u8>) -> Result<Next> {
        let client = self.client;
        let opened = self.ops.node.mutate(|s| {
            let slots = s.fast_reads().map(|r| r.index().slots());
            s.add_fast_reader(client).map(|fds| fds.zip(slots))
        });
        match opened {
            Ok(Some(((index, table), slots))) => {
                let mut frame = Vec::new();
                Reply::FastReads { slots }.encode(&mut frame);
                self.send_attached(out, &frame, &[index.as_fd(), table.as_fd()])
                    .await?;
            }
            Ok(None) => Reply::error(&ShoalError::invalid(
                "this daemon does not offer the fast path",
            ))
            .encode(out),
            Err(err) => Reply::error(&err).encode(out),
        }
        Ok(Next::Continue)
    }

    /// The fast path's write channel (a ring and its doorbell), for a
    /// fast-path reader of a single node.
    pub(super) async fn open_fast_writes(&mut self, out: &mut Vec<u8>) -> Result<Next> {
        let offered = self.ops.cluster.is_none()
            && self
                .ops
                .node
                .read(|s| s.fast_reads().is_some_and(|r| r.has_client(self.client)));
        if !offered {
            Reply::error(&ShoalError::invalid(
                "this daemon offers write channels only to fast-path readers of a single node",
            ))
            .encode(out);
            return Ok(Next::Continue);
        }
        // A seal without a level reaches the node's default: the client
        // waits for its answer only when that is above memory.
        let default_level = self
            .ops
            .tiers
            .as_ref()
            .map_or(Durability::Memory, |t| t.default_durability());
        match self
            .ops
            .node
            .write_channels()
            .open(self.client, default_level)
        {
            Ok((channel, doorbell)) => {
                let mut frame = Vec::new();
                Reply::FastWrites {
                    records: shoal_core::fast_path::writes::RECORDS,
                }
                .encode(&mut frame);
                self.send_attached(out, &frame, &[channel.as_fd(), doorbell.as_fd()])
                    .await?;
            }
            Err(err) => Reply::error(&err).encode(out),
        }
        Ok(Next::Continue)
    }

    /// Other nodes' read views (their index and this client's table there),
    /// two fds per owner, as many as one message carries.
    pub(super) async fn send_peer_reads(&mut self, out: &mut Vec<u8>) -> Result<Next> {
        let views = match &self.ops.cluster {
            Some(cluster) => cluster.peer_reads_for(self.client).await,
            None => Vec::new(),
        };
        let views = &views[..views.len().min(shoal_core::fd_passing::MAX_FDS / 2)];
        let mut frame = Vec::new();
        Reply::PeerReads {
            owners: views.iter().map(|v| (v.owner, v.generation)).collect(),
        }
        .encode(&mut frame);
        let fds: Vec<_> = views
            .iter()
            .flat_map(|v| [v.index.as_fd(), v.table.as_fd()])
            .collect();
        self.send_attached(out, &frame, &fds).await?;
        Ok(Next::Continue)
    }

    /// Sends pending replies, then the Welcome with the region's fd attached.
    async fn send_welcome(&mut self, out: &mut Vec<u8>) -> Result<()> {
        // (Not `stats()`: that walks every object.)
        let (region_size, capacity, line_size) = self
            .ops
            .node
            .read(|s| (s.region_size(), s.capacity(), s.line_size()));
        let mut frame = Vec::new();
        Reply::Welcome {
            version: PROTOCOL_VERSION,
            client_id: self.client,
            region_size,
            capacity,
            line_size,
            resident: self.ops.node.resident(),
            clustered: self.ops.cluster.is_some(),
        }
        .encode(&mut frame);
        let region = self.ops.node.region().clone();
        self.send_attached(out, &frame, &[region.fd()]).await
    }

    /// Sends pending replies, then `frame` with `fds` attached.
    async fn send_attached(
        &mut self,
        out: &mut Vec<u8>,
        frame: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> Result<()> {
        if !out.is_empty() {
            self.stream.write_all(out).await?;
            out.clear();
        }
        if fds.is_empty() {
            self.stream.write_all(frame).await?;
            return Ok(());
        }
        let sent = self
            .stream
            .async_io(Interest::WRITABLE, || {
                send_with_fds(self.stream.as_fd(), frame, fds)
            })
            .await?;
        self.stream.write_all(&frame[sent..]).await?;
        Ok(())
    }
}

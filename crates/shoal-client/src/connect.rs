//! Connecting: the handshake, the region mapped, the cluster asked about,
//! the fast paths asked for; what the daemon said; hanging up.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::fast_path::readers::FastReads;
use shoal_core::protocol::{Reply, Request};
use shoal_core::region::Mapping;

use crate::channel::{unexpected, Channel, StoreInfo};
use crate::cluster_view::ClusterView;
use crate::{lent, peer_reads};

/// Whether clients ask for the fast path (`SHOAL_FAST_READS=0`: every get
/// takes the socket, e.g. to measure the difference).
fn fast_reads_wanted() -> bool {
    std::env::var_os("SHOAL_FAST_READS").is_none_or(|v| v != "0")
}

/// Whether clients create small objects in lent space (`SHOAL_FAST_WRITES=0`:
/// every create and seal takes the socket).
fn fast_writes_wanted() -> bool {
    std::env::var_os("SHOAL_FAST_WRITES").is_none_or(|v| v != "0")
}

impl crate::Client {
    /// Connects to the daemon at `socket` and maps its region; gets of
    /// sealed objects in memory take the fast path (no round trip) unless
    /// `SHOAL_FAST_READS=0`.
    pub fn connect(socket: impl AsRef<Path>) -> Result<Self> {
        Self::connect_with(socket, fast_reads_wanted())
    }

    /// [`connect`](Self::connect), every get and release through the daemon
    /// (as before the fast path; e.g. to watch references in `list`).
    pub fn connect_socket_only(socket: impl AsRef<Path>) -> Result<Self> {
        Self::connect_with(socket, false)
    }

    fn connect_with(socket: impl AsRef<Path>, fast_reads: bool) -> Result<Self> {
        let (channel, info, fd) = Channel::handshake(socket.as_ref())?;
        let mapping = Arc::new(Mapping::map(fd.as_fd(), info.region_size, info.resident)?);
        let mut client = Self {
            channel,
            mapping,
            info,
            cluster: None,
            unsealed: HashMap::new(),
            fast: None,
            fast_held: HashMap::new(),
            peer_views: Arc::default(),
            writes: None,
        };
        if info.clustered {
            match client.channel.call(&Request::ClusterInfo)? {
                Reply::ClusterInfo {
                    node,
                    coherent,
                    simulated,
                    cluster,
                    encryption,
                    nodes,
                } => {
                    let mut view = ClusterView::new(node, coherent, simulated, cluster, nodes);
                    view.encryption = encryption;
                    client.cluster = Some(view);
                }
                other => return Err(unexpected(other)),
            }
        }
        if fast_reads {
            client.fast = client.ask_fast_reads()?;
            client.channel.fast = client.fast.clone();
            if let (Some(cluster), Some(_)) = (&client.cluster, &client.fast) {
                let possible = cluster
                    .nodes
                    .iter()
                    .filter(|n| n.node != cluster.node && n.mapped)
                    .count();
                client.peer_views = Arc::new(peer_reads::PeerViews::new(possible));
            }
        }
        if client.fast.is_some() && !info.clustered && fast_writes_wanted() {
            client.writes = client.ask_fast_writes()?;
        }
        Ok(client)
    }

    /// Asks for the fast path's shared state. `None` when the daemon does
    /// not offer it or could not make a table (an error reply, e.g. it is
    /// out of file descriptors), or this process cannot map it: gets then
    /// take the socket.
    fn ask_fast_reads(&mut self) -> Result<Option<Arc<FastReads>>> {
        match self.channel.call_with_fds(&Request::FastReads)? {
            (Reply::FastReads { .. }, fds) if fds.len() == 2 => {
                match FastReads::attach(fds[0].as_fd(), fds[1].as_fd()) {
                    Ok(fast) => Ok(Some(Arc::new(fast))),
                    Err(err) if err.kind() == ErrorKind::Io => Ok(None),
                    Err(err) => Err(err),
                }
            }
            // An error reply, or descriptors this process had no room for
            // (the kernel drops them): no fast path.
            (Reply::Error { .. } | Reply::FastReads { .. }, _) => Ok(None),
            (other, _) => Err(ShoalError::protocol(format!(
                "expected FastReads, got {other:?}"
            ))),
        }
    }

    /// Asks for a write channel. `None` when the daemon does not offer one
    /// or this process cannot map it: creates and seals take the socket.
    fn ask_fast_writes(&mut self) -> Result<Option<lent::FastWrites>> {
        let fast = self.fast.clone().expect("asked with the fast path only");
        match self.channel.call_with_fds(&Request::FastWrites)? {
            (Reply::FastWrites { .. }, mut fds) if fds.len() == 2 => {
                let doorbell = fds.pop().expect("two fds");
                let socket = OwnedFd::from(self.channel.stream.try_clone()?);
                let line = self.info.line_size;
                match lent::FastWrites::attach(fds[0].as_fd(), doorbell, socket, fast, line) {
                    Ok(writes) => Ok(Some(writes)),
                    Err(err) if err.kind() == ErrorKind::Io => Ok(None),
                    Err(err) => Err(err),
                }
            }
            (Reply::Error { .. } | Reply::FastWrites { .. }, _) => Ok(None),
            (other, _) => Err(ShoalError::protocol(format!(
                "expected FastWrites, got {other:?}"
            ))),
        }
    }

    /// What the daemon said at connect.
    pub fn info(&self) -> StoreInfo {
        self.info
    }

    /// The client's mapping of the region; buffers point into it.
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.mapping
    }

    /// How many requests this client has sent the daemon through its
    /// socket (what the fast path saves shows here).
    pub fn requests(&self) -> u64 {
        self.channel.requests
    }

    /// Hangs up; the daemon releases every reference this client held.
    pub fn close(&mut self) {
        let _ = self.channel.stream.shutdown(std::net::Shutdown::Both);
        // Nothing more without the daemon: no creates in lent space, no
        // answers from the index.
        self.writes = None;
        if let Some(fast) = &self.fast {
            fast.close();
        }
        self.peer_views.close();
    }
}

//! The store as a whole: its statistics, eviction on demand and its order
//! (cooled objects first), and the elastic capacity controller's state.

use std::time::Duration;

use shoal_core::error::Result;
use shoal_core::protocol::{CapacityReport, Reply, Request, StoreStats};
use shoal_core::ObjectId;

use crate::channel::{per_id, unexpected};

impl crate::Client {
    /// The store's counters: objects, bytes, references, evictions.
    pub fn stats(&mut self) -> Result<StoreStats> {
        match self.channel.call(&Request::Stats)? {
            Reply::Stats(stats) => Ok(stats),
            other => Err(unexpected(other)),
        }
    }

    /// Evicts unreferenced objects until `bytes` are freed; returns bytes freed.
    pub fn evict(&mut self, bytes: u64) -> Result<u64> {
        match self.channel.call(&Request::Evict { bytes })? {
            Reply::Evicted { bytes } => Ok(bytes),
            other => Err(unexpected(other)),
        }
    }

    /// Tells the daemon this client's readers are done with `ids` for now:
    /// once unreferenced, each leaves memory before the eviction policy's
    /// own candidates (the most recently cooled first) until read again. A
    /// hint: nothing is evicted because of it alone. One result per id:
    /// `ObjectNotFound` for one not sealed in this node's memory.
    pub fn cool(&mut self, ids: &[ObjectId]) -> Result<Vec<Result<()>>> {
        let reply = self.channel.call(&Request::Cool { ids: ids.to_vec() })?;
        per_id(reply, ids, "cooling object")
    }

    /// The elastic capacity controller's state; with `trace_since`, also
    /// its trace points later than that (time since the daemon started).
    pub fn capacity(&mut self, trace_since: Option<Duration>) -> Result<CapacityReport> {
        match self.channel.call(&Request::Capacity { trace_since })? {
            Reply::Capacity(report) => Ok(report),
            other => Err(unexpected(other)),
        }
    }
}

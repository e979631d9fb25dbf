//! The store as a whole: its statistics, eviction on demand, and the
//! elastic capacity controller's state.

use std::time::Duration;

use shoal_core::error::Result;
use shoal_core::protocol::{CapacityReport, Reply, Request, StoreStats};

use crate::channel::unexpected;

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

    /// The elastic capacity controller's state; with `trace_since`, also
    /// its trace points later than that (time since the daemon started).
    pub fn capacity(&mut self, trace_since: Option<Duration>) -> Result<CapacityReport> {
        match self.channel.call(&Request::Capacity { trace_since })? {
            Reply::Capacity(report) => Ok(report),
            other => Err(unexpected(other)),
        }
    }
}

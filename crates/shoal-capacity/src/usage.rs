//! A node's memory use at one instant: the controller's v_i and M.

use shoal_core::error::{Result, ShoalError};

/// Bytes in use (v_i) out of the bytes the node may use (M). Built by the
/// readers in `meminfo.rs` and `cgroup.rs`, or by tests.
///
/// `used` may exceed `total` (a cgroup briefly over a lowered limit); the
/// controller then sees r_i > 1 and shrinks hard, which is what that case needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    used: u64,
    total: u64,
}

impl MemoryUsage {
    /// Fails only when `total` is 0: r_i = v_i / M would be meaningless.
    pub fn new(used: u64, total: u64) -> Result<Self> {
        if total == 0 {
            return Err(ShoalError::invalid("node memory total must be positive"));
        }
        Ok(Self { used, total })
    }

    /// v_i: bytes in use, the store's own resident memory included.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// M: the bytes the node (or its cgroup) may use.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// r_i = v_i / M.
    pub fn utilisation(&self) -> f64 {
        self.used as f64 / self.total as f64
    }
}

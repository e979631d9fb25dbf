//! Durability and the tiers below memory (docs/tiers.md): waiting for a
//! durable copy, stage-in, stage-out, the tiers' report.

use shoal_core::durability::Durability;
use shoal_core::error::Result;
use shoal_core::protocol::{Reply, Request, TierReport};
use shoal_core::ObjectId;

use crate::channel::{per_id, unexpected};

impl crate::Client {
    /// Waits until each object has a durable copy at `level` (objects
    /// sealed at a lower one), up to `timeout_ms` ([`crate::WAIT_FOREVER`]:
    /// no limit). One result per id: `Timeout`, `ObjectNotFound`, or why
    /// the tiers cannot get it there.
    pub fn wait_durable(
        &mut self,
        ids: &[ObjectId],
        level: Durability,
        timeout_ms: i64,
    ) -> Result<Vec<Result<()>>> {
        let reply = self.channel.call(&Request::WaitDurable {
            level,
            timeout_ms,
            ids: ids.to_vec(),
        })?;
        per_id(reply, ids, &format!("durability {level} for object"))
    }

    /// Brings objects into memory from the tiers below (IME's stage-in).
    pub fn stage_in(&mut self, ids: &[ObjectId]) -> Result<Vec<Result<()>>> {
        let reply = self.channel.call(&Request::StageIn { ids: ids.to_vec() })?;
        per_id(reply, ids, "stage-in of object")
    }

    /// Writes objects down to the lowest tier and frees their memory unless
    /// referenced (IME's stage-out).
    pub fn stage_out(&mut self, ids: &[ObjectId]) -> Result<Vec<Result<()>>> {
        let reply = self
            .channel
            .call(&Request::StageOut { ids: ids.to_vec() })?;
        per_id(reply, ids, "stage-out of object")
    }

    /// The node's tiers below memory, their use and the drain's progress.
    pub fn tiers(&mut self) -> Result<TierReport> {
        match self.channel.call(&Request::Tiers)? {
            Reply::Tiers(report) => Ok(report),
            other => Err(unexpected(other)),
        }
    }
}

//! The POSIX view's names (docs/posix.md "Names"): a name bound to an
//! object, looked up, listed, moved, removed; puts and gets by name.

use shoal_core::durability::Durability;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::protocol::{Located, NameEntry, Reply, Request};
use shoal_core::ObjectId;

use crate::channel::{expect_ok, unexpected};

/// How often `get_named` looks a name up again when its object went
/// between the lookup and the get (a concurrent rewrite).
const GET_NAMED_TRIES: usize = 8;

impl crate::Client {
    /// Gives object `id` a name (the POSIX view): bound when the object is
    /// sealed if it is still being written, at once otherwise. A name bound
    /// before moves to it and its old object is deleted.
    pub fn name(&mut self, id: ObjectId, name: &str) -> Result<()> {
        shoal_core::names::check(name)?;
        expect_ok(self.channel.call(&Request::Name {
            id,
            name: name.to_owned(),
        })?)
    }

    /// The object bound to `name`, its sizes and time.
    pub fn resolve(&mut self, name: &str) -> Result<NameEntry> {
        match self.channel.call(&Request::Resolve {
            name: name.to_owned(),
        })? {
            Reply::Named(entry) => Ok(entry),
            other => Err(unexpected(other)),
        }
    }

    /// Every name under directory `prefix` (`""`: all), sorted.
    pub fn list_names(&mut self, prefix: &str) -> Result<Vec<NameEntry>> {
        match self.channel.call(&Request::ListNames {
            prefix: prefix.to_owned(),
        })? {
            Reply::Names { entries } => Ok(entries),
            other => Err(unexpected(other)),
        }
    }

    /// Moves a name, or a whole directory of names.
    pub fn rename(&mut self, from: &str, to: &str) -> Result<()> {
        expect_ok(self.channel.call(&Request::Rename {
            from: from.to_owned(),
            to: to.to_owned(),
        })?)
    }

    /// Removes a name and deletes its object.
    pub fn unlink(&mut self, name: &str) -> Result<()> {
        expect_ok(self.channel.call(&Request::Unlink {
            name: name.to_owned(),
        })?)
    }

    /// Sets the modification time `name` shows (ms since the epoch), as
    /// utimens does on the mount; the next binding of the name (a rewrite)
    /// sets it to that seal's time.
    pub fn set_mtime(&mut self, name: &str, mtime_ms: u64) -> Result<()> {
        expect_ok(self.channel.call(&Request::SetMtime {
            name: name.to_owned(),
            mtime_ms,
        })?)
    }

    /// Puts `data` + `meta` as a new object under `name` (a fresh id);
    /// `durability`: as for [`seal_durable`](Self::seal_durable). The name
    /// switches to the new object at its seal.
    pub fn put_named(
        &mut self,
        name: &str,
        data: &[u8],
        meta: &[u8],
        durability: Option<Durability>,
        timeout_ms: u32,
    ) -> Result<ObjectId> {
        shoal_core::names::check(name)?;
        let (id, location) = self.create_fresh(data.len() as u64, meta.len() as u32, timeout_ms)?;
        let written = self
            .write(location, data, meta)
            .and_then(|()| self.name(id, name));
        if let Err(err) = written {
            let _ = self.abort(id);
            return Err(err);
        }
        self.seal_durable(&[id], true, durability)?;
        Ok(id)
    }

    /// Gets the object bound to `name` (referenced until released). A name
    /// rebound between the lookup and the get is looked up again.
    pub fn get_named(&mut self, name: &str, timeout_ms: i64) -> Result<(NameEntry, Located)> {
        for _ in 0..GET_NAMED_TRIES {
            let entry = self.resolve(name)?;
            if let Some(located) = self.get(&[entry.id], timeout_ms)?[0] {
                return Ok((entry, located));
            }
        }
        Err(ShoalError::new(
            ErrorKind::ObjectNotFound,
            format!("name {name:?} kept moving to new objects"),
        ))
    }
}

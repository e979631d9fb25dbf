//! The crash-safe manifest: one redb database per node mapping each object id
//! to its [`ObjectRecord`], plus tombstones of deletes in progress.
//!
//! redb commits are atomic and durable when `commit` returns (copy-on-write
//! B-trees with a checksummed commit slot), so the manifest is always some
//! committed state; what it cannot know (a tier file renamed but not yet
//! recorded) recovery finds by listing the tiers. All calls block: the engine
//! runs them on tokio's blocking pool.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use shoal_core::error::{Result, ShoalError};
use shoal_core::ids::{ObjectId, ID_LEN};

use crate::identity::TierIdentity;
use crate::record::ObjectRecord;

const OBJECTS: TableDefinition<[u8; ID_LEN], &[u8]> = TableDefinition::new("objects");
/// Deletes committed but whose files may still exist; value: the generation
/// deleted (every incarnation up to it is gone; 0 from before generations).
const TOMBSTONES: TableDefinition<[u8; ID_LEN], u64> = TableDefinition::new("tombstones");
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
const IDENTITY_KEY: &str = "identity";

/// The node's manifest.
pub struct Manifest {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for Manifest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Manifest({})", self.path.display())
    }
}

/// One change of a batch ([`Manifest::apply`]).
#[derive(Debug, Clone)]
pub enum Change {
    /// Writes the id's record, replacing any (recovery: a copy adopted or
    /// forgotten). Unlike the engine's writes, no generation is checked:
    /// recovery runs before any write.
    Put(ObjectId, ObjectRecord),
    /// Removes the id's record, if any (recovery: no copy left, or a
    /// generation its tombstone ended).
    Remove(ObjectId),
    /// Removes the id's tombstone of the given generation (or an older one):
    /// the files of that delete are gone from every tier. A tombstone of a
    /// newer generation stays: it belongs to a later delete whose files may
    /// still be there (a clear committed after its lock was let go would
    /// otherwise wipe it, and recovery would adopt the files).
    ClearTombstone(ObjectId, u64),
}

/// What [`Manifest::tombstone`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tombstoned {
    /// The tombstone is in; the record it removed, if there was one.
    Deleted(Option<ObjectRecord>),
    /// The record is of a newer incarnation (its generation is higher):
    /// left as it is, no tombstone.
    Newer(ObjectRecord),
}

impl Manifest {
    /// Opens or creates the manifest at `path`, owned by `owner`; a manifest
    /// made by another node or cluster is refused.
    pub fn open(path: &Path, owner: &TierIdentity) -> Result<Self> {
        let what = path.display().to_string();
        let db =
            Database::create(path).map_err(|e| db_error(&format!("open manifest {what}"), e))?;
        let manifest = Self {
            db,
            path: path.to_path_buf(),
        };
        let txn = manifest.write_txn()?;
        {
            let mut meta = txn
                .open_table(META)
                .map_err(|e| manifest.error("open table", e))?;
            let found = meta
                .get(IDENTITY_KEY)
                .map_err(|e| manifest.error("read identity", e))?
                .map(|v| v.value().to_string());
            match found {
                Some(text) => owner.check(&TierIdentity::decode(&text, &what)?, &what)?,
                None => {
                    meta.insert(IDENTITY_KEY, owner.encode()?.as_str())
                        .map_err(|e| manifest.error("write identity", e))?;
                }
            }
            txn.open_table(OBJECTS)
                .map_err(|e| manifest.error("open table", e))?;
            txn.open_table(TOMBSTONES)
                .map_err(|e| manifest.error("open table", e))?;
        }
        txn.commit().map_err(|e| manifest.error("commit", e))?;
        Ok(manifest)
    }

    /// The manifest's file (named in errors and logs).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn error(&self, context: &str, err: impl std::fmt::Display) -> ShoalError {
        ShoalError::io(&format!("manifest {}: {context}", self.path.display()), err)
    }

    fn write_txn(&self) -> Result<redb::WriteTransaction> {
        self.db
            .begin_write()
            .map_err(|e| self.error("begin write", e))
    }

    /// The record of `id` as last committed; `None` if no tier holds a copy
    /// of it (never written down, deleted, or its last copy dropped).
    pub fn get(&self, id: &ObjectId) -> Result<Option<ObjectRecord>> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| self.error("begin read", e))?;
        let table = txn
            .open_table(OBJECTS)
            .map_err(|e| self.error("open table", e))?;
        let value = table
            .get(id.as_bytes())
            .map_err(|e| self.error("read", e))?;
        value.map(|v| ObjectRecord::decode(v.value())).transpose()
    }

    /// Reads `id`'s record, lets `f` change it (`None` removes it), commits.
    /// Returns the new record.
    pub fn update(
        &self,
        id: &ObjectId,
        f: impl FnOnce(Option<ObjectRecord>) -> Option<ObjectRecord>,
    ) -> Result<Option<ObjectRecord>> {
        let mut f = Some(f);
        let mut new = self.update_each(std::slice::from_ref(id), |_, old| {
            (f.take().expect("called once per id"))(old)
        })?;
        Ok(new.pop().expect("one record per id"))
    }

    /// As [`update`](Self::update) for each of `ids` (distinct), in one
    /// commit: `f(i, old)` gives the new record of `ids[i]`. A batch of
    /// writes pays one commit (one fsync) instead of one each.
    pub fn update_each(
        &self,
        ids: &[ObjectId],
        mut f: impl FnMut(usize, Option<ObjectRecord>) -> Option<ObjectRecord>,
    ) -> Result<Vec<Option<ObjectRecord>>> {
        let txn = self.write_txn()?;
        let new = {
            let mut table = txn
                .open_table(OBJECTS)
                .map_err(|e| self.error("open table", e))?;
            let mut out = Vec::with_capacity(ids.len());
            for (i, id) in ids.iter().enumerate() {
                let old = table
                    .get(id.as_bytes())
                    .map_err(|e| self.error("read", e))?
                    .map(|v| ObjectRecord::decode(v.value()))
                    .transpose()?;
                let new = f(i, old);
                match &new {
                    Some(record) => {
                        table
                            .insert(id.as_bytes(), record.encode().as_slice())
                            .map_err(|e| self.error("write", e))?;
                    }
                    None => {
                        table
                            .remove(id.as_bytes())
                            .map_err(|e| self.error("remove", e))?;
                    }
                }
                out.push(new);
            }
            out
        };
        txn.commit().map_err(|e| self.error("commit", e))?;
        Ok(new)
    }

    /// Removes `id`'s record and leaves a tombstone of `generation`, in one
    /// commit: from here on every incarnation of `id` up to `generation` is
    /// deleted, and recovery removes any file of it left. A record of a
    /// newer generation is left alone (nothing is committed).
    pub fn tombstone(&self, id: &ObjectId, generation: u64) -> Result<Tombstoned> {
        let txn = self.write_txn()?;
        let old = {
            let mut table = txn
                .open_table(OBJECTS)
                .map_err(|e| self.error("open table", e))?;
            let old = table
                .get(id.as_bytes())
                .map_err(|e| self.error("read", e))?
                .map(|v| ObjectRecord::decode(v.value()))
                .transpose()?;
            match old {
                Some(newer) if newer.generation > generation => Tombstoned::Newer(newer),
                old => {
                    if old.is_some() {
                        table
                            .remove(id.as_bytes())
                            .map_err(|e| self.error("remove", e))?;
                    }
                    let mut tombs = txn
                        .open_table(TOMBSTONES)
                        .map_err(|e| self.error("open table", e))?;
                    let before = tombs
                        .get(id.as_bytes())
                        .map_err(|e| self.error("read", e))?
                        .map_or(0, |v| v.value());
                    tombs
                        .insert(id.as_bytes(), before.max(generation))
                        .map_err(|e| self.error("write", e))?;
                    Tombstoned::Deleted(old)
                }
            }
        };
        match old {
            Tombstoned::Newer(_) => txn.abort().map_err(|e| self.error("abort", e))?,
            Tombstoned::Deleted(_) => txn.commit().map_err(|e| self.error("commit", e))?,
        }
        Ok(old)
    }

    /// Every tombstone: the id and the generation it deleted.
    pub fn tombstones(&self) -> Result<Vec<(ObjectId, u64)>> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| self.error("begin read", e))?;
        let table = txn
            .open_table(TOMBSTONES)
            .map_err(|e| self.error("open table", e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| self.error("iterate", e))? {
            let (key, value) = entry.map_err(|e| self.error("iterate", e))?;
            out.push((ObjectId(key.value()), value.value()));
        }
        Ok(out)
    }

    /// Every record, in id order.
    pub fn all(&self) -> Result<Vec<(ObjectId, ObjectRecord)>> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| self.error("begin read", e))?;
        let table = txn
            .open_table(OBJECTS)
            .map_err(|e| self.error("open table", e))?;
        let mut out = Vec::with_capacity(table.len().unwrap_or(0) as usize);
        for entry in table.iter().map_err(|e| self.error("iterate", e))? {
            let (key, value) = entry.map_err(|e| self.error("iterate", e))?;
            out.push((ObjectId(key.value()), ObjectRecord::decode(value.value())?));
        }
        Ok(out)
    }

    /// Records: objects with at least one tier copy (tombstones not counted).
    pub fn len(&self) -> Result<u64> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| self.error("begin read", e))?;
        let table = txn
            .open_table(OBJECTS)
            .map_err(|e| self.error("open table", e))?;
        table.len().map_err(|e| self.error("count", e))
    }

    /// Whether there is no record (tombstones not counted).
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Applies `changes` in one commit (recovery's batch).
    pub fn apply(&self, changes: &[Change]) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let txn = self.write_txn()?;
        {
            let mut table = txn
                .open_table(OBJECTS)
                .map_err(|e| self.error("open table", e))?;
            let mut tombs = txn
                .open_table(TOMBSTONES)
                .map_err(|e| self.error("open table", e))?;
            for change in changes {
                match change {
                    Change::Put(id, record) => {
                        table
                            .insert(id.as_bytes(), record.encode().as_slice())
                            .map_err(|e| self.error("write", e))?;
                    }
                    Change::Remove(id) => {
                        table
                            .remove(id.as_bytes())
                            .map_err(|e| self.error("remove", e))?;
                    }
                    Change::ClearTombstone(id, generation) => {
                        let held = tombs
                            .get(id.as_bytes())
                            .map_err(|e| self.error("read", e))?
                            .map(|v| v.value());
                        if held.is_some_and(|held| held <= *generation) {
                            tombs
                                .remove(id.as_bytes())
                                .map_err(|e| self.error("remove", e))?;
                        }
                    }
                }
            }
        }
        txn.commit().map_err(|e| self.error("commit", e))
    }
}

fn db_error(context: &str, err: redb::DatabaseError) -> ShoalError {
    ShoalError::io(context, err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ObjectSizes;
    use crate::record::{Durability, TierLevel, TierSet};

    fn record(tiers: TierSet) -> ObjectRecord {
        ObjectRecord {
            sizes: ObjectSizes {
                data_size: 10,
                meta_size: 2,
            },
            checksum: 42,
            tiers,
            durability: Durability::Local,
            sealed_at_ms: 1,
            modified_ms: 1,
            name: None,
            generation: 3,
        }
    }

    #[test]
    fn records_survive_reopen_and_identity_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifest.redb");
        let me = TierIdentity::new("c", 1);
        let (a, b) = (ObjectId::random(), ObjectId::random());
        {
            let m = Manifest::open(&path, &me).unwrap();
            m.update(&a, |_| Some(record(TierSet::of(TierLevel::Burst))))
                .unwrap();
            m.update(&b, |_| Some(record(TierSet::of(TierLevel::Backing))))
                .unwrap();
            let new = m
                .update(&a, |r| {
                    r.map(|r| ObjectRecord {
                        tiers: r.tiers.with(TierLevel::Backing),
                        ..r
                    })
                })
                .unwrap()
                .unwrap();
            assert!(new.tiers.contains(TierLevel::Backing));
            // A delete of an older incarnation leaves the record alone.
            assert!(matches!(m.tombstone(&b, 2).unwrap(), Tombstoned::Newer(_)));
            match m.tombstone(&b, 3).unwrap() {
                Tombstoned::Deleted(Some(old)) => assert_eq!(old.checksum, 42),
                other => panic!("{other:?}"),
            }
        }
        let m = Manifest::open(&path, &me).unwrap();
        assert_eq!(m.len().unwrap(), 1);
        assert_eq!(
            m.get(&a).unwrap().unwrap().tiers,
            TierSet::of(TierLevel::Burst).with(TierLevel::Backing)
        );
        assert_eq!(m.get(&b).unwrap(), None);
        assert_eq!(m.tombstones().unwrap(), vec![(b, 3)]);
        // A clear of an older delete leaves a newer delete's tombstone.
        m.apply(&[Change::ClearTombstone(b, 2)]).unwrap();
        assert_eq!(m.tombstones().unwrap(), vec![(b, 3)]);
        m.apply(&[Change::ClearTombstone(b, 3), Change::Remove(a)])
            .unwrap();
        assert!(m.tombstones().unwrap().is_empty() && m.is_empty().unwrap());
        drop(m);
        let err = Manifest::open(&path, &TierIdentity::new("c", 2)).unwrap_err();
        assert!(err.message().contains("node 1"), "{err}");
    }
}

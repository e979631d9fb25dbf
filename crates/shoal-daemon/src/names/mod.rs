//! The node's names (the POSIX view): name → sealed object, sorted so a
//! directory (a prefix) lists as one range; per object its name, which the
//! drain writes into the tiers' manifest record so names survive restarts.
//!
//! A name given to an object still being written is *pending* and bound at
//! its seal: rewriting a file makes a new object and switches the name to
//! it in one step, never showing a half-written one. A leaf: it knows
//! nothing of the store; the operations (ops/names.rs) keep the two in step.

use std::collections::BTreeMap;

use foldhash::HashMap;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::names::is_under;
use shoal_core::protocol::NameEntry;
use shoal_core::ObjectId;

/// What a name is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub id: ObjectId,
    pub data_size: u64,
    pub meta_size: u32,
    /// When it was bound (the seal), ms since the epoch.
    pub mtime_ms: u64,
}

/// What a rename changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Renamed {
    /// Objects that have a new name.
    pub moved: Vec<ObjectId>,
    /// Objects whose names were taken over (the caller deletes them).
    pub replaced: Vec<ObjectId>,
}

#[derive(Debug, Default)]
pub struct NameIndex {
    by_name: BTreeMap<String, Bound>,
    by_id: HashMap<ObjectId, String>,
    /// Names of objects not sealed yet.
    pending: HashMap<ObjectId, String>,
}

impl NameIndex {
    /// The name an object has or will have at its seal.
    pub fn name_of(&self, id: &ObjectId) -> Option<&str> {
        self.by_id
            .get(id)
            .or_else(|| self.pending.get(id))
            .map(String::as_str)
    }

    /// The modification time of the name bound to `id`.
    pub fn mtime_of(&self, id: &ObjectId) -> Option<u64> {
        let name = self.by_id.get(id)?;
        self.by_name.get(name).map(|b| b.mtime_ms)
    }

    /// Names an object that is still being written.
    pub fn set_pending(&mut self, id: ObjectId, name: String) {
        self.pending.insert(id, name);
    }

    pub fn take_pending(&mut self, id: &ObjectId) -> Option<String> {
        self.pending.remove(id)
    }

    /// Binds `name` to `bound`; returns the object it was bound to before,
    /// if another one (its caller deletes it).
    pub fn bind(&mut self, name: String, bound: Bound) -> Option<ObjectId> {
        if let Some(old_name) = self.by_id.insert(bound.id, name.clone()) {
            if old_name != name {
                self.by_name.remove(&old_name);
            }
        }
        let old = self.by_name.insert(name, bound)?;
        (old.id != bound.id).then(|| {
            self.by_id.remove(&old.id);
            old.id
        })
    }

    /// At restart, the names the manifest's records carry, each with its
    /// object's seal time: of two objects claiming one name (a crash
    /// between a rebind and the old object's delete) the later seal wins
    /// (not the later modification time: a rewrite may be given an old one,
    /// as `rsync -a` does). Returns the losers.
    pub fn recover(&mut self, mut found: Vec<(String, Bound, u64)>) -> Vec<ObjectId> {
        found.sort_by_key(|(_, bound, sealed_at_ms)| (*sealed_at_ms, bound.id.0));
        found
            .into_iter()
            .filter_map(|(name, bound, _)| self.bind(name, bound))
            .collect()
    }

    pub fn resolve(&self, name: &str) -> Option<NameEntry> {
        self.by_name.get(name).map(|b| entry(name, b))
    }

    /// Every name under directory `dir` (`""`: all), sorted.
    pub fn list(&self, dir: &str) -> Vec<NameEntry> {
        self.under(dir).map(|(n, b)| entry(n, b)).collect()
    }

    fn under<'a>(&'a self, dir: &'a str) -> impl Iterator<Item = (&'a String, &'a Bound)> + 'a {
        let start = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        self.by_name
            .range(start.clone()..)
            .take_while(move |(n, _)| n.starts_with(&start))
            .filter(move |(n, _)| is_under(n, dir))
    }

    /// Whether any name lies under directory `dir`.
    pub fn is_dir(&self, dir: &str) -> bool {
        self.under(dir).next().is_some()
    }

    /// Moves name `from` to `to`, or every name under directory `from` to
    /// the same place under `to`.
    /// Refused: nothing at `from` (`ObjectNotFound`), a file onto a
    /// directory or the reverse (`InvalidArgument`), a directory onto a
    /// non-empty one (`ObjectExists`), a directory into itself.
    pub fn rename(&mut self, from: &str, to: &str) -> Result<Renamed> {
        if from == to {
            return if self.by_name.contains_key(from) || self.is_dir(from) {
                Ok(Renamed::default())
            } else {
                Err(not_found(from))
            };
        }
        if let Some(bound) = self.by_name.get(from).copied() {
            if self.is_dir(to) {
                return Err(ShoalError::invalid(format!(
                    "cannot rename name {from:?} onto directory {to:?}"
                )));
            }
            self.by_name.remove(from);
            return Ok(Renamed {
                moved: vec![bound.id],
                replaced: self.bind(to.to_owned(), bound).into_iter().collect(),
            });
        }
        if !self.is_dir(from) {
            return Err(not_found(from));
        }
        if is_under(to, from) {
            return Err(ShoalError::invalid(format!(
                "cannot move directory {from:?} into itself ({to:?})"
            )));
        }
        if self.by_name.contains_key(to) {
            return Err(ShoalError::invalid(format!(
                "cannot rename directory {from:?} onto name {to:?}"
            )));
        }
        if self.is_dir(to) {
            return Err(ShoalError::new(
                ErrorKind::ObjectExists,
                format!("directory {to:?} is not empty"),
            ));
        }
        let moved: Vec<(String, Bound)> = self.under(from).map(|(n, b)| (n.clone(), *b)).collect();
        let mut renamed = Renamed::default();
        for (name, bound) in moved {
            self.by_name.remove(&name);
            let new_name = format!("{to}{}", &name[from.len()..]);
            renamed.replaced.extend(self.bind(new_name, bound));
            renamed.moved.push(bound.id);
        }
        Ok(renamed)
    }

    /// Sets the modification time `name` shows; returns its object.
    pub fn set_mtime(&mut self, name: &str, mtime_ms: u64) -> Result<ObjectId> {
        let bound = self.by_name.get_mut(name).ok_or_else(|| not_found(name))?;
        bound.mtime_ms = mtime_ms;
        Ok(bound.id)
    }

    /// Removes a name; returns its object.
    pub fn unlink(&mut self, name: &str) -> Result<ObjectId> {
        let bound = self.by_name.remove(name).ok_or_else(|| not_found(name))?;
        self.by_id.remove(&bound.id);
        Ok(bound.id)
    }

    /// The object went (deleted, aborted, lost with memory): so does its name.
    pub fn forget(&mut self, id: &ObjectId) {
        self.pending.remove(id);
        if let Some(name) = self.by_id.remove(id) {
            if self.by_name.get(&name).is_some_and(|b| b.id == *id) {
                self.by_name.remove(&name);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

fn entry(name: &str, b: &Bound) -> NameEntry {
    NameEntry {
        name: name.to_owned(),
        id: b.id,
        data_size: b.data_size,
        meta_size: b.meta_size,
        mtime_ms: b.mtime_ms,
    }
}

fn not_found(name: &str) -> ShoalError {
    ShoalError::new(ErrorKind::ObjectNotFound, format!("no name {name:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(mtime_ms: u64) -> Bound {
        Bound {
            id: ObjectId::random(),
            data_size: mtime_ms,
            meta_size: 0,
            mtime_ms,
        }
    }

    fn names(index: &NameIndex, dir: &str) -> Vec<String> {
        index.list(dir).into_iter().map(|e| e.name).collect()
    }

    #[test]
    fn a_rebind_returns_the_old_object_and_forgets_it() {
        let mut index = NameIndex::default();
        let (a, b) = (bound(1), bound(2));
        assert_eq!(index.bind("x".into(), a), None);
        assert_eq!(index.bind("x".into(), b), Some(a.id));
        assert_eq!(index.resolve("x").unwrap().id, b.id);
        assert_eq!(index.name_of(&a.id), None);
        assert_eq!(index.len(), 1);
        // The same object bound again is no replacement.
        assert_eq!(index.bind("x".into(), b), None);
    }

    #[test]
    fn listing_a_directory_is_its_prefix_only() {
        let mut index = NameIndex::default();
        for n in ["a/x", "a/y/z", "ab/c", "a", "b"] {
            index.bind(n.into(), bound(1));
        }
        assert_eq!(names(&index, "a"), ["a/x", "a/y/z"]);
        assert_eq!(names(&index, "a/y"), ["a/y/z"]);
        assert_eq!(names(&index, "").len(), 5);
        assert!(index.is_dir("a") && !index.is_dir("b") && !index.is_dir("c"));
    }

    #[test]
    fn renames_move_names_and_directories() {
        let mut index = NameIndex::default();
        let (f, g, old) = (bound(1), bound(2), bound(3));
        index.bind("d/f".into(), f);
        index.bind("d/e/g".into(), g);
        index.bind("target".into(), old);
        let renamed = index.rename("d", "n").unwrap();
        assert!(renamed.replaced.is_empty() && renamed.moved.len() == 2);
        assert_eq!(names(&index, "n"), ["n/e/g", "n/f"]);
        assert_eq!(index.name_of(&g.id), Some("n/e/g"));
        // A file onto a file replaces it.
        let renamed = index.rename("n/f", "target").unwrap();
        assert_eq!(
            (renamed.moved, renamed.replaced),
            (vec![f.id], vec![old.id])
        );
        assert_eq!(index.resolve("target").unwrap().id, f.id);
        // Refusals.
        let kind = |r: Result<Renamed>| r.unwrap_err().kind();
        assert_eq!(kind(index.rename("nope", "x")), ErrorKind::ObjectNotFound);
        assert_eq!(
            kind(index.rename("target", "n")),
            ErrorKind::InvalidArgument
        );
        assert_eq!(kind(index.rename("n", "n/e/q")), ErrorKind::InvalidArgument);
        index.bind("m/k".into(), bound(4));
        assert_eq!(kind(index.rename("n", "m")), ErrorKind::ObjectExists);
    }

    #[test]
    fn pending_names_bind_only_when_asked_and_forget_clears_both() {
        let mut index = NameIndex::default();
        let a = bound(1);
        index.set_pending(a.id, "p".into());
        assert_eq!(index.name_of(&a.id), Some("p"));
        assert!(index.resolve("p").is_none());
        let name = index.take_pending(&a.id).unwrap();
        index.bind(name, a);
        index.forget(&a.id);
        assert!(index.resolve("p").is_none() && index.is_empty());
        assert_eq!(
            index.unlink("p").unwrap_err().kind(),
            ErrorKind::ObjectNotFound
        );
    }

    #[test]
    fn recovery_keeps_the_later_seal_whatever_its_time_shows() {
        // The newer object was given an older modification time (rsync -a).
        let (older, newer) = (
            bound(1),
            Bound {
                mtime_ms: 0,
                ..bound(2)
            },
        );
        for found in [
            vec![("x".into(), newer, 20), ("x".into(), older, 10)],
            vec![("x".into(), older, 10), ("x".into(), newer, 20)],
        ] {
            let mut index = NameIndex::default();
            assert_eq!(index.recover(found), vec![older.id]);
            assert_eq!(index.resolve("x").unwrap().id, newer.id);
            assert_eq!(index.mtime_of(&newer.id), Some(0));
            assert_eq!(index.mtime_of(&older.id), None);
        }
    }
}

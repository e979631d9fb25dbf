//! Inodes: what the kernel's inode of each number holds.
//!
//! The kernel keeps, per inode, one size and one page cache, shared by
//! every file open on it; reads through the page cache stop at that size
//! and take the pages there, whichever handle filled them. So an inode
//! stands for one *content* at a time — a sealed version of a name, or a
//! draft being written on this mount — and a name gets a new inode when
//! its content changes: a new version (written here, on another mount or
//! through the API) is a new number, as a file replaced by rename is on a
//! local file system. Files open on the old number keep its size and pages
//! (their version), files opened through the new one get the new version
//! whole (docs/posix.md, "Versions on the mount").
//!
//! Each path has a *current* inode (what a lookup answers, and what
//! renames move); older ones live on while the kernel holds them
//! (`forget` removes them), answering with their own version's attributes.

use std::collections::HashMap;
use std::time::{Instant, SystemTime};

use fuser::INodeNo;
use shoal_core::ObjectId;

const FUSE_ROOT_ID: u64 = INodeNo::ROOT.0;

/// A sealed version: the kernel's size and pages of an inode that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub id: ObjectId,
    pub size: u64,
    pub mtime: SystemTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// A directory.
    Dir,
    /// The kernel's size and pages are this sealed version's.
    Version(Version),
    /// Written on this mount: the size and pages are a writer's draft.
    Draft,
    /// Made for a writer the kernel is asked to retry (ESTALE) onto a
    /// fresh inode: until then it stands for the version it names (or an
    /// empty file), and a reader opens it without the page cache.
    Reserved {
        version: Option<Version>,
        until: Instant,
    },
    /// Unknown (two writers' bytes, a draft never sealed, a writer that
    /// bypassed the page cache): opened only without the page cache.
    Stale,
}

pub struct Inode {
    pub path: String,
    pub content: Content,
    /// Open handles that use the kernel's page cache of this inode.
    pub cached_opens: u32,
    /// Every open handle.
    pub opens: u32,
    /// The kernel's lookup count (forget lowers it).
    lookups: u64,
    /// When a lookup last answered with this inode: an open right after
    /// it is the kernel's retry of an ESTALE, never to be refused again.
    pub looked_up: Option<Instant>,
}

pub struct Inodes {
    current: HashMap<String, u64>,
    nodes: HashMap<u64, Inode>,
    next: u64,
}

impl Default for Inodes {
    fn default() -> Self {
        let mut inodes = Self {
            current: HashMap::new(),
            nodes: HashMap::new(),
            next: FUSE_ROOT_ID + 1,
        };
        inodes.current.insert(String::new(), FUSE_ROOT_ID);
        inodes
            .nodes
            .insert(FUSE_ROOT_ID, Inode::new(String::new(), Content::Dir));
        inodes
    }
}

impl Inode {
    fn new(path: String, content: Content) -> Self {
        Self {
            path,
            content,
            cached_opens: 0,
            opens: 0,
            lookups: 0,
            looked_up: None,
        }
    }
}

impl Inodes {
    /// The current inode of `path`, if it has one.
    pub fn current(&self, path: &str) -> Option<u64> {
        self.current.get(path).copied()
    }

    pub fn get(&self, ino: u64) -> Option<&Inode> {
        self.nodes.get(&ino)
    }

    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Inode> {
        self.nodes.get_mut(&ino)
    }

    pub fn path(&self, ino: u64) -> Option<&str> {
        self.nodes.get(&ino).map(|n| n.path.as_str())
    }

    /// A new inode for `path`, its current one from now on.
    pub fn fresh(&mut self, path: &str, content: Content) -> u64 {
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(ino, Inode::new(path.to_owned(), content));
        self.current.insert(path.to_owned(), ino);
        ino
    }

    /// A number for a directory entry that has no inode yet (readdir's
    /// entries are not looked up, so none is kept for them).
    pub fn unkept_number(&mut self) -> u64 {
        self.next += 1;
        self.next - 1
    }

    /// The current inode of directory `path` (a new one if it has none or
    /// its current one holds a file).
    pub fn dir(&mut self, path: &str) -> u64 {
        match self.current(path) {
            Some(ino) if self.nodes[&ino].content == Content::Dir => ino,
            _ => self.fresh(path, Content::Dir),
        }
    }

    /// The current inode of `path` if it holds `version` (its modification
    /// time brought up to date), else a new one holding it.
    pub fn version(&mut self, path: &str, version: Version) -> u64 {
        if let Some(ino) = self.current(path) {
            let node = self.nodes.get_mut(&ino).expect("current inodes exist");
            if let Content::Version(held) = &mut node.content {
                if held.id == version.id && held.size == version.size {
                    held.mtime = version.mtime;
                    return ino;
                }
            }
        }
        self.fresh(path, Content::Version(version))
    }

    /// A lookup answered with `ino` (the kernel holds one more reference).
    pub fn looked_up(&mut self, ino: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups += 1;
            node.looked_up = Some(Instant::now());
        }
    }

    /// The kernel dropped `n` references: an inode it no longer holds and
    /// nothing has open goes.
    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == FUSE_ROOT_ID {
            return;
        }
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(n);
        // A fresh inode kept for a writer stays until its retry comes (the
        // kernel's revalidation forgets the number it found changed).
        let reserved =
            matches!(node.content, Content::Reserved { until, .. } if Instant::now() < until);
        if node.lookups == 0 && node.opens == 0 && !reserved {
            let node = self.nodes.remove(&ino).expect("just found");
            if self.current.get(&node.path) == Some(&ino) {
                self.current.remove(&node.path);
            }
        }
    }

    /// `path` has no file or directory any more.
    pub fn unlinked(&mut self, path: &str) {
        self.current.remove(path);
    }

    /// `from` (a file, or a directory and everything under it) is now `to`:
    /// every inode under it follows (open ones too, as the kernel's
    /// dentries do). What was current at the destination is not any more.
    pub fn rename(&mut self, from: &str, to: &str) {
        let under = |p: &str| p == from || shoal_core::names::is_under(p, from);
        let moved: Vec<(String, u64)> = self
            .current
            .iter()
            .filter(|(p, _)| under(p))
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        let target = |old: &str| format!("{to}{}", &old[from.len()..]);
        for (old, _) in &moved {
            self.current.remove(old);
        }
        self.current
            .retain(|p, _| !(p.as_str() == to || shoal_core::names::is_under(p, to)));
        for (old, ino) in moved {
            self.current.insert(target(&old), ino);
        }
        for node in self.nodes.values_mut() {
            if under(&node.path) {
                node.path = target(&node.path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(n: u8, size: u64) -> Version {
        Version {
            id: ObjectId([n; shoal_core::ids::ID_LEN]),
            size,
            mtime: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn renames_carry_numbers_and_subtrees() {
        let mut inodes = Inodes::default();
        let (d, f, g) = (inodes.dir("d"), inodes.dir("d/f"), inodes.dir("dx"));
        let target = inodes.dir("e");
        inodes.rename("d", "e");
        assert_eq!(inodes.path(d), Some("e"));
        assert_eq!(inodes.path(f), Some("e/f"));
        assert_eq!(inodes.current("e/f"), Some(f));
        assert_eq!(
            inodes.path(g),
            Some("dx"),
            "a sibling with the same prefix stays"
        );
        assert_ne!(
            inodes.current("e"),
            Some(target),
            "the displaced inode is not current"
        );
        assert_eq!(inodes.current("d"), None);
        assert_eq!(inodes.dir(""), FUSE_ROOT_ID);
    }

    #[test]
    fn a_new_version_is_a_new_inode_and_the_old_one_keeps_its_own() {
        let mut inodes = Inodes::default();
        let old = inodes.version("f", version(1, 10));
        assert_eq!(inodes.version("f", version(1, 10)), old);
        let new = inodes.version("f", version(2, 20));
        assert_ne!(new, old);
        assert_eq!(inodes.current("f"), Some(new));
        assert_eq!(
            inodes.get(old).unwrap().content,
            Content::Version(version(1, 10))
        );
        inodes.looked_up(old);
        inodes.forget(old, 1);
        assert!(inodes.get(old).is_none(), "forgotten");
        inodes.looked_up(new);
        inodes.get_mut(new).unwrap().opens = 1;
        inodes.forget(new, 1);
        assert!(inodes.get(new).is_some(), "kept while open");
    }
}

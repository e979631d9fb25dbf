//! Inode numbers for paths. Names are the identity here (an object's id
//! changes with every rewrite), so an inode stands for a path: the kernel's
//! page cache of a file then survives a rewrite, and `open` decides whether
//! to keep it by comparing object ids (see `fs.rs`).
//!
//! Numbers are never reused while mounted (the kernel may still hold an old
//! one); `forget` is not tracked, so the table grows with the paths ever
//! looked up — fine for a mount's life, noted in docs/posix.md.

use std::collections::HashMap;

use fuser::INodeNo;

const FUSE_ROOT_ID: u64 = INodeNo::ROOT.0;

pub struct Inodes {
    by_path: HashMap<String, u64>,
    paths: HashMap<u64, String>,
    next: u64,
}

impl Default for Inodes {
    fn default() -> Self {
        let mut inodes = Self {
            by_path: HashMap::new(),
            paths: HashMap::new(),
            next: FUSE_ROOT_ID + 1,
        };
        inodes.by_path.insert(String::new(), FUSE_ROOT_ID);
        inodes.paths.insert(FUSE_ROOT_ID, String::new());
        inodes
    }
}

impl Inodes {
    /// The inode of `path`, numbered now if it has none.
    pub fn ino(&mut self, path: &str) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_path.insert(path.to_owned(), ino);
        self.paths.insert(ino, path.to_owned());
        ino
    }

    pub fn path(&self, ino: u64) -> Option<&str> {
        self.paths.get(&ino).map(String::as_str)
    }

    /// `from` (a file, or a directory and everything under it) is now `to`.
    /// A path already numbered at the destination gives up its number.
    pub fn rename(&mut self, from: &str, to: &str) {
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.as_str() == from || shoal_core::names::is_under(p, from))
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        for (old, ino) in moved {
            let new = format!("{to}{}", &old[from.len()..]);
            self.by_path.remove(&old);
            if let Some(displaced) = self.by_path.insert(new.clone(), ino) {
                self.paths.remove(&displaced);
            }
            self.paths.insert(ino, new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_carry_numbers_and_subtrees() {
        let mut inodes = Inodes::default();
        let (d, f, g) = (inodes.ino("d"), inodes.ino("d/f"), inodes.ino("dx"));
        let target = inodes.ino("e");
        inodes.rename("d", "e");
        assert_eq!(inodes.path(d), Some("e"));
        assert_eq!(inodes.path(f), Some("e/f"));
        assert_eq!(
            inodes.path(g),
            Some("dx"),
            "a sibling with the same prefix stays"
        );
        assert_eq!(
            inodes.path(target),
            None,
            "the displaced path's number is gone"
        );
        assert_eq!(inodes.ino(""), FUSE_ROOT_ID);
        assert!(inodes.ino("new") > target);
    }
}

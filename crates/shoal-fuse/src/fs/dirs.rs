//! Directories: name prefixes, and those made here by `mkdir` (kept by
//! the mount while empty): their entries, `mkdir`, `rmdir`.

use std::collections::BTreeMap;

use fuser::{FileAttr, FileType, INodeNo};
use libc::c_int;

use super::op::{Node, Op};
use crate::handles::lock;

impl Op<'_> {
    /// Makes directory `path` here (`mkdir`): its inode and attributes.
    pub(super) fn mkdir(&mut self, path: &str) -> Result<(u64, FileAttr), c_int> {
        match self.node(path) {
            Ok(_) => return Err(libc::EEXIST),
            Err(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        self.st.dirs.insert(path.to_owned());
        let ino = self.st.inodes.dir(path);
        Ok((ino, self.attr(ino, &Node::Dir)))
    }

    /// Removes the empty directory `path` (`rmdir`): one made here (a
    /// name prefix is never empty).
    pub(super) fn rmdir(&mut self, path: &str) -> Result<(), c_int> {
        match self.node(path)? {
            Node::File { .. } => return Err(libc::ENOTDIR),
            Node::Dir => {}
        }
        if !self.children(path)?.is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        self.st.dirs.remove(path);
        Ok(())
    }

    /// The entries of directory `dir`: (name, kind), sorted.
    fn children(&self, dir: &str) -> Result<BTreeMap<String, FileType>, c_int> {
        let mut out = BTreeMap::new();
        let strip = |p: &str| -> Option<String> {
            if dir.is_empty() {
                Some(p.to_owned())
            } else {
                p.strip_prefix(dir)?.strip_prefix('/').map(str::to_owned)
            }
        };
        let mut add = |rest: String, is_file: bool| match rest.split_once('/') {
            Some((first, _)) => {
                out.insert(first.to_owned(), FileType::Directory);
            }
            None => {
                let kind = if is_file {
                    FileType::RegularFile
                } else {
                    FileType::Directory
                };
                out.entry(rest).or_insert(kind);
            }
        };
        for entry in self.fs.list(dir)? {
            if let Some(rest) = strip(&entry.name) {
                add(rest, true);
            }
        }
        for d in &self.st.dirs {
            if let Some(rest) = strip(d) {
                add(rest, false);
            }
        }
        for writer in self.st.handles.writers() {
            let w = lock(&writer.info);
            if !w.unlinked {
                if let Some(rest) = strip(&w.path) {
                    add(rest, true);
                }
            }
        }
        Ok(out)
    }

    /// The entries `readdir` lists for directory inode `ino`: (inode,
    /// kind, name), `.` and `..` first.
    pub(super) fn dir_entries(
        &mut self,
        ino: INodeNo,
    ) -> Result<Vec<(u64, FileType, String)>, c_int> {
        let dir = self.path_of(ino)?;
        if !matches!(self.node(&dir)?, Node::Dir) {
            return Err(libc::ENOTDIR);
        }
        let children = self.children(&dir)?;
        let mut number = |path: &str| match self.st.inodes.current(path) {
            Some(ino) => ino,
            None => self.st.inodes.unkept_number(),
        };
        let parent = match dir.rsplit_once('/') {
            Some((up, _)) => number(up),
            None => INodeNo::ROOT.0,
        };
        let mut entries = vec![
            (ino.0, FileType::Directory, ".".to_owned()),
            (parent, FileType::Directory, "..".to_owned()),
        ];
        for (name, kind) in children {
            let path = if dir.is_empty() {
                name.clone()
            } else {
                format!("{dir}/{name}")
            };
            entries.push((number(&path), kind, name));
        }
        Ok(entries)
    }
}

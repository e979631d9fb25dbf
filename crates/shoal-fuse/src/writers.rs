//! Which processes changed a file since its last commit, so that a close
//! commits only what the closing process wrote.
//!
//! The kernel sends a flush for every close(2) of any descriptor of an
//! open file, including copies a forked child inherited and closes at its
//! exec (close-on-exec). Committing at each flush published the writer's
//! unfinished file as a version whenever it started any program while
//! writing (`subprocess.run`, `Command::spawn`): readers of the name got
//! prefixes of drafts, cut at the child's exec. So a flush commits when its
//! process is one that changed the file; the writer's own close does, and
//! the release (the last descriptor gone) commits whatever is left.
//!
//! FUSE names the calling *thread*; a process is its thread group, read
//! from /proc (once per thread and open file). Where that cannot be told
//! (no pid: a request from outside the mount's pid namespace; pages the
//! kernel writes back on its own with the write-back cache), any close
//! commits, as before.

use std::collections::{HashMap, HashSet};

/// The thread group (process) of thread `tid`, as /proc sees it; `None`
/// when it cannot be told, or for a kernel thread (with the write-back
/// cache, a kworker writes pages back for whoever wrote them).
pub fn process_of(tid: u32) -> Option<u32> {
    if tid == 0 {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .map(str::trim)
    };
    // `Kthread:` is new (6.x); before it, kernel threads are kthreadd (2)
    // and its children.
    let kernel = field("Kthread:") == Some("1") || matches!(field("PPid:"), Some("0" | "2"));
    if kernel {
        return None;
    }
    field("Tgid:").and_then(|tgid| tgid.parse().ok())
}

/// The processes that changed a draft since its last commit.
#[derive(Debug, Default)]
pub struct Changers {
    /// Threads seen, with their process (`None`: not known).
    threads: HashMap<u32, Option<u32>>,
    processes: HashSet<u32>,
    /// A change whose process is not known: every close commits.
    unknown: bool,
}

impl Changers {
    /// Thread `tid` changed the file.
    pub fn changed_by(&mut self, tid: u32) {
        self.changed_by_with(tid, process_of);
    }

    fn changed_by_with(&mut self, tid: u32, process_of: impl Fn(u32) -> Option<u32>) {
        let process = *self.threads.entry(tid).or_insert_with(|| process_of(tid));
        match process {
            Some(p) => {
                self.processes.insert(p);
            }
            None => self.unknown = true,
        }
    }

    /// Whether a close by thread `tid` commits: its process changed the
    /// file (or some change's, or its own, process is not known).
    pub fn commits_on_close_by(&self, tid: u32) -> bool {
        self.commits_on_close_by_with(tid, process_of)
    }

    fn commits_on_close_by_with(&self, tid: u32, process_of: impl Fn(u32) -> Option<u32>) -> bool {
        if self.unknown {
            return true;
        }
        let process = match self.threads.get(&tid) {
            Some(known) => *known,
            None => process_of(tid),
        };
        process.is_none_or(|p| self.processes.contains(&p))
    }

    /// The file was committed: nobody changed it since.
    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads 10, 11 are process 10; 20 is process 20; 30 is not known.
    fn table(tid: u32) -> Option<u32> {
        match tid {
            10 | 11 => Some(10),
            20 => Some(20),
            _ => None,
        }
    }

    #[test]
    fn a_close_by_another_process_does_not_commit() {
        let mut c = Changers::default();
        c.changed_by_with(10, table);
        assert!(c.commits_on_close_by_with(10, table));
        // Another thread of the writing process closes it.
        assert!(c.commits_on_close_by_with(11, table));
        // A forked child closes its inherited copy at exec.
        assert!(!c.commits_on_close_by_with(20, table));
        // A child that wrote through its copy commits at its close.
        c.changed_by_with(20, table);
        assert!(c.commits_on_close_by_with(20, table));
        c.clear();
        assert!(!c.commits_on_close_by_with(20, table));
    }

    #[test]
    fn what_cannot_be_told_commits() {
        let mut c = Changers::default();
        c.changed_by_with(10, table);
        // The closer's process is not known.
        assert!(c.commits_on_close_by_with(30, table));
        // A change whose process is not known: any close commits.
        c.changed_by_with(0, table);
        assert!(c.commits_on_close_by_with(20, table));
    }

    #[test]
    fn this_process_is_found() {
        let tid = unsafe { libc::gettid() } as u32;
        assert_eq!(process_of(tid), Some(std::process::id()));
        assert_eq!(process_of(0), None);
        // kthreadd, and init (whose parent is 0 as well: its closes commit).
        assert_eq!(process_of(2), None);
    }
}

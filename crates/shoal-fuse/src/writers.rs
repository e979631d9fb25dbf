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
//! from /proc (once per thread and open file). The process that opened the
//! file commits at its close too: with the write-back cache a kernel thread
//! may have written its pages back (such writes count for nobody). Where a
//! writer cannot be told (no pid: a request from outside the mount's pid
//! namespace), any close commits, as before.
//!
//! The kernel's write-back of a file's pages names no process either (pid
//! 0: its writes go without credentials), and it runs at every flush, in
//! the closing process: a forked child's exec wrote the writer's cached
//! pages back just before its own close reached us. Taken for a writer that
//! cannot be told, those writes made that close commit the unfinished file.
//! So a write without a pid counts for nobody when the process that opened
//! the file is known (its requests name it: the mount sees its pid
//! namespace); only when the opener cannot be told either does it make
//! every close commit.

use std::collections::{HashMap, HashSet};

/// Who a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Process(u32),
    /// A kernel thread (with the write-back cache, a kworker writes pages
    /// back for whoever wrote them).
    Kernel,
    Unknown,
}

/// The origin of a request of thread `tid`, as /proc sees it.
pub fn origin_of(tid: u32) -> Origin {
    if tid == 0 {
        return Origin::Unknown;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return Origin::Unknown;
    };
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
        return Origin::Kernel;
    }
    match field("Tgid:").and_then(|tgid| tgid.parse().ok()) {
        Some(tgid) => Origin::Process(tgid),
        None => Origin::Unknown,
    }
}

/// Who opened a draft, and which processes changed it since its last
/// commit.
#[derive(Debug, Default)]
pub struct Changers {
    /// Threads seen, with their origin.
    threads: HashMap<u32, Origin>,
    processes: HashSet<u32>,
    /// The process that opened the file (kept across commits).
    opener: Option<u32>,
    /// A change whose origin is not known: every close commits.
    unknown: bool,
}

impl Changers {
    /// Thread `tid` opened the file.
    pub fn opened_by(&mut self, tid: u32) {
        self.opened_by_with(tid, origin_of);
    }

    fn opened_by_with(&mut self, tid: u32, origin_of: impl Fn(u32) -> Origin) {
        if let Origin::Process(p) = self.origin(tid, origin_of) {
            self.opener = Some(p);
        }
    }

    /// Thread `tid` changed the file.
    pub fn changed_by(&mut self, tid: u32) {
        self.changed_by_with(tid, origin_of);
    }

    fn changed_by_with(&mut self, tid: u32, origin_of: impl Fn(u32) -> Origin) {
        match self.origin(tid, origin_of) {
            Origin::Process(p) => {
                self.processes.insert(p);
            }
            Origin::Kernel => {}
            // Pages written back (by whichever process's flush or sync),
            // the opener's to commit.
            Origin::Unknown if tid == 0 && self.opener.is_some() => {}
            Origin::Unknown => self.unknown = true,
        }
    }

    fn origin(&mut self, tid: u32, origin_of: impl Fn(u32) -> Origin) -> Origin {
        *self.threads.entry(tid).or_insert_with(|| origin_of(tid))
    }

    /// Whether a close by thread `tid` commits: its process opened the
    /// file or changed it (or some change's, or its own, origin is not
    /// known).
    pub fn commits_on_close_by(&self, tid: u32) -> bool {
        self.commits_on_close_by_with(tid, origin_of)
    }

    fn commits_on_close_by_with(&self, tid: u32, origin_of: impl Fn(u32) -> Origin) -> bool {
        if self.unknown {
            return true;
        }
        let origin = match self.threads.get(&tid) {
            Some(known) => *known,
            None => origin_of(tid),
        };
        match origin {
            Origin::Process(p) => self.opener == Some(p) || self.processes.contains(&p),
            Origin::Kernel => false,
            Origin::Unknown => true,
        }
    }

    /// Whether thread `tid` is known to belong to the process that opened
    /// the file (a thread whose process is gone, or outside the mount's pid
    /// namespace, is not).
    pub fn is_opener(&self, tid: u32) -> bool {
        let origin = self
            .threads
            .get(&tid)
            .copied()
            .unwrap_or_else(|| origin_of(tid));
        matches!(origin, Origin::Process(p) if self.opener == Some(p))
    }

    /// The file was committed: nobody changed it since.
    pub fn clear(&mut self) {
        self.processes.clear();
        self.unknown = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads 10, 11 are process 10; 20 is process 20; 2 is a kernel
    /// thread; others are not known.
    fn table(tid: u32) -> Origin {
        match tid {
            10 | 11 => Origin::Process(10),
            20 => Origin::Process(20),
            2 => Origin::Kernel,
            _ => Origin::Unknown,
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
        // A change whose process is not known, nor the opener's: any
        // close commits.
        c.changed_by_with(0, table);
        assert!(c.commits_on_close_by_with(20, table));
    }

    #[test]
    fn the_opener_commits_what_a_kernel_thread_wrote_back() {
        let mut c = Changers::default();
        c.opened_by_with(10, table);
        c.changed_by_with(2, table);
        assert!(c.commits_on_close_by_with(10, table));
        assert!(!c.commits_on_close_by_with(20, table));
        assert!(!c.commits_on_close_by_with(2, table));
        // The opener stays one after a commit.
        c.clear();
        assert!(c.commits_on_close_by_with(11, table));
    }

    #[test]
    fn pages_written_back_at_a_childs_close_are_the_openers_to_commit() {
        let mut c = Changers::default();
        c.opened_by_with(10, table);
        c.changed_by_with(10, table);
        // A forked child's exec: the kernel writes the cached pages back
        // (no pid), then the child's close of its inherited copy arrives.
        c.changed_by_with(0, table);
        assert!(!c.commits_on_close_by_with(20, table));
        assert!(c.commits_on_close_by_with(10, table));
        // A closer that cannot be told still commits.
        assert!(c.commits_on_close_by_with(30, table));
        // Only written back since the last commit: still the opener's.
        c.clear();
        c.changed_by_with(0, table);
        assert!(!c.commits_on_close_by_with(20, table));
        assert!(c.commits_on_close_by_with(11, table));
    }

    #[test]
    fn this_process_is_found() {
        // SAFETY: gettid(2) reads nothing of ours and cannot fail.
        let tid = unsafe { libc::gettid() } as u32;
        assert_eq!(origin_of(tid), Origin::Process(std::process::id()));
        assert_eq!(origin_of(0), Origin::Unknown);
        assert_eq!(origin_of(2), Origin::Kernel);
    }
}

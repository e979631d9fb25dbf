//! The daemon of one node of an emulated cluster, found from the pid file
//! `cluster up` wrote. A pid is only a number: the daemon may have exited
//! and the number been reused, or the file been planted. So `cluster down`
//! signals a process only once it is proven to be that node's daemon — our
//! user's process running `serve --cluster <this cluster's file> --node <n>`
//! — and signals it through a pidfd, which keeps naming that process even if
//! it exits and its number is reused meanwhile.

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

/// A process proven to be the daemon of one node.
pub struct NodeProcess {
    pub pid: i32,
    pidfd: OwnedFd,
}

/// What a pid file's number turned out to name.
pub enum Found {
    /// The node's daemon, running.
    Node(NodeProcess),
    /// No process has that number (the daemon is gone).
    Gone,
    /// A process that is not the node's daemon: left alone; why.
    Other(String),
}

impl NodeProcess {
    /// Finds whether `pid` is the daemon of node `node` of the cluster whose
    /// file is `file`.
    pub fn find(pid: i32, file: &Path, node: u32) -> Result<Found> {
        let Some(id) = Pid::from_raw(pid).filter(|_| pid > 0) else {
            return Ok(Found::Other(format!("{pid} is not a process id")));
        };
        // Opened first: from here on, `pidfd` names this very process, so
        // what /proc says below is about it as long as it is still running.
        let pidfd = match pidfd_open(id, PidfdFlags::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::SRCH) => return Ok(Found::Gone),
            Err(rustix::io::Errno::NOSYS) => {
                bail!("stopping cluster nodes safely needs pidfd_open (Linux 5.3 or later)")
            }
            Err(err) => return Err(err).with_context(|| format!("pidfd_open({pid})")),
        };
        let process = NodeProcess { pid, pidfd };
        let verdict = process.identify(file, node);
        // Exited while we looked: what we read may be of a successor.
        if process.exited()? {
            return Ok(Found::Gone);
        }
        Ok(match verdict {
            Ok(()) => Found::Node(process),
            Err(why) => Found::Other(why),
        })
    }

    /// Whether this process runs as our user with a command line that
    /// serves `node` of the cluster in `file`; `Err(why not)`.
    fn identify(&self, file: &Path, node: u32) -> Result<(), String> {
        let proc_dir = PathBuf::from(format!("/proc/{}", self.pid));
        let owner = std::fs::metadata(&proc_dir)
            .map_err(|e| format!("cannot inspect process {}: {e}", self.pid))?
            .uid();
        let me = shoal_core::local_auth::my_uid();
        if owner != me {
            return Err(format!(
                "process {} runs as uid {owner}, not {me}",
                self.pid
            ));
        }
        let read_cmdline = || {
            std::fs::read(proc_dir.join("cmdline"))
                .map_err(|e| format!("cannot read the command line of {}: {e}", self.pid))
        };
        let mut cmdline = read_cmdline()?;
        // A process in the middle of exec shows an empty command line for a
        // moment (its new arguments are not set up yet); a zombie or kernel
        // thread shows one for good.
        for _ in 0..20 {
            if !cmdline.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
            cmdline = read_cmdline()?;
        }
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let served = served_node(&args).ok_or_else(|| {
            format!(
                "process {} is not a cluster node daemon: {}",
                self.pid,
                args.join(" ").trim()
            )
        })?;
        if served.1 != node {
            return Err(format!(
                "process {} serves node {}, not {node}",
                self.pid, served.1
            ));
        }
        // A relative path names a file from the daemon's working directory.
        let named = match Path::new(&served.0) {
            path if path.is_absolute() => path.to_path_buf(),
            path => std::fs::read_link(proc_dir.join("cwd"))
                .map_err(|e| format!("cannot read the directory of {}: {e}", self.pid))?
                .join(path),
        };
        if !same_place(&named, file) {
            return Err(format!(
                "process {} serves the cluster of {}, not {}",
                self.pid,
                named.display(),
                file.display()
            ));
        }
        Ok(())
    }

    /// Whether the process has exited (its pidfd turns readable then).
    pub fn exited(&self) -> Result<bool> {
        self.wait_exit(Instant::now())
    }

    /// Sends `signal` to this process (never to a later holder of its pid).
    pub fn signal(&self, signal: Signal) -> Result<()> {
        match pidfd_send_signal(&self.pidfd, signal) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
            Err(err) => Err(err).with_context(|| format!("signal process {}", self.pid)),
        }
    }

    /// Waits until the process has exited or `deadline` passed; whether it exited.
    pub fn wait_exit(&self, deadline: Instant) -> Result<bool> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let timeout = Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
            match poll(&mut fds, Some(&timeout)) {
                Ok(0) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(rustix::io::Errno::INTR) => continue,
                Err(err) => return Err(err).with_context(|| format!("wait for {}", self.pid)),
            }
        }
    }
}

/// The cluster file and node a daemon's arguments serve:
/// `... serve --cluster FILE --node N ...`, as `cluster up` starts it.
fn served_node(args: &[String]) -> Option<(String, u32)> {
    args.windows(5).find_map(|w| {
        (w[0] == "serve" && w[1] == "--cluster" && w[3] == "--node")
            .then(|| w[4].parse().ok().map(|node| (w[2].clone(), node)))
            .flatten()
    })
}

/// Whether two paths name the same entry of the same directory (the file
/// itself may be gone: `down` removes it after stopping the nodes).
fn same_place(a: &Path, b: &Path) -> bool {
    let resolve = |p: &Path| -> Option<PathBuf> {
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty())?;
        Some(dir.canonicalize().ok()?.join(p.file_name()?))
    };
    matches!((resolve(a), resolve(b)), (Some(x), Some(y)) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};

    use std::time::Duration;

    fn args(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_owned).collect()
    }

    /// A child whose command line is `sh -c 'read _' sh <extra...>`: it
    /// waits on its stdin in a builtin, so it stays that one process.
    fn process(extra: &[&str], dir: &Path) -> Child {
        Command::new("sh")
            .args(["-c", "read _", "sh"])
            .args(extra)
            .current_dir(dir)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn stop(mut child: Child) {
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn daemon_arguments_name_the_node() {
        let line = "/usr/bin/python3 -m shoal serve --cluster /tmp/c/cluster.toml --node 2";
        assert_eq!(
            served_node(&args(line)),
            Some(("/tmp/c/cluster.toml".into(), 2))
        );
        assert_eq!(served_node(&args("sleep 1000")), None);
        assert_eq!(served_node(&args("shoal serve --socket x.sock")), None);
        assert_eq!(served_node(&args("shoal serve --cluster f --node x")), None);
    }

    #[test]
    fn an_unrelated_process_is_not_a_node() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("cluster.toml");
        let child = process(&[], tmp.path());
        let found = NodeProcess::find(child.id() as i32, &file, 0).unwrap();
        assert!(matches!(found, Found::Other(ref why) if why.contains("not a cluster node")));
        stop(child);
    }

    #[test]
    fn a_node_of_another_cluster_or_id_is_not_this_node() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("cluster.toml");
        let other = tempfile::tempdir().unwrap();
        let other_file = other.path().join("cluster.toml");
        let child = process(
            &[
                "serve",
                "--cluster",
                other_file.to_str().unwrap(),
                "--node",
                "0",
            ],
            tmp.path(),
        );
        let pid = child.id() as i32;
        assert!(matches!(
            NodeProcess::find(pid, &file, 0).unwrap(),
            Found::Other(ref why) if why.contains("serves the cluster of")
        ));
        assert!(matches!(
            NodeProcess::find(pid, &other_file, 1).unwrap(),
            Found::Other(ref why) if why.contains("not 1")
        ));
        stop(child);
    }

    #[test]
    fn the_node_is_found_stopped_and_then_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("cluster.toml");
        let mut child = process(
            &["serve", "--cluster", file.to_str().unwrap(), "--node", "3"],
            tmp.path(),
        );
        let pid = child.id() as i32;
        let node = match NodeProcess::find(pid, &file, 3).unwrap() {
            Found::Node(node) => node,
            Found::Gone => panic!("gone"),
            Found::Other(why) => panic!("the node was not recognised: {why}"),
        };
        assert!(!node.exited().unwrap());
        node.signal(Signal::TERM).unwrap();
        assert!(node
            .wait_exit(Instant::now() + Duration::from_secs(5))
            .unwrap());
        child.wait().unwrap();
        assert!(matches!(
            NodeProcess::find(pid, &file, 3).unwrap(),
            Found::Gone
        ));
    }

    #[test]
    fn a_relative_cluster_file_is_read_from_the_daemon_s_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("cluster.toml");
        let child = process(
            &["serve", "--cluster", "cluster.toml", "--node", "0"],
            tmp.path(),
        );
        assert!(matches!(
            NodeProcess::find(child.id() as i32, &file, 0).unwrap(),
            Found::Node(_)
        ));
        stop(child);
    }
}

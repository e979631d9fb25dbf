//! Issue 15, items 4 and 6: a daemon out of file descriptors neither spins
//! nor stops serving (it closes the connection idle the longest that holds
//! nothing, never one holding a reference), and connections sending large
//! incomplete frames cannot grow it without bound.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::shoal;
use shoal_client::Client;
use shoal_core::error::ErrorKind;
use shoal_core::ObjectId;
use shoal_testing::ServeProcess;

struct Daemon(ServeProcess);

impl Daemon {
    /// `shoal serve` with at most `files` open file descriptors (if given).
    fn start(socket: &Path, files: Option<u64>) -> Self {
        let mut command = shoal();
        command
            .args(["serve", "--capacity", "64MiB", "--no-prefault", "--socket"])
            .arg(socket);
        if let Some(files) = files {
            // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
            unsafe {
                command.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: files,
                        rlim_max: files,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        Self(ServeProcess::spawn(command, socket))
    }

    fn status(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.pid())).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("{field} in {status}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// CPU seconds the daemon used so far.
    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.pid())).unwrap();
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }
}

#[test]
fn out_of_descriptors_the_longest_idle_client_holding_nothing_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("fds.sock");
    let daemon = Daemon::start(&socket, Some(48));
    // A client holding a reference: never the one closed.
    let mut holder = Client::connect(&socket).unwrap();
    let id = ObjectId::random();
    holder.put(id, b"held bytes", b"").unwrap();
    let located = holder.get(&[id], 0).unwrap()[0].unwrap();
    let cpu_before = daemon.cpu_seconds();
    let started = Instant::now();
    // A daemon that stops accepting would leave `connect` waiting forever:
    // past a minute, a watchdog kills it, so the connect fails the test.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let (done, pid) = (done.clone(), daemon.0.pid() as i32);
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                if Instant::now() > deadline {
                    // SAFETY: signalling our own child, still running.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // Far more idle clients than the daemon has descriptors for: each one
    // past the limit gets in once an older idle one is closed.
    let mut idle = Vec::new();
    for _ in 0..80 {
        idle.push(Client::connect(&socket).unwrap());
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "connections stopped being accepted"
        );
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    watchdog.join().unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = daemon.cpu_seconds() - cpu_before;
    assert!(
        cpu < 0.5 * elapsed,
        "the daemon spun: {cpu:.2} s of CPU in {elapsed:.2} s"
    );
    // The oldest idle clients were closed, with a clear error; the newest works.
    let first = idle[0].stats().unwrap_err();
    assert_eq!(first.kind(), ErrorKind::Disconnected, "{first}");
    assert!(idle.last_mut().unwrap().stats().is_ok());
    // The holder was kept: its reference, its bytes, its connection.
    // SAFETY: the holder still references the object.
    let bytes = unsafe { holder.data(located.location) };
    assert_eq!(bytes, b"held bytes");
    holder.release(&[id]).unwrap();
    assert!(holder.contains(id).unwrap());
}

fn frame_header(len: u32) -> [u8; 8] {
    let mut header = [0u8; 8];
    header[..4].copy_from_slice(&len.to_le_bytes());
    header[4..6].copy_from_slice(&1u16.to_le_bytes());
    header
}

#[test]
fn large_incomplete_frames_are_bounded_in_total_and_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("frames.sock");
    let daemon = Daemon::start(&socket, None);
    let base = daemon.status("RssAnon:");
    // Eight connections each send a 60 MiB frame's header and 50 MiB of it.
    let body = vec![7u8; 50 << 20];
    let mut kept = Vec::new();
    let mut refused = 0;
    for _ in 0..8 {
        let mut stream = UnixStream::connect(&socket).unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let sent = stream
            .write_all(&frame_header(60 << 20))
            .and_then(|()| stream.write_all(&body));
        match sent {
            Ok(()) => kept.push(stream),
            // The daemon refused the frame and closed the connection.
            Err(_) => refused += 1,
        }
    }
    // Let the daemon read what it accepted.
    std::thread::sleep(Duration::from_millis(500));
    let grown = daemon.status("RssAnon:").saturating_sub(base);
    assert!(
        grown < 150 << 10,
        "the daemon grew by {} MiB buffering incomplete frames",
        grown >> 10
    );
    assert!(
        refused >= 5,
        "refused {refused} of 8 (budget: two 60 MiB frames)"
    );
    // A client of good faith is served meanwhile.
    let mut client = Client::connect(&socket).unwrap();
    client.put(ObjectId::random(), b"ok", b"").unwrap();
    // Closed connections give their buffers back.
    drop(kept);
    std::thread::sleep(Duration::from_millis(300));
    client.stats().unwrap();
    let after = daemon.status("RssAnon:").saturating_sub(base);
    assert!(
        after < 32 << 10,
        "{} MiB kept after the connections closed",
        after >> 10
    );
}

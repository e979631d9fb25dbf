//! `shoal mount` over a real daemon (both the `shoal` binary): files and
//! directories through std::fs, names shared with the client API,
//! unmodified programs (cp, dd, rsync, fio), bad names, concurrent
//! writers, mmap, a full store, a file too large, the daemon killed under a
//! writer, files closed at a durable level (also renamed ones, as rsync
//! leaves them) surviving a restart, and a mount on one node of a cluster
//! serving every node's names.
//!
//! Every test needs /dev/fuse and either root or fusermount3 (Debian's
//! fuse3, installed by `SHOAL_FEATURES=full scripts/setup.sh`); without them each says SKIPPED
//! and why.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shoal_client::Client;
use shoal_testing::ServeProcess;

use crate::support::shoal;

const MIB: usize = 1024 * 1024;

/// Why mounting cannot work here, if it cannot.
fn fuse_missing() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse on this machine".into());
    }
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let helper = Command::new("fusermount3")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    (!root && !helper).then(|| {
        "not root and no fusermount3 (SHOAL_FEATURES=full ./scripts/setup.sh installs fuse3)".into()
    })
}

macro_rules! need_fuse {
    ($test:literal) => {
        if let Some(why) = fuse_missing() {
            eprintln!("SKIPPED {}: {why}", $test);
            return;
        }
    };
}

fn log(dir: &Path, name: &str) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .unwrap()
}

/// A daemon and a mount of it, both `shoal` processes, in a temp dir.
struct Fixture {
    dir: tempfile::TempDir,
    socket: PathBuf,
    mnt: PathBuf,
    daemon: Option<ServeProcess>,
    mount: Option<Child>,
}

impl Fixture {
    fn new(serve_args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("shoal.sock");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        let mut fixture = Self {
            dir,
            socket,
            mnt,
            daemon: None,
            mount: None,
        };
        fixture.start_daemon(serve_args);
        fixture.start_mount(&[]);
        fixture
    }

    fn start_daemon(&mut self, serve_args: &[&str]) {
        let mut command = shoal();
        command
            .args(["serve", "--no-prefault", "-s"])
            .arg(&self.socket)
            .args(serve_args)
            .stdout(Stdio::null())
            .stderr(log(self.dir.path(), "daemon.log"));
        self.daemon = Some(ServeProcess::spawn(command, &self.socket));
    }

    fn start_mount(&mut self, args: &[&str]) {
        let child = shoal()
            .arg("mount")
            .arg("-s")
            .arg(&self.socket)
            .arg(&self.mnt)
            .args(args)
            .stdout(Stdio::null())
            .stderr(log(self.dir.path(), "mount.log"))
            .spawn()
            .unwrap();
        self.mount = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !mounted(&self.mnt) {
            assert!(
                Instant::now() < deadline,
                "mount did not come up: {}",
                fs::read_to_string(self.dir.path().join("mount.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    fn kill_daemon(&mut self) {
        self.daemon.take().unwrap().kill();
    }

    /// Stops the mount (SIGTERM) and waits for it to leave.
    fn stop_mount(&mut self) {
        if let Some(mut mount) = self.mount.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(mount.id() as i32, libc::SIGTERM) };
            let _ = mount.wait();
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.stop_mount();
        if mounted(&self.mnt) {
            let _ = shoal().arg("umount").arg(&self.mnt).status();
        }
        // The daemon, if any, is killed as it drops.
        self.daemon.take();
    }
}

/// Whether `path` is a mount point (in this process's mount table).
fn mounted(path: &Path) -> bool {
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap();
    table
        .lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|m| m == want))
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + seed as usize * 7) % 251) as u8)
        .collect()
}

fn read_named(client: &mut Client, name: &str) -> Vec<u8> {
    let (entry, located) = client.get_named(name, 0).unwrap();
    // SAFETY: referenced until the release below.
    let bytes = unsafe { client.data(located.location) }.to_vec();
    client.release(&[entry.id]).unwrap();
    bytes
}

/// close(2) with its error (dropping a File ignores it).
fn close(file: File) -> std::io::Result<()> {
    // SAFETY: we own the descriptor and close it once.
    if unsafe { libc::close(file.into_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn run(command: &mut Command) {
    let output = command.output().unwrap_or_else(|e| {
        panic!("{command:?}: {e} (scripts/setup-test-tools.sh installs rsync and fio)")
    });
    assert!(
        output.status.success(),
        "{command:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn files_and_directories_are_names_both_ways() {
    need_fuse!("files_and_directories_are_names_both_ways");
    let f = Fixture::new(&["-m", "64MiB"]);
    let mut client = f.client();

    // Written through the mount, gettable by name.
    fs::create_dir_all(f.path("runs/1")).unwrap();
    fs::write(f.path("runs/1/a.bin"), pattern(1, 300_000)).unwrap();
    assert_eq!(read_named(&mut client, "runs/1/a.bin"), pattern(1, 300_000));
    // Put by name, a file on the mount.
    client
        .put_named("runs/2/b.txt", b"from the API", b"", None, 0)
        .unwrap();
    assert_eq!(fs::read(f.path("runs/2/b.txt")).unwrap(), b"from the API");
    let meta = fs::metadata(f.path("runs/1/a.bin")).unwrap();
    assert_eq!(meta.len(), 300_000);
    assert!(meta.is_file() && fs::metadata(f.path("runs")).unwrap().is_dir());
    let age = std::time::SystemTime::now()
        .duration_since(meta.modified().unwrap())
        .unwrap();
    assert!(age < Duration::from_secs(60), "mtime is the seal time");
    let mut listing: Vec<String> = fs::read_dir(f.path("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    listing.sort();
    assert_eq!(listing, ["1", "2"]);

    // Random offsets and growth, read back before and after close.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(f.path("runs/1/sparse"))
        .unwrap();
    file.seek(SeekFrom::Start(1000)).unwrap();
    file.write_all(b"tail").unwrap();
    file.seek(SeekFrom::Start(10)).unwrap();
    file.write_all(b"head").unwrap();
    file.seek(SeekFrom::Start(0)).unwrap();
    let mut back = Vec::new();
    file.read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), 1004);
    close(file).unwrap();
    let stored = read_named(&mut client, "runs/1/sparse");
    assert_eq!(
        (&stored[10..14], &stored[1000..], stored[0]),
        (&b"head"[..], &b"tail"[..], 0)
    );
    // Appending keeps what was there.
    let mut file = OpenOptions::new()
        .append(true)
        .open(f.path("runs/1/sparse"))
        .unwrap();
    file.write_all(b"!").unwrap();
    close(file).unwrap();
    assert_eq!(fs::read(f.path("runs/1/sparse")).unwrap().len(), 1005);

    // Renames of files and directories, unlink, rmdir.
    fs::rename(f.path("runs/1"), f.path("old")).unwrap();
    assert_eq!(read_named(&mut client, "old/a.bin"), pattern(1, 300_000));
    assert!(client.resolve("runs/1/a.bin").is_err());
    fs::rename(f.path("old/a.bin"), f.path("runs/2/b.txt")).unwrap();
    assert_eq!(
        fs::read(f.path("runs/2/b.txt")).unwrap(),
        pattern(1, 300_000)
    );
    fs::remove_file(f.path("runs/2/b.txt")).unwrap();
    assert!(client.resolve("runs/2/b.txt").is_err());
    let err = fs::remove_dir(f.path("old")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTEMPTY));
    fs::remove_file(f.path("old/sparse")).unwrap();
    fs::remove_dir(f.path("old")).unwrap();
    fs::create_dir(f.path("empty")).unwrap();
    assert!(f.path("empty").is_dir());
    fs::remove_dir(f.path("empty")).unwrap();
    assert!(!f.path("empty").exists());
    assert!(client.list_names("").unwrap().is_empty());
}

#[test]
fn unmodified_programs_cp_dd_rsync_fio() {
    need_fuse!("unmodified_programs_cp_dd_rsync_fio");
    let f = Fixture::new(&["-m", "256MiB"]);
    let src = f.dir.path().join("src");
    fs::create_dir_all(src.join("deep/er")).unwrap();
    for (i, size) in [1usize, 4096, 100_000, 3 * MIB].iter().enumerate() {
        fs::write(src.join(format!("deep/er/f{i}")), pattern(i as u8, *size)).unwrap();
    }
    let big = src.join("big");
    fs::write(&big, pattern(9, 20 * MIB + 17)).unwrap();

    run(Command::new("cp").arg(&big).arg(f.path("big")));
    assert_eq!(fs::read(f.path("big")).unwrap(), fs::read(&big).unwrap());
    run(Command::new("dd")
        .arg(format!("if={}", big.display()))
        .arg(format!("of={}", f.path("dd.out").display()))
        .args(["bs=1M", "conv=fsync", "status=none"]));
    run(Command::new("cmp").arg(&big).arg(f.path("dd.out")));
    run(Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", src.display()))
        .arg(format!("{}/", f.path("tree").display())));
    run(Command::new("diff").arg("-r").arg(&src).arg(f.path("tree")));
    // fio writes with random offsets and verifies what it reads back.
    run(Command::new("fio")
        .args([
            "--name=verify",
            "--rw=randwrite",
            "--bs=16k",
            "--size=8m",
            "--numjobs=2",
            "--ioengine=psync",
            "--verify=crc32c",
            "--do_verify=1",
            // fio otherwise leaves its verify state files in the working directory.
            "--verify_state_save=0",
        ])
        .arg(format!("--directory={}", f.path("").display())));
    run(Command::new("fio")
        .args([
            "--name=seq",
            "--rw=write",
            "--bs=1m",
            "--size=16m",
            "--ioengine=psync",
            "--end_fsync=1",
        ])
        .arg(format!("--directory={}", f.path("").display())));
    let mut client = f.client();
    assert_eq!(read_named(&mut client, "seq.0.0").len(), 16 * MIB);
}

#[test]
fn bad_names_are_einval_or_enametoolong() {
    need_fuse!("bad_names_are_einval_or_enametoolong");
    let f = Fixture::new(&["-m", "16MiB"]);
    let long = f.path(&"x".repeat(256));
    let err = fs::write(&long, b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENAMETOOLONG), "{err}");
    // Names are UTF-8: other bytes are refused.
    let bad = f.mnt.join(std::ffi::OsStr::from_bytes(b"bad\xff"));
    let err = fs::write(&bad, b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    assert!(f.client().list_names("").unwrap().is_empty());
}

/// Every close(2) of a descriptor of an open file reaches the mount, also
/// a forked child's inherited copy closed at its exec, and an `O_TRUNC`
/// open used to truncate every draft of the name open on the mount: a
/// writer that started a program while writing published its unfinished
/// file, and one still held by a child was published empty.
#[test]
fn a_program_started_while_a_file_is_written_publishes_nothing_unfinished() {
    need_fuse!("a_program_started_while_a_file_is_written_publishes_nothing_unfinished");
    let f = Fixture::new(&["-m", "256MiB"]);
    let mut client = f.client();
    let (old, new, third) = (
        pattern(1, 3 * MIB),
        pattern(2, 4 * MIB),
        pattern(3, 2 * MIB),
    );
    fs::write(f.path("v"), &old).unwrap();

    let mut file = File::create(f.path("v")).unwrap();
    file.write_all(&new[..2 * MIB]).unwrap();
    // The child has a copy of the descriptor until its exec closes it.
    run(&mut Command::new("true"));
    assert!(
        read_named(&mut client, "v") == old,
        "a child's exec published a draft"
    );
    // A child that keeps the descriptor through its exec and holds the
    // file past our close.
    let fd = file.as_raw_fd();
    let mut holder = Command::new("sleep");
    holder.arg("1");
    // SAFETY: fcntl is async-signal-safe; the descriptor is ours.
    unsafe {
        holder.pre_exec(move || match libc::fcntl(fd, libc::F_SETFD, 0) {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        })
    };
    let mut holder = holder.spawn().unwrap();
    file.write_all(&new[2 * MIB..]).unwrap();
    assert!(read_named(&mut client, "v") == old);
    close(file).unwrap();
    assert!(
        read_named(&mut client, "v") == new,
        "the writer's close commits"
    );

    // A rewrite while the child still holds the first file: truncating the
    // new one must not reach the first, which the child's exit releases.
    let mut again = File::create(f.path("v")).unwrap();
    again.write_all(&third[..MIB]).unwrap();
    assert!(holder.wait().unwrap().success());
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        read_named(&mut client, "v") == new,
        "the held file was published again"
    );
    again.write_all(&third[MIB..]).unwrap();
    close(again).unwrap();
    assert!(read_named(&mut client, "v") == third);
    assert!(fs::read(f.path("v")).unwrap() == third);
}

/// The kernel keeps a name's entry for a TTL: a file another client just
/// removed is still known to it, and creating it again must not fail
/// (fio_matrix clears the names through the API before each write).
#[test]
fn a_file_another_client_removed_can_be_created_again_at_once() {
    need_fuse!("a_file_another_client_removed_can_be_created_again_at_once");
    let f = Fixture::new(&["-m", "64MiB"]);
    let mut client = f.client();
    for round in 0..3u8 {
        fs::write(f.path("again"), pattern(round, 100_000)).unwrap();
        assert!(fs::metadata(f.path("again")).is_ok());
        client.unlink("again").unwrap();
        // O_CREAT | O_TRUNC, and O_CREAT alone, right after the unlink.
        let mut file = if round % 2 == 0 {
            File::create(f.path("again")).unwrap()
        } else {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(f.path("again"))
                .unwrap()
        };
        file.write_all(b"new").unwrap();
        close(file).unwrap();
        assert_eq!(read_named(&mut client, "again"), b"new");
    }
}

#[test]
fn concurrent_writers_last_close_wins_and_never_mix() {
    need_fuse!("concurrent_writers_last_close_wins_and_never_mix");
    let f = Fixture::new(&["-m", "64MiB"]);
    let open = || {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(f.path("shared"))
            .unwrap()
    };
    for last in [0u8, 1] {
        let (mut a, mut b) = (open(), open());
        // Interleaved writes at the same offsets.
        for chunk in 0..8 {
            a.write_all(&pattern(10, 64 * 1024)[..]).unwrap();
            b.write_all(&pattern(20, 48 * 1024)[..]).unwrap();
            assert!(chunk < 8);
        }
        let (first, second) = if last == 0 { (b, a) } else { (a, b) };
        close(first).unwrap();
        close(second).unwrap();
        let got = fs::read(f.path("shared")).unwrap();
        let want: Vec<u8> = if last == 0 {
            pattern(10, 64 * 1024).repeat(8)
        } else {
            pattern(20, 48 * 1024).repeat(8)
        };
        assert!(got == want, "last close {last}: a mixed or wrong file");
        assert!(read_named(&mut f.client(), "shared") == want);
    }
}

#[test]
fn sealed_files_map_and_reread_from_the_page_cache() {
    need_fuse!("sealed_files_map_and_reread_from_the_page_cache");
    let f = Fixture::new(&["-m", "64MiB"]);
    let bytes = pattern(3, 5 * MIB + 123);
    f.client()
        .put_named("mapped", &bytes, b"", None, 0)
        .unwrap();
    let file = File::open(f.path("mapped")).unwrap();
    // SAFETY: a private read-only mapping of a file we keep open; unmapped below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes.len(),
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED);
    // SAFETY: mapped above, bytes.len() long.
    let mapped = unsafe { std::slice::from_raw_parts(ptr as *const u8, bytes.len()) };
    assert!(mapped == &bytes[..]);
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(ptr, bytes.len()) };
    drop(file);
    // Reread (kept cache) and after a rewrite (new bytes, not the cached ones).
    assert!(fs::read(f.path("mapped")).unwrap() == bytes);
    f.client()
        .put_named("mapped", b"rewritten", b"", None, 0)
        .unwrap();
    std::thread::sleep(Duration::from_millis(1100)); // the attribute TTL
    assert_eq!(fs::read(f.path("mapped")).unwrap(), b"rewritten");
}

#[test]
fn a_full_store_is_enospc_and_a_file_larger_than_memory_efbig() {
    need_fuse!("a_full_store_is_enospc_and_a_file_larger_than_memory_efbig");
    let mut f = Fixture::new(&["-m", "32MiB"]);
    f.stop_mount();
    f.start_mount(&["--space-wait-ms", "200"]);
    fs::write(f.path("a"), pattern(1, 20 * MIB)).unwrap();
    // Held open (referenced): it cannot be evicted for the next one.
    let held = File::open(f.path("a")).unwrap();
    let mut b = File::create(f.path("b")).unwrap();
    // The file's bytes go into store memory as they are written: the write
    // that finds no room is ENOSPC; what was written before it is kept, as
    // on a local file system.
    let err = b.write_all(&pattern(2, 20 * MIB)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    close(b).unwrap();
    let kept = read_named(&mut f.client(), "b");
    assert!(!kept.is_empty() && kept.len() < 20 * MIB, "{}", kept.len());
    assert!(kept[..] == pattern(2, 20 * MIB)[..kept.len()]);
    drop(held);
    let mut c = File::create(f.path("c")).unwrap();
    c.seek(SeekFrom::Start(40 * MIB as u64)).unwrap();
    let err = c.write_all(b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EFBIG), "{err}");
}

#[test]
fn a_file_too_large_to_copy_can_still_be_opened_truncated_and_kept_in_part() {
    need_fuse!("a_file_too_large_to_copy_can_still_be_opened_truncated_and_kept_in_part");
    let mut f = Fixture::new(&["-m", "32MiB"]);
    f.stop_mount();
    f.start_mount(&["--space-wait-ms", "200"]);
    let bytes = pattern(3, 20 * MIB);
    fs::write(f.path("big"), &bytes).unwrap();
    // No room for a second copy: an open for writing copies nothing until
    // the file changes, and a truncate copies only what it keeps.
    let file = OpenOptions::new().write(true).open(f.path("big")).unwrap();
    close(file).unwrap();
    assert!(read_named(&mut f.client(), "big") == bytes);
    let file = OpenOptions::new().write(true).open(f.path("big")).unwrap();
    file.set_len(3 * MIB as u64).unwrap();
    close(file).unwrap();
    assert!(read_named(&mut f.client(), "big") == bytes[..3 * MIB]);
    run(Command::new("truncate")
        .args(["-s", "0"])
        .arg(f.path("big")));
    assert!(read_named(&mut f.client(), "big").is_empty());
}

#[test]
fn the_daemon_killed_under_a_writer_is_eio_and_ends_the_mount() {
    need_fuse!("the_daemon_killed_under_a_writer_is_eio_and_ends_the_mount");
    let mut f = Fixture::new(&["-m", "64MiB"]);
    let mut file = File::create(f.path("w")).unwrap();
    file.write_all(&pattern(1, MIB)).unwrap();
    f.kill_daemon();
    let started = Instant::now();
    let write = file
        .write_all(&pattern(2, MIB))
        .and_then(|()| file.sync_all());
    let err = write.unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(file);
    // The mount ends by itself, with a non-zero status saying why.
    let mut mount = f.mount.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = mount.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the mount did not end");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    assert!(!mounted(&f.mnt), "the mount point is free");
    let log = fs::read_to_string(f.dir.path().join("mount.log")).unwrap();
    assert!(log.contains("went away"), "{log}");
}

#[test]
fn files_closed_at_a_durable_level_survive_a_restart() {
    need_fuse!("files_closed_at_a_durable_level_survive_a_restart");
    let tiers = |f: &Fixture| {
        vec![
            "-m".to_string(),
            "64MiB".into(),
            "--durability".into(),
            "local".into(),
            "--burst".into(),
            f.dir.path().join("burst").display().to_string(),
            "--backing".into(),
            f.dir.path().join("backing").display().to_string(),
        ]
    };
    let mut f = Fixture::new(&["-m", "8MiB"]);
    f.stop_mount();
    f.kill_daemon();
    let args = tiers(&f);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    f.start_daemon(&args);
    f.start_mount(&[]);
    fs::create_dir(f.path("keep")).unwrap();
    for i in 0..5u8 {
        fs::write(
            f.path(&format!("keep/f{i}")),
            pattern(i, 100_000 * (i as usize + 1)),
        )
        .unwrap();
    }
    // rsync writes each file under a temporary name, then renames it.
    let src = f.dir.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("sub/r"), pattern(7, 70_000)).unwrap();
    run(Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", src.display()))
        .arg(format!("{}/", f.path("synced").display())));
    // Times set after the file reached the tiers: kept in its record.
    run(Command::new("touch")
        .args(["-m", "-d", "2002-02-02 02:02:02.5 UTC"])
        .arg(f.path("keep/f1")));
    let touched = std::time::UNIX_EPOCH + Duration::from_millis(1_012_615_322_500);
    // Times are kept in ms.
    let ms =
        |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    let synced = ms(mtime_of(&src.join("sub/r")));
    assert_eq!(
        ms(mtime_of(&f.path("synced/sub/r"))),
        synced,
        "rsync -a sets the time"
    );
    f.kill_daemon(); // kill -9: only what reached the burst buffer is left
    f.stop_mount();
    f.start_daemon(&args);
    f.start_mount(&[]);
    for i in 0..5u8 {
        let got = fs::read(f.path(&format!("keep/f{i}"))).unwrap();
        assert!(got == pattern(i, 100_000 * (i as usize + 1)), "keep/f{i}");
    }
    run(Command::new("diff")
        .arg("-r")
        .arg(&src)
        .arg(f.path("synced")));
    assert_eq!(
        mtime_of(&f.path("keep/f1")),
        touched,
        "touch -d after a restart"
    );
    assert_eq!(
        ms(mtime_of(&f.path("synced/sub/r"))),
        synced,
        "rsync's time after a restart"
    );
}

#[test]
fn a_write_waiting_for_memory_does_not_hold_up_reads_of_other_files() {
    need_fuse!("a_write_waiting_for_memory_does_not_hold_up_reads_of_other_files");
    let mut f = Fixture::new(&["-m", "32MiB"]);
    f.stop_mount();
    f.start_mount(&["--space-wait-ms", "3000", "--threads", "2"]);
    // Put through the API: the mount's page cache has never seen it, so the
    // read below has to reach the mount.
    let held_bytes = pattern(1, 20 * MIB);
    f.client()
        .put_named("held", &held_bytes, b"", None, 0)
        .unwrap();
    // Held open (referenced): it cannot be evicted for the next file.
    let mut held = File::open(f.path("held")).unwrap();
    // Another program's write waits for memory on one session thread. A
    // process of its own, as a program would be: from a thread of this test
    // process, the read below stalled with it only while the other tests
    // (forking rsync, fio) ran beside it in this process, never alone, so
    // that stall was this process's, not the mount's...
    let started = Instant::now();
    let writer = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", f.path("b").display()))
        .args(["bs=1M", "count=20", "status=none"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // ...while another one serves the reads.
    let read_started = Instant::now();
    let mut first = vec![0; 4 * MIB];
    held.read_exact(&mut first).unwrap();
    let read_took = read_started.elapsed();
    let written = writer.wait_with_output().unwrap();
    let write_took = started.elapsed();
    let stderr = String::from_utf8_lossy(&written.stderr);
    assert!(
        !written.status.success() && stderr.contains("No space left"),
        "{stderr}"
    );
    assert!(write_took >= Duration::from_millis(2500), "{write_took:?}");
    assert!(first == held_bytes[..4 * MIB]);
    assert!(
        read_took < Duration::from_millis(1500),
        "a read waited {read_took:?} behind a write"
    );
}

#[test]
fn the_writeback_cache_keeps_versions_whole_and_refuses_a_second_writer() {
    need_fuse!("the_writeback_cache_keeps_versions_whole_and_refuses_a_second_writer");
    let mut f = Fixture::new(&["-m", "64MiB"]);
    f.stop_mount();
    f.start_mount(&["--writeback-cache"]);
    // 16 KiB blocks in a scattered order, as fio's random writes.
    let block = 16 * 1024;
    let blocks = 256;
    let mut want = vec![0u8; block * blocks];
    let mut file = File::create(f.path("wb")).unwrap();
    for i in 0..blocks {
        let at = (i * 97) % blocks;
        let bytes = pattern(at as u8, block);
        want[at * block..(at + 1) * block].copy_from_slice(&bytes);
        file.seek(SeekFrom::Start((at * block) as u64)).unwrap();
        file.write_all(&bytes).unwrap();
    }
    // A second writer of the same file on this mount: the kernel's cache
    // would mix the two, so it is refused while the first is open.
    let second = OpenOptions::new().write(true).open(f.path("wb"));
    assert_eq!(
        second.unwrap_err().raw_os_error(),
        Some(libc::EBUSY),
        "second writer"
    );
    // Nothing is a version before the close.
    assert!(f.client().resolve("wb").is_err());
    close(file).unwrap();
    assert!(read_named(&mut f.client(), "wb") == want);
    // Closed and at once opened for writing again: the kernel sends the old
    // handle's RELEASE after close() returned, and the open must not take
    // it for a second writer.
    for round in 0..200 {
        let again = OpenOptions::new().write(true).open(f.path("wb"));
        close(again.unwrap_or_else(|e| panic!("reopen {round}: {e}"))).unwrap();
    }
    // Unaligned writes into the existing file: the kernel reads the rest of
    // each page through the handle open for writing.
    let mut file = OpenOptions::new().write(true).open(f.path("wb")).unwrap();
    file.seek(SeekFrom::Start(5000)).unwrap();
    file.write_all(b"unaligned").unwrap();
    want[5000..5009].copy_from_slice(b"unaligned");
    close(file).unwrap();
    assert!(read_named(&mut f.client(), "wb") == want);
    assert!(fs::read(f.path("wb")).unwrap() == want);
    // Past the store's capacity: the page cache takes the write, the close
    // fails (the write-back is refused), and no byte of it is stored (the
    // file itself was created, as on any file system).
    let mut big = File::create(f.path("big")).unwrap();
    big.seek(SeekFrom::Start(80 * MIB as u64)).unwrap();
    let written = big.write_all(b"x");
    let closed = close(big);
    let err = written.and(closed).unwrap_err();
    assert!(
        matches!(err.raw_os_error(), Some(libc::EIO | libc::EFBIG)),
        "{err}"
    );
    if let Ok(entry) = f.client().resolve("big") {
        assert_eq!(entry.data_size, 0, "the refused write was stored");
    }
}

/// With the write-back cache, the kernel writes a file's dirty pages back
/// at every flush, also at the flush of a forked child's inherited copy
/// closed at its exec, and those writes name no process (pid 0): they
/// counted as a change whose process could not be told, after which any
/// close committed, so a child started by another thread of the writer
/// published its unfinished file.
#[test]
fn a_program_started_while_the_writeback_cache_holds_a_file_publishes_nothing() {
    need_fuse!("a_program_started_while_the_writeback_cache_holds_a_file_publishes_nothing");
    let mut f = Fixture::new(&["-m", "64MiB"]);
    f.stop_mount();
    f.start_mount(&["--writeback-cache"]);
    let want = pattern(4, 3 * MIB + 5);
    let mut file = File::create(f.path("wbc")).unwrap();
    file.write_all(&want[..2 * MIB]).unwrap();
    // The child has a copy of the descriptor until its exec closes it.
    run(&mut Command::new("true"));
    assert!(
        f.client().resolve("wbc").is_err(),
        "a child's exec published a draft"
    );
    file.write_all(&want[2 * MIB..]).unwrap();
    run(&mut Command::new("true"));
    assert!(f.client().resolve("wbc").is_err());
    close(file).unwrap();
    assert!(
        read_named(&mut f.client(), "wbc") == want,
        "the writer's close commits"
    );
}

/// The bytes bound to `name`, from whichever node holds them.
fn read_named_anywhere(client: &mut Client, name: &str) -> Vec<u8> {
    let (entry, found) = client.get_named(name, 5_000).unwrap();
    let ptr = client.located_ptr(found).unwrap();
    // SAFETY: referenced by the get until the release below; the range was
    // bounds-checked on receipt.
    let bytes =
        unsafe { std::slice::from_raw_parts(ptr, found.location.data_size as usize) }.to_vec();
    client.release(&[entry.id]).unwrap();
    bytes
}

#[test]
fn a_mount_on_one_node_serves_the_whole_clusters_names() {
    need_fuse!("a_mount_on_one_node_serves_the_whole_clusters_names");
    let dir = tempfile::tempdir().unwrap();
    let cluster = crate::support::Cluster::up(&dir.path().join("cluster"), 2, "mount-cluster");
    let mut node0 = Client::connect(cluster.socket(0)).unwrap();
    let on_node0 = pattern(3, 3 * MIB + 17);
    node0
        .put_named("shared/from0.bin", &on_node0, b"", None, 0)
        .unwrap();

    // Node 1's mount shows and reads node 0's file.
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let mut mount = shoal()
        .arg("mount")
        .arg("-s")
        .arg(cluster.socket(1))
        .arg(&mnt)
        .stdout(Stdio::null())
        .stderr(log(dir.path(), "mount.log"))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !mounted(&mnt) {
        assert!(Instant::now() < deadline, "mount did not come up");
        std::thread::sleep(Duration::from_millis(5));
    }
    let listed: Vec<String> = fs::read_dir(mnt.join("shared"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, ["from0.bin"]);
    assert_eq!(fs::read(mnt.join("shared/from0.bin")).unwrap(), on_node0);

    // A file written through node 1's mount is node 0's to read by name;
    // rewriting node 0's file through the mount replaces it everywhere.
    let on_node1 = pattern(5, MIB + 3);
    fs::write(mnt.join("shared/from1.bin"), &on_node1).unwrap();
    assert_eq!(
        read_named_anywhere(&mut node0, "shared/from1.bin"),
        on_node1
    );
    let rewritten = pattern(9, 2 * MIB);
    fs::write(mnt.join("shared/from0.bin"), &rewritten).unwrap();
    assert_eq!(
        read_named_anywhere(&mut node0, "shared/from0.bin"),
        rewritten
    );
    let names: Vec<String> = node0
        .list_names("shared")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["shared/from0.bin", "shared/from1.bin"]);

    // SAFETY: signalling our own child.
    unsafe { libc::kill(mount.id() as i32, libc::SIGTERM) };
    let _ = mount.wait();
    if mounted(&mnt) {
        let _ = shoal().arg("umount").arg(&mnt).status();
    }
}

/// A second `shoal mount` of the fixture's daemon, at its own mount point.
struct SecondMount {
    mnt: PathBuf,
    child: Child,
}

impl SecondMount {
    fn new(f: &Fixture) -> Self {
        let mnt = f.dir.path().join("mnt2");
        fs::create_dir_all(&mnt).unwrap();
        let child = shoal()
            .arg("mount")
            .arg("-s")
            .arg(&f.socket)
            .arg(&mnt)
            .stdout(Stdio::null())
            .stderr(log(f.dir.path(), "mount2.log"))
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !mounted(&mnt) {
            assert!(
                Instant::now() < deadline,
                "the second mount did not come up"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Self { mnt, child }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }
}

impl Drop for SecondMount {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        if mounted(&self.mnt) {
            let _ = shoal().arg("umount").arg(&self.mnt).status();
        }
    }
}

/// Versions of one file, each a different length (so a read is matched by
/// its length) and different bytes.
struct Versions(Vec<Vec<u8>>);

impl Versions {
    fn new(count: usize, base: usize, step: usize) -> Self {
        Self(
            (0..count)
                .map(|k| pattern(100 + k as u8, base + k * step + k))
                .collect(),
        )
    }

    /// None if `read` is one whole version, else what it is.
    fn check(&self, read: &[u8]) -> Option<String> {
        match self.0.iter().position(|v| v.len() == read.len()) {
            Some(k) if self.0[k] == read => None,
            Some(k) => {
                let at = self.0[k].iter().zip(read).position(|(a, b)| a != b);
                Some(format!(
                    "{} bytes, version {k}'s length, differing from byte {at:?}",
                    read.len()
                ))
            }
            None => Some(format!("{} bytes: no version's length", read.len())),
        }
    }
}

/// Readers reading `path` whole until `stop`, each read checked against
/// `versions`: (reads, what the wrong ones were).
fn read_whole_until(
    path: PathBuf,
    versions: &Versions,
    stop: &std::sync::atomic::AtomicBool,
) -> (usize, Vec<String>) {
    let (mut reads, mut wrong) = (0, Vec::new());
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let read = fs::read(&path).unwrap();
        reads += 1;
        if let Some(what) = versions.check(&read) {
            wrong.push(what);
        }
    }
    (reads, wrong)
}

/// Rewrites `path` with O_TRUNC in 256 KiB writes, version after version.
fn rewrite_until(
    path: &Path,
    versions: &Versions,
    first: usize,
    stop: &std::sync::atomic::AtomicBool,
) -> usize {
    let mut k = first;
    let mut writes = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let mut file = File::create(path).unwrap();
        for chunk in versions.0[k].chunks(256 * 1024) {
            file.write_all(chunk).unwrap();
        }
        close(file).unwrap();
        writes += 1;
        k = (k + 2) % versions.0.len();
    }
    writes
}

fn assert_all_whole(side: &str, results: Vec<(usize, Vec<String>)>) {
    let reads: usize = results.iter().map(|r| r.0).sum();
    let wrong: Vec<&String> = results.iter().flat_map(|r| &r.1).collect();
    assert!(reads >= 10, "{side}: only {reads} reads");
    assert!(
        wrong.is_empty(),
        "{side}: {} of {reads} reads were not one whole version: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
}

#[test]
fn readers_on_two_mounts_see_whole_versions_while_two_writers_rewrite() {
    need_fuse!("readers_on_two_mounts_see_whole_versions_while_two_writers_rewrite");
    let f = Fixture::new(&["-m", "512MiB"]);
    let second = SecondMount::new(&f);
    let versions = Versions::new(6, 4 * MIB, 1536 * 1024);
    fs::write(f.path("v"), &versions.0[0]).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (same, other, writes) = std::thread::scope(|s| {
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let (path, versions, stop) = (f.path("v"), &versions, &stop);
                s.spawn(move || rewrite_until(&path, versions, w, stop))
            })
            .collect();
        let readers: Vec<_> = (0..4)
            .map(|r| {
                let path = if r % 2 == 0 {
                    f.path("v")
                } else {
                    second.path("v")
                };
                let (versions, stop) = (&versions, &stop);
                s.spawn(move || (r % 2, read_whole_until(path, versions, stop)))
            })
            .collect();
        std::thread::sleep(Duration::from_secs(6));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let writes: usize = writers.into_iter().map(|w| w.join().unwrap()).sum();
        let (mut same, mut other) = (Vec::new(), Vec::new());
        for r in readers {
            let (side, result) = r.join().unwrap();
            if side == 0 {
                same.push(result)
            } else {
                other.push(result)
            }
        }
        (same, other, writes)
    });
    assert!(writes >= 4, "only {writes} rewrites");
    assert_all_whole("readers on the writers' mount", same);
    assert_all_whole("readers on a second mount", other);
}

#[test]
fn mount_readers_see_whole_versions_while_the_api_rebinds_the_name() {
    need_fuse!("mount_readers_see_whole_versions_while_the_api_rebinds_the_name");
    let f = Fixture::new(&["-m", "512MiB"]);
    let versions = Versions::new(5, 4 * MIB, 2 * MIB);
    f.client()
        .put_named("r", &versions.0[0], b"", None, 0)
        .unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (results, rebinds) = std::thread::scope(|s| {
        let rebinder = {
            let (versions, stop, mut client) = (&versions, &stop, f.client());
            s.spawn(move || {
                let mut k = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    k = (k + 1) % versions.0.len();
                    client.put_named("r", &versions.0[k], b"", None, 0).unwrap();
                    std::thread::sleep(Duration::from_millis(30));
                }
                k
            })
        };
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (path, versions, stop) = (f.path("r"), &versions, &stop);
                s.spawn(move || read_whole_until(path, versions, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_secs(6));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let rebinds = rebinder.join().unwrap();
        let results: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
        (results, rebinds)
    });
    let _ = rebinds;
    assert_all_whole("mount readers beside API rebinds", results);
}

/// Reads all of `file` from `at` on, after dropping its cached pages (so
/// every byte is asked of the mount again).
fn read_rest_uncached(file: &mut File, at: u64) -> Vec<u8> {
    // SAFETY: an advice on a descriptor we own.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    file.seek(SeekFrom::Start(at)).unwrap();
    let mut rest = Vec::new();
    file.read_to_end(&mut rest).unwrap();
    rest
}

#[test]
fn a_file_held_open_reads_its_version_whole_across_rewrites_and_renames() {
    need_fuse!("a_file_held_open_reads_its_version_whole_across_rewrites_and_renames");
    let f = Fixture::new(&["-m", "256MiB"]);
    let second = SecondMount::new(&f);
    let old = pattern(1, 9 * MIB + 5);
    let news = [
        pattern(2, 3 * MIB + 1),
        pattern(3, 14 * MIB + 3),
        pattern(4, 9 * MIB + 5),
    ];
    let ways = [
        "O_TRUNC here",
        "O_TRUNC on another mount",
        "rename here",
        "the API",
    ];
    for (w, way) in ways.iter().enumerate() {
        for new in &news {
            fs::write(f.path("held"), &old).unwrap();
            let mut file = File::open(f.path("held")).unwrap();
            let mut head = vec![0; MIB];
            file.read_exact(&mut head).unwrap();
            match w {
                0 => fs::write(f.path("held"), new).unwrap(),
                1 => fs::write(second.path("held"), new).unwrap(),
                2 => {
                    fs::write(f.path("held.tmp"), new).unwrap();
                    fs::rename(f.path("held.tmp"), f.path("held")).unwrap();
                }
                _ => {
                    f.client().put_named("held", new, b"", None, 0).unwrap();
                }
            }
            // A file opened now reads the new version, on both mounts.
            assert!(fs::read(f.path("held")).unwrap() == *new, "{way}: new open");
            assert!(
                fs::read(second.path("held")).unwrap() == *new,
                "{way}: new open on the second mount"
            );
            // The one held open reads its own, its pages cached or not.
            head.extend(read_rest_uncached(&mut file, MIB as u64));
            assert!(head == old, "{way}: held open read {} bytes", head.len());
            assert!(
                read_rest_uncached(&mut file, 0) == old,
                "{way}: held open, reread"
            );
        }
    }
}

fn mtime_of(path: &Path) -> std::time::SystemTime {
    fs::metadata(path).unwrap().modified().unwrap()
}

#[test]
fn utimens_and_chmod_are_kept_chown_is_refused_and_rsync_is_idempotent() {
    need_fuse!("utimens_and_chmod_are_kept_chown_is_refused_and_rsync_is_idempotent");
    let mut f = Fixture::new(&["-m", "64MiB"]);
    let epoch = std::time::UNIX_EPOCH;
    fs::write(f.path("t"), b"times").unwrap();
    // utime by path (no file open), then through an open file.
    let when = epoch + Duration::from_millis(978_307_200_250);
    let file = File::options().write(true).open(f.path("t")).unwrap();
    file.set_modified(when).unwrap();
    close(file).unwrap();
    assert_eq!(mtime_of(&f.path("t")), when, "futimens");
    run(Command::new("touch")
        .args(["-m", "-d", "2002-02-02 02:02:02.5 UTC"])
        .arg(f.path("t")));
    let touched = epoch + Duration::from_millis(1_012_615_322_500);
    assert_eq!(mtime_of(&f.path("t")), touched, "touch -d");
    assert_eq!(fs::read(f.path("t")).unwrap(), b"times", "the bytes stay");
    // Set while the file is being written: it holds after the close.
    let mut file = File::create(f.path("new")).unwrap();
    file.write_all(b"fresh").unwrap();
    file.set_modified(when).unwrap();
    close(file).unwrap();
    assert_eq!(mtime_of(&f.path("new")), when, "set while written");
    // Kept by the daemon: a new mount shows it.
    f.stop_mount();
    f.start_mount(&[]);
    assert_eq!(mtime_of(&f.path("t")), touched, "after a remount");

    // A mode is kept per name (by the mount, across a rename); a change of
    // owner is refused.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&f.path("t")), 0o644);
    fs::set_permissions(f.path("t"), fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(mode(&f.path("t")), 0o755, "chmod");
    fs::rename(f.path("t"), f.path("t2")).unwrap();
    assert_eq!(mode(&f.path("t2")), 0o755, "chmod, then rename");
    fs::rename(f.path("t2"), f.path("t")).unwrap();
    let c_path = std::ffi::CString::new(f.path("t").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path; -1 leaves the group.
    let chowned = unsafe { libc::chown(c_path.as_ptr(), 4242, u32::MAX) };
    assert_eq!(chowned, -1, "chown to another user");
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );

    // rsync -a twice: the second run finds every file up to date (modes
    // and times kept, an executable among them).
    let src = f.dir.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    for (i, size) in [10usize, 70_000, 2 * MIB].iter().enumerate() {
        let path = src.join(format!("sub/f{i}"));
        fs::write(&path, pattern(i as u8, *size)).unwrap();
        if i == 0 {
            fs::set_permissions(&path, fs::Permissions::from_mode(0o750)).unwrap();
        }
        let old = File::options().write(true).open(&path).unwrap();
        old.set_modified(epoch + Duration::from_secs(1_500_000_000 + i as u64 * 1000))
            .unwrap();
    }
    let rsync = || {
        let out = Command::new("rsync")
            .args(["-a", "--stats"])
            .arg(format!("{}/", src.display()))
            .arg(format!("{}/", f.path("tree").display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stats = String::from_utf8_lossy(&out.stdout).into_owned();
        stats
            .lines()
            .find_map(|l| l.strip_prefix("Number of regular files transferred: "))
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(rsync(), "3");
    assert_eq!(rsync(), "0", "the second rsync -a transferred files again");
    assert_eq!(mode(&f.path("tree/sub/f0")), 0o750);
    assert_eq!(mode(&f.path("tree/sub/f1")), 0o644);
    run(Command::new("diff").arg("-r").arg(&src).arg(f.path("tree")));
}

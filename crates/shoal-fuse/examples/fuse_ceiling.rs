//! Mounts the FUSE transport's ceiling (`shoal_fuse::CeilingFs`: one copy
//! per write into warm memory, reads replied from it, nothing kept) until
//! SIGINT/SIGTERM, for bench/fuse/fio_matrix.py.
//!
//!     fuse_ceiling MOUNTPOINT [--writeback-cache] [--threads N]

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut mountpoint = None;
    let mut writeback_cache = false;
    let mut threads = shoal_fuse::default_threads();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--writeback-cache" => writeback_cache = true,
            "--threads" => threads = args.next().ok_or("--threads needs a count")?.parse()?,
            _ if mountpoint.is_none() && !arg.starts_with('-') => {
                mountpoint = Some(PathBuf::from(arg))
            }
            _ => return Err(format!("unexpected argument {arg:?}").into()),
        }
    }
    let mountpoint =
        mountpoint.ok_or("usage: fuse_ceiling MOUNTPOINT [--writeback-cache] [--threads N]")?;
    let stop = shoal_fuse::stop_on_signals();
    let session = shoal_fuse::mount_ceiling(&mountpoint, threads, writeback_cache)?;
    while !stop.load(Ordering::SeqCst) && !session.guard.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !session.guard.is_finished() {
        shoal_fuse::unmount(&mountpoint)?;
        std::mem::forget(session);
    }
    Ok(())
}

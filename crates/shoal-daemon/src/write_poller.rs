//! The task that takes clients' write records (seals in lent space,
//! releases, blocks given back; docs/fast-path.md pieces 2 and 3).
//!
//! While records come, and some core is free ([`busy_poll::worth_polling`]),
//! it polls every channel between yields to the runtime (a client's next
//! record then costs no wake-up of the daemon); after the busy-poll window
//! without one, or at once on a machine with no free core (where a yield
//! would hand the core to a neighbour for a whole time slice, and a sleeper
//! is woken with priority instead), it says in the index header that it
//! sleeps, looks once more, and waits for the doorbell. A client publishes
//! its record, then reads that word (both sequentially consistent): either
//! the poller's last look sees the record or the client sees it asleep and
//! rings.

use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use shoal_core::busy_poll;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::ops::Ops;

pub(crate) fn spawn(ops: &Rc<Ops>) {
    let Some(doorbell) = ops.node.write_channels().doorbell() else {
        return;
    };
    if ops.cluster.is_some() || ops.node.read(|s| s.fast_reads().is_none()) {
        return;
    }
    let doorbell = match doorbell.try_clone_to_owned().and_then(|fd| {
        // SAFETY: the fd is our own fresh duplicate, owned by the AsyncFd
        // and closed only when it is dropped (after deregistration).
        unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| std::io::Error::other(e.to_string()))
    }) {
        Ok(fd) => fd,
        Err(err) => {
            tracing::warn!(%err, "no doorbell: write channels not served");
            return;
        }
    };
    let ops = ops.clone();
    ops.clone()
        .supervisor
        .spawn_local("write channels", run(ops, doorbell));
}

async fn run(ops: Rc<Ops>, doorbell: AsyncFd<OwnedFd>) {
    loop {
        // Busy: poll until a window passes without a record (no window
        // when no core is free: take what is there and sleep).
        while ops.apply_all_writes() > 0 {}
        let window = busy_poll::window_now();
        let mut last = Instant::now();
        while !window.is_zero() {
            if ops.apply_all_writes() > 0 {
                // Queries taken in a round are answered by the next round
                // that finds no record: run it now, not after a yield.
                while ops.apply_all_writes() > 0 {}
                last = Instant::now();
            } else if last.elapsed() >= window {
                break;
            }
            if !busy_poll::pause() {
                // The core was taken meanwhile: sleep, to be woken first.
                while ops.apply_all_writes() > 0 {}
                break;
            }
            tokio::task::yield_now().await;
        }
        // Idle: say so, look once more, sleep until the doorbell rings.
        set_asleep(&ops, true);
        // The asleep word's store before the tails' loads (clients do the
        // reverse): either this sees their record or they see it asleep.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if ops.node.write_channels().any_pending() {
            set_asleep(&ops, false);
            continue;
        }
        let rang = doorbell.readable().await;
        set_asleep(&ops, false);
        match rang {
            Ok(mut ready) => {
                let mut count = [0u8; 8];
                // One read takes the whole counter (not a semaphore eventfd),
                // so the doorbell is quiet until the next ring.
                // SAFETY: reads the eventfd's 8-byte counter into a local buffer.
                unsafe { libc::read(doorbell.get_ref().as_raw_fd(), count.as_mut_ptr().cast(), 8) };
                ready.clear_ready();
            }
            Err(err) => {
                tracing::warn!(%err, "doorbell failed: write channels polled every millisecond");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
}

fn set_asleep(ops: &Ops, asleep: bool) {
    ops.node.read(|s| {
        if let Some(readers) = s.fast_reads() {
            readers.index().set_asleep(asleep);
        }
    });
}

//! Kernel TLS (kTLS) for the data channel's sending end: after the
//! handshake, rustls' session keys go to the socket (`ktls`), the kernel
//! encrypts what is written to it, and sendfile(2) from the region works
//! again, zero-copy, as in cleartext. Where the kernel lacks it (built
//! without `CONFIG_TLS`, or the `tls` module missing) the data channel
//! encrypts in user space; which one runs is decided once, by a probe.
//!
//! Opt-in (`SHOAL_KTLS=1`) until this path has run on a kernel with
//! `CONFIG_TLS`: the machines shoal is tested on have none, so by default
//! the tested user-space path runs everywhere.
//!
//! Only the answering end (the owner serving a pull) hands its session to
//! the kernel: the dialing end keeps rustls, which reads the session
//! tickets the answering end sends after the handshake.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

/// `SHOAL_KTLS=1` lets the data channel hand sessions to the kernel.
const SWITCH: &str = "SHOAL_KTLS";

/// Whether the data channel uses kernel TLS: asked for (`SHOAL_KTLS=1`)
/// and the kernel takes TLS sessions here (a loopback connection accepts
/// the `tls` upper-layer protocol). Decided once per process.
pub fn available() -> bool {
    static PROBED: OnceLock<bool> = OnceLock::new();
    *PROBED.get_or_init(|| {
        if !std::env::var(SWITCH).is_ok_and(|v| v == "1") {
            return false;
        }
        match probe() {
            Ok(()) => true,
            Err(err) => {
                tracing::info!(%err, "kernel TLS unavailable: the data channel encrypts in user space");
                false
            }
        }
    })
}

fn probe() -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let socket = TcpStream::connect(listener.local_addr()?)?;
    let _peer = listener.accept()?;
    let ulp = b"tls";
    // SAFETY: a valid socket, and a buffer of `ulp.len()` bytes for the
    // option's value, as setsockopt(2) asks.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_TCP,
            libc::TCP_ULP,
            ulp.as_ptr().cast(),
            ulp.len() as libc::socklen_t,
        )
    };
    if set == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_probe_answers_and_the_switch_is_read() {
        // Either answer is a machine fact; the call must not fail or hang.
        let first = super::available();
        assert_eq!(first, super::available(), "probed once");
        let listed = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
            .is_ok_and(|ulps| ulps.split_whitespace().any(|u| u == "tls"));
        let asked = std::env::var(super::SWITCH).is_ok_and(|v| v == "1");
        if !asked {
            assert!(!first, "kernel TLS is opt-in");
        } else if listed {
            assert!(first, "asked for, and the kernel lists tls");
        }
    }
}

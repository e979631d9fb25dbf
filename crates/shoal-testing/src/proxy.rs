//! A TCP relay a test cuts and heals: one node's link to one service (its
//! etcd, say) failing while everything else stays up. Plain threads and
//! blocking sockets: a test harness, one relay per link.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Relays every connection made to [`TcpProxy::port`] on loopback to
/// `target`, until cut.
pub struct TcpProxy {
    port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
    tamper: Arc<AtomicU64>,
}

/// No tampering.
const HONEST: u64 = u64::MAX;

impl TcpProxy {
    /// A relay to `target` on a free loopback port.
    pub fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, open, stop) = (Arc::default(), Arc::default(), Arc::default());
        let tamper = Arc::new(AtomicU64::new(HONEST));
        let relay = Relay {
            target,
            cut: Arc::clone(&cut),
            open: Arc::clone(&open),
            tamper: Arc::clone(&tamper),
        };
        let stopping: Arc<AtomicBool> = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => relay.serve(client),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            port,
            cut,
            open,
            stop,
            tamper,
        }
    }

    /// From now on, flips one bit of the byte at `offset` of what every new
    /// connection's target sends back (an active attacker on the path).
    pub fn tamper_at(&self, offset: u64) {
        self.tamper.store(offset, Ordering::SeqCst);
    }

    /// Relays new connections faithfully again.
    pub fn stop_tampering(&self) {
        self.tamper.store(HONEST, Ordering::SeqCst);
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Breaks every relayed connection and refuses new ones (they are
    /// closed as soon as they are accepted).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Relays new connections again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.cut();
    }
}

struct Relay {
    target: SocketAddr,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    tamper: Arc<AtomicU64>,
}

impl Relay {
    fn serve(&self, client: TcpStream) {
        if self.cut.load(Ordering::SeqCst) {
            return; // dropped: closed at once
        }
        let Ok(server) = TcpStream::connect(self.target) else {
            return;
        };
        client.set_nonblocking(false).unwrap();
        let mut open = self.open.lock().unwrap();
        for stream in [&client, &server] {
            if let Ok(clone) = stream.try_clone() {
                open.push(clone);
            }
        }
        pump(
            client.try_clone().unwrap(),
            server.try_clone().unwrap(),
            HONEST,
        );
        pump(server, client, self.tamper.load(Ordering::SeqCst));
    }
}

/// Copies `from` into `to` on a thread until either side closes, flipping
/// a bit of the byte at offset `tamper` (none at [`HONEST`]).
fn pump(mut from: TcpStream, mut to: TcpStream, tamper: u64) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16 << 10];
        let mut passed = 0u64;
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if (passed..passed + n as u64).contains(&tamper) {
                        buffer[(tamper - passed) as usize] ^= 0x10;
                    }
                    passed += n as u64;
                    if to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

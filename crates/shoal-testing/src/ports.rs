//! Free loopback ports for daemons a test starts.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// `count` free loopback ports, none handed out before in this process.
///
/// The kernel may give a port released by one test to the next `bind(0)`
/// before the first test's daemon has bound it; tests run in parallel, so
/// two daemons could be handed one port. Remembering every port given out
/// closes that window within the test binary.
pub fn free_ports(count: usize) -> Vec<u16> {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Held until all are taken, so the kernel offers a new port each time.
    let mut held = Vec::with_capacity(count);
    while held.len() < count {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        if given.insert(listener.local_addr().unwrap().port()) {
            held.push(listener);
        }
    }
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

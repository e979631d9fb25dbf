//! What each connected local client does: its requests and the objects
//! they name, counted in plain cells by its connection (no atomics, no
//! lookup per request), read once a second by the metrics snapshot for the
//! busiest-clients view (`/top`, `shoal top`).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

use shoal_core::object_table::ClientId;

use crate::metrics::top::ClientRow;

/// One connected client's counts.
pub struct ClientActivity {
    pub client: ClientId,
    /// The process id it said in its Hello (0 until then).
    pid: Cell<u32>,
    since: Instant,
    requests: Cell<u64>,
    objects: Cell<u64>,
    /// The counts at the last [`Activity::busiest`].
    seen: Cell<(u64, u64)>,
}

impl ClientActivity {
    pub fn hello(&self, pid: u32) {
        self.pid.set(pid);
    }

    /// One request naming `objects` objects.
    pub fn count(&self, objects: usize) {
        self.requests.set(self.requests.get() + 1);
        self.objects.set(self.objects.get() + objects as u64);
    }
}

/// Every connected client's activity.
#[derive(Default)]
pub struct Activity {
    clients: RefCell<BTreeMap<ClientId, Rc<ClientActivity>>>,
}

impl Activity {
    pub fn start(&self, client: ClientId) -> Rc<ClientActivity> {
        let activity = Rc::new(ClientActivity {
            client,
            pid: Cell::new(0),
            since: Instant::now(),
            requests: Cell::new(0),
            objects: Cell::new(0),
            seen: Cell::new((0, 0)),
        });
        self.clients.borrow_mut().insert(client, activity.clone());
        activity
    }

    pub fn end(&self, client: ClientId) {
        self.clients.borrow_mut().remove(&client);
    }

    /// The `n` clients with the most requests since the last call, `seconds`
    /// ago, busiest first (ties: the most requests overall).
    pub fn busiest(&self, n: usize, seconds: f64) -> Vec<ClientRow> {
        let seconds = seconds.max(1e-3);
        let mut rows: Vec<ClientRow> = self
            .clients
            .borrow()
            .values()
            .map(|a| {
                let (requests, objects) = (a.requests.get(), a.objects.get());
                let (seen_requests, seen_objects) = a.seen.replace((requests, objects));
                ClientRow {
                    client: a.client,
                    pid: a.pid.get(),
                    connected_seconds: a.since.elapsed().as_secs_f64(),
                    requests,
                    requests_per_second: (requests - seen_requests) as f64 / seconds,
                    objects_per_second: (objects - seen_objects) as f64 / seconds,
                }
            })
            .collect();
        rows.sort_by(|a, b| {
            b.requests_per_second
                .total_cmp(&a.requests_per_second)
                .then(b.requests.cmp(&a.requests))
        });
        rows.truncate(n);
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_clients_are_those_with_the_most_requests_since_the_last_look() {
        let activity = Activity::default();
        let quiet = activity.start(1);
        let busy = activity.start(2);
        quiet.hello(100);
        busy.hello(200);
        for _ in 0..50 {
            quiet.count(1);
        }
        let first = activity.busiest(5, 1.0);
        assert_eq!(first[0].pid, 100);
        assert_eq!(first[0].requests_per_second, 50.0);
        // Since then only client 2 worked: it leads, client 1 shows 0/s.
        for _ in 0..10 {
            busy.count(4);
        }
        let next = activity.busiest(5, 2.0);
        assert_eq!(next[0].pid, 200);
        assert_eq!(next[0].requests_per_second, 5.0);
        assert_eq!(next[0].objects_per_second, 20.0);
        assert_eq!(next[1].requests_per_second, 0.0);
        assert_eq!(next[1].requests, 50);
        assert_eq!(activity.busiest(1, 1.0).len(), 1);
        activity.end(2);
        assert_eq!(activity.busiest(5, 1.0).len(), 1);
    }
}

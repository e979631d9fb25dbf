//! What each connected local client does: its requests and the objects
//! they name, counted in plain cells by its connection (no atomics, no
//! lookup per request), read once a second by the metrics snapshot for the
//! busiest-clients view (`/top`, `shoal top`); and when it last asked for
//! anything, so a daemon out of file descriptors can close the connection
//! idle the longest (one holding nothing: shedding it changes nothing).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use shoal_core::ids::ClientId;

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
    /// When it last sent a request.
    last: Cell<Instant>,
    /// It streams notifications: never idle in that sense.
    subscribed: Cell<bool>,
    /// Woken when its connection is to be closed (shed).
    shed: Notify,
    /// Notified (a permit kept) when its write channel broke the protocol.
    kicked: Notify,
}

impl ClientActivity {
    pub fn hello(&self, pid: u32) {
        self.pid.set(pid);
    }

    /// One request naming `objects` objects.
    pub fn count(&self, objects: usize) {
        self.requests.set(self.requests.get() + 1);
        self.objects.set(self.objects.get() + objects as u64);
        self.last.set(Instant::now());
    }

    pub fn subscribed(&self) {
        self.subscribed.set(true);
    }

    /// Resolves when the daemon sheds this connection (only while it waits
    /// for a request: a shed wakes current waiters, it leaves no permit).
    pub async fn shed(&self) {
        self.shed.notified().await;
    }

    /// Resolves once the daemon found this client's write channel broken
    /// (a record that does not decode, a forged ring): the connection ends.
    pub async fn kicked(&self) {
        self.kicked.notified().await;
    }
}

/// Every connected client's activity.
#[derive(Default)]
pub(super) struct Activity {
    clients: RefCell<BTreeMap<ClientId, Rc<ClientActivity>>>,
}

impl Activity {
    pub(super) fn start(&self, client: ClientId) -> Rc<ClientActivity> {
        let activity = Rc::new(ClientActivity {
            client,
            pid: Cell::new(0),
            since: Instant::now(),
            requests: Cell::new(0),
            objects: Cell::new(0),
            seen: Cell::new((0, 0)),
            last: Cell::new(Instant::now()),
            subscribed: Cell::new(false),
            shed: Notify::new(),
            kicked: Notify::new(),
        });
        self.clients.borrow_mut().insert(client, activity.clone());
        activity
    }

    /// `client` sent `objects` objects' worth of records through its write
    /// channel: activity as a request would be.
    pub(super) fn count_for(&self, client: ClientId, objects: usize) {
        if let Some(activity) = self.clients.borrow().get(&client) {
            activity.count(objects);
        }
    }

    /// Ends `client`'s connection (its write channel broke the protocol).
    pub(super) fn kick(&self, client: ClientId) {
        if let Some(activity) = self.clients.borrow().get(&client) {
            activity.kicked.notify_one();
        }
    }

    pub(super) fn end(&self, client: ClientId) {
        self.clients.borrow_mut().remove(&client);
    }

    /// Wakes the connection of the client idle the longest, at least
    /// `min_idle`, that is not subscribed and for which `holds_nothing`;
    /// returns its id.
    pub(super) fn shed_longest_idle(
        &self,
        min_idle: Duration,
        holds_nothing: impl Fn(ClientId) -> bool,
    ) -> Option<ClientId> {
        let clients = self.clients.borrow();
        let chosen = clients
            .values()
            .filter(|a| !a.subscribed.get() && a.last.get().elapsed() >= min_idle)
            .filter(|a| holds_nothing(a.client))
            .min_by_key(|a| a.last.get())?;
        chosen.shed.notify_waiters();
        Some(chosen.client)
    }

    /// The `n` clients with the most requests since the last call, `seconds`
    /// ago, busiest first (ties: the most requests overall).
    pub(super) fn busiest(&self, n: usize, seconds: f64) -> Vec<ClientRow> {
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

    #[tokio::test]
    async fn the_longest_idle_client_holding_nothing_is_shed_never_a_subscriber() {
        let activity = Activity::default();
        let oldest = activity.start(1);
        let holder = activity.start(2);
        let subscriber = activity.start(3);
        subscriber.subscribed();
        std::thread::sleep(Duration::from_millis(30));
        let fresh = activity.start(4);
        let idle = Duration::from_millis(20);
        // Client 2 holds something: client 1 is the one, and its waiter wakes.
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let waiting = {
                    let oldest = oldest.clone();
                    tokio::task::spawn_local(async move { oldest.shed().await })
                };
                tokio::task::yield_now().await;
                assert_eq!(activity.shed_longest_idle(idle, |c| c != 2), Some(1));
                waiting.await.unwrap();
            })
            .await;
        // Once 1 has gone: 2 still holds, 3 subscribes, 4 is too fresh.
        activity.end(1);
        assert_eq!(activity.shed_longest_idle(idle, |c| c != 2), None);
        drop((holder, fresh));
    }
}

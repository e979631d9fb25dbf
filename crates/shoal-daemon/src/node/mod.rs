//! The node: this daemon's store, region, waiters, subscribers and
//! listeners, below everything that serves them (local connections, the
//! peer service) and everything that plugs into them (the tiers, the
//! cluster, the capacity controller, the metrics).
//!
//! Every change to the store goes through [`Node::mutate`], which then
//! publishes what happened itself: it wakes waiting gets (a seal) and
//! creates (memory came free), sends notifications to subscribers and tells
//! every listener. No caller can forget one of these.
//!
//! Single-threaded: the daemon's runtime is current-thread, so `RefCell`
//! suffices, and a borrow of the store is never held across an await.

mod activity;
mod below;
mod events;
pub mod fast_reads;
mod input_budget;
mod subscribers;
pub mod sweep_pace;
pub mod write_channels;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Instant;

use foldhash::HashMap;
use shoal_core::event::ObjectEvent;
use shoal_core::ids::ClientId;
use shoal_core::region::Region;
use shoal_core::ObjectId;
use shoal_store::store::{EvictionGate, Store, Verdict, Victim};
use tokio::sync::{mpsc, Notify};

pub use activity::ClientActivity;
pub use below::Below;
pub use events::{NodeEvent, NodeListener};
pub use input_budget::{InputBudget, Reservation, SMALL_FRAME};
pub use subscribers::SUBSCRIBER_QUEUE;

use crate::metrics::Metrics;
use crate::names::NameIndex;
use crate::principals::LocalIds;

type Listeners = Rc<RefCell<Vec<Rc<dyn NodeListener>>>>;
/// Per victim held by listeners, how many holders are still at it.
type Holds = Rc<RefCell<HashMap<ObjectId, u32>>>;

pub struct Node {
    store: RefCell<Store>,
    /// Shared with the prefault thread and the data channel's workers.
    region: Arc<Region>,
    /// The region is (being) prefaulted, so clients may populate their mappings.
    resident: bool,
    /// Woken on every seal: gets waiting for objects look again.
    sealed: Notify,
    /// Woken whenever memory may have come free: waiting creates retry.
    space: Notify,
    subscribers: subscribers::Subscribers,
    listeners: Listeners,
    holds: Holds,
    /// Events of changes made while listeners were being told of earlier
    /// ones: told after them, in order.
    queue: RefCell<VecDeque<NodeEvent>>,
    telling: Cell<bool>,
    client_ids: RefCell<LocalIds>,
    connected: Cell<usize>,
    activity: activity::Activity,
    /// Bytes local connections may buffer for large incomplete requests.
    input_budget: Rc<InputBudget>,
    idle_since: Cell<Instant>,
    /// The tiers below memory, if any (weak: they hold the node).
    below: RefCell<Option<Weak<dyn Below>>>,
    metrics: Arc<Metrics>,
    /// Object names (the POSIX view), kept beside the store so the tiers
    /// write them into their records.
    names: RefCell<NameIndex>,
    /// Clients' write channels (the fast path's seals and releases).
    write_channels: write_channels::WriteChannels,
    /// How often the fast path's sweeper looks (it rests on an idle node).
    sweep_pace: Rc<sweep_pace::SweepPace>,
}

/// Asks the listeners about each victim; any `Hold` keeps its memory.
struct ListenerGate {
    listeners: Listeners,
    holds: Holds,
}

impl EvictionGate for ListenerGate {
    fn decide(&mut self, victim: &Victim) -> Verdict {
        let held = self
            .listeners
            .borrow()
            .iter()
            .filter(|l| l.on_evicting(victim) == Verdict::Hold)
            .count() as u32;
        if held == 0 {
            return Verdict::Free;
        }
        *self.holds.borrow_mut().entry(victim.id).or_default() += held;
        Verdict::Hold
    }
}

impl Node {
    pub fn new(mut store: Store, region: Region, resident: bool) -> Rc<Self> {
        let listeners = Listeners::default();
        let holds = Holds::default();
        store.set_eviction_gate(Box::new(ListenerGate {
            listeners: listeners.clone(),
            holds: holds.clone(),
        }));
        Rc::new(Self {
            store: RefCell::new(store),
            region: Arc::new(region),
            resident,
            sealed: Notify::new(),
            space: Notify::new(),
            subscribers: subscribers::Subscribers::default(),
            listeners,
            holds,
            queue: RefCell::default(),
            telling: Cell::new(false),
            client_ids: RefCell::default(),
            connected: Cell::new(0),
            activity: activity::Activity::default(),
            input_budget: Rc::default(),
            idle_since: Cell::new(Instant::now()),
            below: RefCell::new(None),
            metrics: Arc::default(),
            names: RefCell::default(),
            write_channels: write_channels::WriteChannels::default(),
            sweep_pace: Rc::default(),
        })
    }

    /// Clients' write channels.
    pub fn write_channels(&self) -> &write_channels::WriteChannels {
        &self.write_channels
    }

    pub fn sweep_pace(&self) -> &Rc<sweep_pace::SweepPace> {
        &self.sweep_pace
    }

    /// Counts `objects` objects' worth of write-channel records as
    /// `client`'s activity; [`kick`](Self::kick) ends its connection.
    pub fn count_writes(&self, client: ClientId, objects: usize) {
        self.activity.count_for(client, objects);
    }

    /// Ends `client`'s connection: its write channel broke the protocol.
    pub fn kick(&self, client: ClientId) {
        self.write_channels.close(client);
        self.activity.kick(client);
    }

    /// The node's names; never borrowed across an await.
    pub fn names(&self) -> &RefCell<NameIndex> {
        &self.names
    }

    /// The name `id` has or gets at its seal, for the tiers' record.
    pub fn name_of(&self, id: &ObjectId) -> Option<String> {
        self.names.borrow().name_of(id).map(str::to_owned)
    }

    /// The modification time the object's name shows (a bound name only).
    pub fn mtime_of(&self, id: &ObjectId) -> Option<u64> {
        self.names.borrow().mtime_of(id)
    }

    /// Installs the tiers below memory.
    pub fn set_below(&self, below: Weak<dyn Below>) {
        *self.below.borrow_mut() = Some(below);
    }

    fn below(&self) -> Option<Rc<dyn Below>> {
        self.below.borrow().as_ref().and_then(Weak::upgrade)
    }

    /// Whether a tier below memory holds `id`: an object that left memory
    /// (or never was in it since a restart) but still exists here.
    pub fn held_below(&self, id: &ObjectId) -> bool {
        self.below().is_some_and(|b| b.holds(id))
    }

    /// Objects held below and not in memory (see [`Below::held_only_below`]).
    pub fn held_only_below(&self) -> Vec<(ObjectId, shoal_core::location::ObjectLocation)> {
        self.below().map_or_else(Vec::new, |b| b.held_only_below())
    }

    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// What this node counts; shared with the thread serving `/metrics`.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn resident(&self) -> bool {
        self.resident
    }

    /// Adds a subsystem that hears every event from now on.
    pub fn listen(&self, listener: Rc<dyn NodeListener>) {
        self.listeners.borrow_mut().push(listener);
    }

    /// Reads the store.
    pub fn read<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        f(&self.store.borrow())
    }

    /// Changes the store, then publishes what changed.
    pub fn mutate<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        let result = f(&mut self.store.borrow_mut());
        self.sweep_pace.changed();
        self.publish(None);
        result
    }

    /// Woken on every seal. Create the future (and `enable` it) before
    /// looking at the store, so a seal in between is not missed.
    pub fn sealed(&self) -> &Notify {
        &self.sealed
    }

    /// Woken when memory may have come free (same usage as [`sealed`](Self::sealed)).
    pub fn space(&self) -> &Notify {
        &self.space
    }

    pub fn subscribe(&self) -> mpsc::Receiver<ObjectEvent> {
        self.subscribers.subscribe()
    }

    /// A local client connected: its store client id.
    pub fn new_client(&self) -> ClientId {
        let id = {
            let store = self.store.borrow();
            self.client_ids.borrow_mut().next(|id| store.has_client(id))
        };
        self.store.borrow_mut().register_client(id);
        self.connected.set(self.connected.get() + 1);
        id
    }

    /// A connected client's activity counts, kept until it disconnects.
    pub fn client_activity(&self, client: ClientId) -> Rc<ClientActivity> {
        self.activity.start(client)
    }

    pub fn input_budget(&self) -> &Rc<InputBudget> {
        &self.input_budget
    }

    /// Closes the connection of the local client idle the longest (at least
    /// `min_idle`) that holds no reference and writes no object, for a
    /// daemon out of file descriptors; returns which.
    pub fn shed_idle_client(&self, min_idle: std::time::Duration) -> Option<ClientId> {
        let store = self.store.borrow();
        self.activity
            .shed_longest_idle(min_idle, |client| store.client_holds_nothing(client))
    }

    /// The `n` busiest connected clients since the last call, `seconds` ago.
    pub fn busiest_clients(&self, n: usize, seconds: f64) -> Vec<crate::metrics::top::ClientRow> {
        self.activity.busiest(n, seconds)
    }

    /// A local client disconnected: its references go, what it was writing
    /// is aborted, and listeners hear of it.
    pub fn client_gone(&self, client: ClientId) {
        self.store.borrow_mut().disconnect(client);
        self.connected.set(self.connected.get() - 1);
        self.activity.end(client);
        if self.connected.get() == 0 {
            self.idle_since.set(Instant::now());
        }
        self.publish(Some(NodeEvent::ClientGone { client }));
    }

    /// Local clients connected now.
    pub fn connected(&self) -> usize {
        self.connected.get()
    }

    /// Since when no local client has been connected (meaningful when
    /// [`connected`](Self::connected) is 0).
    pub fn idle_since(&self) -> Instant {
        self.idle_since.get()
    }

    /// Changes the capacity; shrinking evicts (as the gate decides).
    /// Returns the bytes evicted.
    pub fn set_capacity(&self, capacity: u64) -> u64 {
        let (evicted, capacity) = {
            let mut store = self.store.borrow_mut();
            let evicted = store.set_capacity(capacity);
            (evicted, store.capacity())
        };
        self.publish(Some(NodeEvent::CapacityChanged { capacity }));
        evicted
    }

    /// A listener that held `id` could not take it out (its tier is full or
    /// failing): the object stays in memory, kept out of eviction until
    /// [`readmit`](Self::readmit). Every holder's claim on it ends.
    pub fn cancel_eviction(&self, id: &ObjectId) {
        if self.holds.borrow_mut().remove(id).is_none() {
            tracing::error!(%id, "cancel_eviction of an object nobody holds");
            return;
        }
        self.mutate(|store| store.cancel_eviction(id));
    }

    /// A listener that held `id` (answered `Hold` for it) is done with its
    /// bytes: once every holder is, its memory is freed (unless a get took
    /// it back meanwhile).
    pub fn finish_eviction(&self, id: &ObjectId) {
        let last = {
            let mut holds = self.holds.borrow_mut();
            match holds.get_mut(id) {
                None => {
                    tracing::error!(%id, "finish_eviction of an object nobody holds");
                    return;
                }
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    holds.remove(id);
                    true
                }
            }
        };
        if last {
            self.mutate(|store| store.finish_eviction(id));
        }
    }

    /// Tells waiters, subscribers and listeners what the store did (and
    /// `extra`, an event the store cannot know of).
    fn publish(&self, extra: Option<NodeEvent>) {
        let (events, space) = {
            let mut store = self.store.borrow_mut();
            (store.take_events(), store.take_space_changed())
        };
        if space {
            self.space.notify_waiters();
        }
        if events.is_empty() && extra.is_none() {
            return;
        }
        {
            let mut queue = self.queue.borrow_mut();
            queue.extend(events.into_iter().map(NodeEvent::Object));
            queue.extend(extra);
        }
        if self.telling.replace(true) {
            return; // a listener changed the store: the outer round tells it
        }
        loop {
            let Some(event) = self.queue.borrow_mut().pop_front() else {
                break;
            };
            self.tell(&event);
        }
        self.telling.set(false);
    }

    fn tell(&self, event: &NodeEvent) {
        if let NodeEvent::Object(object) = event {
            if matches!(object, ObjectEvent::Sealed { .. }) {
                self.sealed.notify_waiters();
            }
            if object.is_for_subscribers() {
                self.subscribers.send(object);
            }
        }
        // By index, the list borrowed only to take each one: a listener may
        // add listeners, and a copy of the list would cost an allocation
        // per event.
        let mut next = 0;
        loop {
            let Some(listener) = self.listeners.borrow().get(next).cloned() else {
                break;
            };
            listener.on_event(event);
            next += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_store::eviction::Lru;

    /// Records events; holds victims whose first id byte is odd.
    #[derive(Default)]
    struct Recorder {
        events: RefCell<Vec<NodeEvent>>,
        held: RefCell<Vec<ObjectId>>,
    }

    impl NodeListener for Recorder {
        fn on_event(&self, event: &NodeEvent) {
            self.events.borrow_mut().push(event.clone());
        }
        fn on_evicting(&self, victim: &Victim) -> Verdict {
            if victim.id.0[0] % 2 == 1 {
                self.held.borrow_mut().push(victim.id);
                Verdict::Hold
            } else {
                Verdict::Free
            }
        }
    }

    fn node(size: u64) -> Rc<Node> {
        let dir = tempfile::tempdir().unwrap();
        let region = Region::create(&dir.path().join("region"), size).unwrap();
        Node::new(
            Store::new(size, size, 64, Box::new(Lru::default())),
            region,
            false,
        )
    }

    fn id(n: u8) -> ObjectId {
        ObjectId([n; 20])
    }

    #[test]
    fn listeners_hear_every_change_and_hold_victims_until_they_finish() {
        let node = node(64 * 2);
        let recorder = Rc::new(Recorder::default());
        node.listen(recorder.clone());
        let client = node.new_client();
        for n in [1, 2] {
            node.mutate(|s| s.create(client, id(n), 64, 0)).unwrap();
            node.mutate(|s| s.seal(client, &[id(n)], true)).unwrap();
        }
        // id(1) is the LRU victim, and odd: held.
        let full = node.mutate(|s| s.create(client, id(3), 64, 0));
        assert!(full.is_err());
        assert_eq!(*recorder.held.borrow(), vec![id(1)]);
        assert!(node.read(|s| s.contains(&id(1))));
        let space = node.space().notified();
        tokio::pin!(space);
        space.as_mut().enable();
        node.finish_eviction(&id(1));
        assert!(!node.read(|s| s.contains(&id(1))));
        assert!(
            futures_util::FutureExt::now_or_never(space).is_some(),
            "creates woken"
        );
        node.mutate(|s| s.create(client, id(3), 64, 0)).unwrap();
        node.client_gone(client);
        let events = recorder.events.borrow();
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, NodeEvent::Object(ObjectEvent::Sealed { .. })))
                .count(),
            2
        );
        assert!(events.contains(&NodeEvent::Object(ObjectEvent::Removed {
            id: id(1),
            deleted: false
        })));
        assert_eq!(events.last(), Some(&NodeEvent::ClientGone { client }));
        assert!(events.contains(&NodeEvent::Object(ObjectEvent::Aborted { id: id(3) })));
    }
}

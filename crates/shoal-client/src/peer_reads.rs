//! Gets of other nodes' objects without a round trip (docs/fast-path.md
//! "Gets of other nodes' objects"): the owners' indexes and this client's
//! reference tables there, handed over by our daemon (`PeerReads`), read
//! exactly as the local index is.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use shoal_core::fast_path::index::Found;
use shoal_core::fast_path::readers::FastReads;
use shoal_core::protocol::Located;
use shoal_core::region::Mapping;
use shoal_core::ObjectId;

/// How often a client asks again for owners it has no view of (one that
/// was not up, or whose view its daemon stopped).
const ASK_AGAIN: Duration = Duration::from_secs(1);
/// How soon it asks again once its daemon found an object at an owner it
/// has no working view of (that owner is up now).
const ASK_SOON: Duration = Duration::from_millis(50);

/// One owner's index and this client's table there.
pub(crate) struct PeerView {
    pub owner: u32,
    /// The owner's incarnation (its region's generation).
    pub generation: u64,
    pub fast: Arc<FastReads>,
    /// This client's mapping of the owner's region at that generation.
    pub mapping: Arc<Mapping>,
}

impl PeerView {
    /// Where an object this view's index `found` lives.
    pub fn located(&self, found: &Found) -> Located {
        Located {
            node: self.owner,
            generation: self.generation,
            location: found.location,
            invalidate: false,
        }
    }
}

/// The views this client has, and when it last asked for them; shared
/// with a [`crate::shared::SharedClient`], which reads them without the
/// connection (asking again takes the connection, and the write lock).
#[derive(Default)]
pub(crate) struct PeerViews {
    state: RwLock<State>,
    /// Owners it could have a view of (the cluster's other mapped nodes).
    possible: usize,
}

#[derive(Default)]
struct State {
    views: Vec<Arc<PeerView>>,
    asked: Option<Instant>,
    /// The daemon found objects at an owner without a working view here.
    missing: bool,
}

impl PeerViews {
    pub fn new(possible: usize) -> Self {
        Self {
            state: RwLock::default(),
            possible,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether to ask the daemon (again): never asked, or some owner has no
    /// working view and the last ask is a while ago.
    pub fn should_ask(&self) -> bool {
        if self.possible == 0 {
            return false;
        }
        let state = self.read();
        match state.asked {
            None => true,
            Some(at) => {
                let working = state.views.iter().filter(|v| !v.fast.is_closed()).count();
                let wait = if state.missing { ASK_SOON } else { ASK_AGAIN };
                working < self.possible && at.elapsed() >= wait
            }
        }
    }

    /// Replaces the views with what the daemon just handed over.
    pub fn replace(&self, views: Vec<PeerView>) {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        state.views = views.into_iter().map(Arc::new).collect();
        state.asked = Some(Instant::now());
        state.missing = false;
    }

    /// The daemon found an object at `owner`: if this client has no working
    /// view of it, it asks again soon.
    pub fn found_at(&self, owner: u32) {
        if self.possible == 0 {
            return;
        }
        let has = |state: &State| {
            state
                .views
                .iter()
                .any(|v| v.owner == owner && !v.fast.is_closed())
        };
        if !has(&self.read()) {
            self.state
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .missing = true;
        }
    }

    /// A reference to `id` at the first owner whose index has it.
    pub fn acquire(&self, id: &ObjectId) -> Option<(Arc<PeerView>, Found)> {
        if self.possible == 0 {
            return None;
        }
        self.read().views.iter().find_map(|v| {
            v.fast
                .acquire_in(id, &v.mapping)
                .map(|found| (v.clone(), found))
        })
    }

    /// The connection failed: no answers from any owner's index either.
    pub fn close(&self) {
        for view in &self.read().views {
            view.fast.close();
        }
    }
}

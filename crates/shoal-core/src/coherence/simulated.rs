//! A simulated non-coherent fabric, so cluster tests can run on one host as if
//! the nodes' caches were not kept coherent.
//!
//! [`SimulatedFabric`] owns the "physical" memory and one cache per node;
//! [`SimulatedNode`] is one node's view of it. Everything happens at line
//! granularity ([`LINE`] by default):
//!
//! - **read**: a line absent from the node's cache is loaded from memory and
//!   stays cached, so later changes to memory are invisible to this node until
//!   it invalidates the line;
//! - **write**: goes into the node's cached line (loaded first if absent, as a
//!   write-allocate cache does) and marks it dirty; memory is unchanged;
//! - **flush**: writes dirty lines back to memory and, by default, drops them
//!   ([`FlushKind::Evict`], like CLFLUSHOPT / `dc civac` / `dcbf`), or keeps
//!   them clean ([`FlushKind::WriteBack`], like CLWB);
//! - **invalidate**: drops lines *without* writing them back. A dirty line
//!   dropped this way is lost — real user-mode instructions write it back
//!   first, but the protocol must not depend on that, which is why readers
//!   never write: [`SimulatedNode::invalidate`] returns the number of dirty
//!   lines it discarded so tests can assert it is zero.
//!
//! Real caches also act on their own: they evict lines (writing dirty ones
//! back) and prefetch lines at any moment. [`SimulatedFabric::with_random_eviction`]
//! and [`SimulatedFabric::with_random_prefetch`] model both with a seeded,
//! deterministic generator, so a test cannot pass because a stale line
//! happened to stay put, or a dirty one happened never to be written back.
//!
//! The fabric is one `Mutex`: every operation is atomic with respect to the
//! others, and emulated nodes may run on any threads.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::lines::touched_lines;
use super::LINE;

/// What [`SimulatedNode::flush`] does with a line after writing it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushKind {
    /// Drop the line (CLFLUSHOPT, CLFLUSH, `dc civac`, `dcbf`).
    #[default]
    Evict,
    /// Keep the line, now clean (CLWB).
    WriteBack,
}

/// The state of one line in one node's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineState {
    /// Not cached: the next access loads it from memory.
    Invalid,
    /// Cached, equal to what memory held when it was loaded (or written back).
    Clean,
    /// Cached and written by this node; memory does not have these bytes yet.
    Dirty,
}

/// Physical memory plus one cache per node. See the [module docs](self).
pub struct SimulatedFabric {
    line: usize,
    nodes: usize,
    len: usize,
    flush_kind: FlushKind,
    state: Mutex<State>,
}

struct State {
    memory: Vec<u8>,
    caches: Vec<Cache>,
    noise: Noise,
}

/// One node's cache: a shadow copy of memory that is meaningful only where
/// the line is not `Invalid`, plus the set of resident lines so a random one
/// can be picked in O(1).
struct Cache {
    lines: Vec<LineState>,
    bytes: Vec<u8>,
    resident: Vec<usize>,
    /// Position of each line in `resident`, `NOT_RESIDENT` when invalid.
    slot: Vec<usize>,
}

const NOT_RESIDENT: usize = usize::MAX;

/// Random cache activity between operations; `0` disables an event.
struct Noise {
    rng: SplitMix64,
    evict_one_in: u32,
    prefetch_one_in: u32,
}

impl SimulatedFabric {
    /// A fabric over `memory` shared by `nodes` nodes, every cache empty, with
    /// [`LINE`]-byte lines, [`FlushKind::Evict`] and no random activity.
    ///
    /// # Panics
    /// If `nodes` is zero or `memory.len()` is not a multiple of the line size.
    pub fn new(memory: Vec<u8>, nodes: usize) -> Self {
        Self::with_line_size(memory, nodes, LINE)
    }

    /// A fabric over `len` zero bytes with [`LINE`]-byte lines.
    pub fn zeroed(len: usize, nodes: usize) -> Self {
        Self::new(vec![0; len], nodes)
    }

    /// Like [`new`](Self::new) with `line`-byte lines. Small lines make
    /// partial-line cases cheap to test.
    ///
    /// # Panics
    /// If `nodes` is zero, `line` is not a power of two or `line` does not
    /// divide `memory.len()`.
    pub fn with_line_size(memory: Vec<u8>, nodes: usize, line: usize) -> Self {
        assert!(nodes > 0, "a fabric needs at least one node");
        assert!(
            line.is_power_of_two(),
            "line size {line} is not a power of two"
        );
        let len = memory.len();
        assert!(
            len.is_multiple_of(line),
            "memory of {len} bytes is not a whole number of {line}-byte lines"
        );
        let lines = len / line;
        let caches = (0..nodes)
            .map(|_| Cache {
                lines: vec![LineState::Invalid; lines],
                bytes: vec![0; len],
                resident: Vec::new(),
                slot: vec![NOT_RESIDENT; lines],
            })
            .collect();
        Self {
            line,
            nodes,
            len,
            flush_kind: FlushKind::default(),
            state: Mutex::new(State {
                memory,
                caches,
                noise: Noise {
                    rng: SplitMix64(0),
                    evict_one_in: 0,
                    prefetch_one_in: 0,
                },
            }),
        }
    }

    /// Sets what [`SimulatedNode::flush`] does after writing a line back.
    pub fn with_flush_kind(mut self, kind: FlushKind) -> Self {
        self.flush_kind = kind;
        self
    }

    /// Before each operation, with probability `1 / one_in`, one resident line
    /// of a random node is evicted (written back first if dirty). `seed` makes
    /// the sequence reproducible; `one_in == 0` turns eviction off.
    pub fn with_random_eviction(self, seed: u64, one_in: u32) -> Self {
        {
            let mut state = self.lock();
            state.noise.rng = SplitMix64(seed);
            state.noise.evict_one_in = one_in;
        }
        self
    }

    /// Before each operation, with probability `1 / one_in`, a random line is
    /// loaded into a random node's cache if absent there (a hardware
    /// prefetch: it may bring in bytes a writer has not flushed yet). Uses the
    /// generator seeded by [`with_random_eviction`](Self::with_random_eviction)
    /// (seed 0 if that was not called); `one_in == 0` turns it off.
    pub fn with_random_prefetch(self, one_in: u32) -> Self {
        self.lock().noise.prefetch_one_in = one_in;
        self
    }

    /// The view of node `id`.
    ///
    /// # Panics
    /// If `id` is not below the number of nodes.
    pub fn node(self: &Arc<Self>, id: usize) -> SimulatedNode {
        assert!(id < self.nodes, "node {id} of a {}-node fabric", self.nodes);
        SimulatedNode {
            fabric: Arc::clone(self),
            id,
        }
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Length of the memory in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the memory is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Line size in bytes.
    pub fn line_size(&self) -> usize {
        self.line
    }

    /// Copies physical memory at `offset` into `buf`, bypassing every cache
    /// (what a DMA engine or a post-mortem would see).
    pub fn read_physical(&self, offset: usize, buf: &mut [u8]) {
        self.check_range(offset, buf.len());
        buf.copy_from_slice(&self.lock().memory[offset..offset + buf.len()]);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Operations check their arguments before locking, so a panicking
        // holder cannot have left the state half-updated.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_range(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "range {offset}+{len} outside the {}-byte fabric",
            self.len
        );
    }
}

impl std::fmt::Debug for SimulatedFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedFabric")
            .field("len", &self.len)
            .field("nodes", &self.nodes)
            .field("line", &self.line)
            .field("flush_kind", &self.flush_kind)
            .finish_non_exhaustive()
    }
}

impl State {
    /// Random cache activity that real hardware may do between any two
    /// operations.
    fn noise(&mut self, line: usize) {
        let nodes = self.caches.len();
        if self.noise.evict_one_in != 0 && self.noise.rng.one_in(self.noise.evict_one_in) {
            let node = self.noise.rng.below(nodes);
            let resident = self.caches[node].resident.len();
            if resident != 0 {
                let victim = self.caches[node].resident[self.noise.rng.below(resident)];
                self.evict(node, victim, line);
            }
        }
        if self.noise.prefetch_one_in != 0 && self.noise.rng.one_in(self.noise.prefetch_one_in) {
            let node = self.noise.rng.below(nodes);
            let index = self.noise.rng.below(self.memory.len() / line);
            self.load(node, index, line);
        }
    }

    /// Makes line `index` resident in `node`'s cache, loading it from memory
    /// if it is not.
    fn load(&mut self, node: usize, index: usize, line: usize) {
        let cache = &mut self.caches[node];
        if cache.lines[index] == LineState::Invalid {
            let range = index * line..(index + 1) * line;
            cache.bytes[range.clone()].copy_from_slice(&self.memory[range]);
            cache.set(index, LineState::Clean);
        }
    }

    fn write_back(&mut self, node: usize, index: usize, line: usize) {
        let cache = &mut self.caches[node];
        if cache.lines[index] == LineState::Dirty {
            let range = index * line..(index + 1) * line;
            self.memory[range.clone()].copy_from_slice(&cache.bytes[range]);
            cache.set(index, LineState::Clean);
        }
    }

    fn evict(&mut self, node: usize, index: usize, line: usize) {
        self.write_back(node, index, line);
        self.caches[node].set(index, LineState::Invalid);
    }
}

impl Cache {
    fn set(&mut self, index: usize, new: LineState) {
        let was_resident = self.lines[index] != LineState::Invalid;
        let resident = new != LineState::Invalid;
        self.lines[index] = new;
        if resident && !was_resident {
            self.slot[index] = self.resident.len();
            self.resident.push(index);
        } else if !resident && was_resident {
            let pos = self.slot[index];
            self.resident.swap_remove(pos);
            if let Some(&moved) = self.resident.get(pos) {
                self.slot[moved] = pos;
            }
            self.slot[index] = NOT_RESIDENT;
        }
    }
}

/// One node's view of a [`SimulatedFabric`]: loads and stores through this
/// node's cache. Cheap to clone; clones share the node's cache.
#[derive(Clone)]
pub struct SimulatedNode {
    fabric: Arc<SimulatedFabric>,
    id: usize,
}

impl SimulatedNode {
    /// The node's index in the fabric.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The fabric this view belongs to.
    pub fn fabric(&self) -> &Arc<SimulatedFabric> {
        &self.fabric
    }

    /// Loads `buf.len()` bytes at `offset` through this node's cache, caching
    /// every line touched.
    ///
    /// # Panics
    /// If the range lies outside the fabric (as do all the methods below).
    pub fn read(&self, offset: usize, buf: &mut [u8]) {
        let (fabric, line) = (&self.fabric, self.fabric.line);
        fabric.check_range(offset, buf.len());
        let mut state = fabric.lock();
        state.noise(line);
        for index in touched_lines(offset, buf.len(), line) {
            state.load(self.id, index, line);
        }
        buf.copy_from_slice(&state.caches[self.id].bytes[offset..offset + buf.len()]);
    }

    /// [`read`](Self::read) into a new vector.
    pub fn read_vec(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        self.read(offset, &mut buf);
        buf
    }

    /// Stores `bytes` at `offset` into this node's cache; the lines become
    /// dirty and memory is unchanged until they are flushed or evicted.
    pub fn write(&self, offset: usize, bytes: &[u8]) {
        let (fabric, line) = (&self.fabric, self.fabric.line);
        fabric.check_range(offset, bytes.len());
        let mut state = fabric.lock();
        state.noise(line);
        for index in touched_lines(offset, bytes.len(), line) {
            state.load(self.id, index, line);
            state.caches[self.id].set(index, LineState::Dirty);
        }
        state.caches[self.id].bytes[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    /// Writes every dirty line touching the range back to memory, then drops
    /// or keeps the lines as the fabric's [`FlushKind`] says.
    pub fn flush(&self, offset: usize, len: usize) {
        let (fabric, line) = (&self.fabric, self.fabric.line);
        fabric.check_range(offset, len);
        let mut state = fabric.lock();
        state.noise(line);
        for index in touched_lines(offset, len, line) {
            match fabric.flush_kind {
                FlushKind::Evict => state.evict(self.id, index, line),
                FlushKind::WriteBack => state.write_back(self.id, index, line),
            }
        }
    }

    /// Drops every line touching the range from this node's cache without
    /// writing anything back, and returns how many of them were dirty (their
    /// bytes are lost). A reader that follows the protocol never has any.
    pub fn invalidate(&self, offset: usize, len: usize) -> usize {
        let (fabric, line) = (&self.fabric, self.fabric.line);
        fabric.check_range(offset, len);
        let mut state = fabric.lock();
        state.noise(line);
        let cache = &mut state.caches[self.id];
        let mut lost = 0;
        for index in touched_lines(offset, len, line) {
            lost += usize::from(cache.lines[index] == LineState::Dirty);
            cache.set(index, LineState::Invalid);
        }
        lost
    }

    /// The state of the line holding byte `offset` in this node's cache.
    pub fn line_state(&self, offset: usize) -> LineState {
        self.fabric.check_range(offset, 1);
        self.fabric.lock().caches[self.id].lines[offset / self.fabric.line]
    }

    /// Number of lines this node has cached.
    pub fn resident_lines(&self) -> usize {
        self.fabric.lock().caches[self.id].resident.len()
    }
}

impl std::fmt::Debug for SimulatedNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedNode")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// SplitMix64: tiny, seedable, and plenty for choosing victims.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform enough in `0..n` for `n > 0` (the modulo bias is irrelevant here).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn one_in(&mut self, n: u32) -> bool {
        self.next().is_multiple_of(u64::from(n))
    }
}

#[cfg(test)]
mod tests;

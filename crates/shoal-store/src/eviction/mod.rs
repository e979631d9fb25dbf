//! Eviction policies: which unreferenced sealed object leaves memory first.
//!
//! The store tells the policy when an object becomes a candidate (sealed and
//! unreferenced), when it stops being one (referenced again, deleted) and when
//! it is accessed; the policy only orders candidates. One policy per file,
//! all held to the same contract by `conformance.rs`: LRU, LFU, LRFU
//! (Alluxio's choice for tiers) and Forecast (the farthest predicted read
//! first, for iterative jobs).

#[cfg(test)]
mod conformance;
mod forecast;
mod frequency;
mod lfu;
mod lrfu;
mod lru;
mod policy;
mod slot_heap;

pub use forecast::Forecast;
pub use lfu::Lfu;
pub use lrfu::{Lrfu, LrfuParams};
pub use lru::Lru;
pub use policy::{EvictionPolicy, Reads};

pub use shoal_core::protocol::POLICY_NAMES;

/// Builds a policy by name (`lru`, `lfu`, `lrfu`, `forecast`; any case), with its
/// default parameters.
pub fn by_name(name: &str) -> Option<Box<dyn EvictionPolicy>> {
    match name.to_ascii_lowercase().as_str() {
        "lru" => Some(Box::new(Lru::default())),
        "lfu" => Some(Box::new(Lfu::default())),
        "lrfu" => Some(Box::new(Lrfu::default())),
        "forecast" => Some(Box::new(Forecast::default())),
        _ => None,
    }
}

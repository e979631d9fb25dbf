//! shoal's elastic capacity (DynIMS): how many bytes of memory the store may
//! use, recomputed every T from the node's memory use. Only the daemon
//! compiles this crate; what `shoal stat` shows of it (`CapacityReport`,
//! `PsiAction`, `TracePoint`) is the contract's (`shoal-core`).
//!
//! - `law.rs`: the control law u_{i+1} = u_i − λ·v_i·(r_i − r_0)/r_0 and why λ = 0.5 is stable;
//! - `guard.rs`: the pressure-stall (PSI) guard beside it;
//! - `config.rs`: every parameter and its default;
//! - `controller.rs`: the state between steps; one sample in, a target out;
//! - `usage.rs`, `meminfo.rs`, `cgroup.rs`, `source.rs`: reading v_i and M
//!   from the host or the daemon's cgroup; `pressure.rs`: reading PSI;
//! - `trace.rs`: the capacity-over-time ring buffer.
//!
//! Everything is synchronous and clock-free: the daemon samples, stamps the
//! time, steps the controller and applies the target to the store.

mod cgroup;
mod config;
mod controller;
mod error;
mod guard;
mod law;
mod meminfo;
mod percpu;
mod pressure;
mod source;
mod trace;
mod usage;

pub use cgroup::{
    own_cgroup_dir, parse_cgroup2_mount, parse_counter, parse_limit, parse_memory_stat,
    parse_own_cgroup, CgroupMemory, MemoryStat,
};
pub use config::ControllerConfig;
pub use controller::{Controller, ControllerState, MemorySample};
pub use error::ParseError;
pub use guard::PsiGuardConfig;
pub use law::{dynims_step, next_capacity};
pub use meminfo::{parse_meminfo, read_meminfo, MemInfo, HOST_MEMINFO};
pub use percpu::{parse_percpu_free_pages, read_percpu_free_bytes, HOST_ZONEINFO};
pub use pressure::{parse_pressure, read_pressure, Pressure, PressureLine, HOST_PRESSURE};
pub use source::MemorySource;
pub use trace::CapacityTrace;
pub use usage::MemoryUsage;

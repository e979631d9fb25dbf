//! The elastic capacity controller on the command line (`shoal serve
//! --elastic …`), merged over a cluster node's `[node.elastic]` table.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use shoal_cluster::NodeElastic;
use shoal_core::protocol::CapacityReport;
use shoal_core::protocol::PsiAction;
use shoal_core::units::format_size;
use shoal_daemon::elastic::{ElasticConfig, SourceChoice};

#[derive(clap::Args, Debug, Clone, Default)]
pub struct ElasticArgs {
    /// Let the store's capacity follow the node's free memory (DynIMS
    /// feedback control); --capacity becomes its ceiling. Without it (and
    /// without [node.elastic] in a cluster file) the capacity is static.
    #[arg(long)]
    pub elastic: bool,
    /// Control interval T in milliseconds [default: 100].
    #[arg(long, value_name = "MS")]
    pub elastic_interval_ms: Option<u64>,
    /// Interval in milliseconds while a burst is met (the node over r_0, or
    /// the memory outside the store rising, by more than 0.1 % of M);
    /// 0 keeps every step T apart, as the paper does [default: 20].
    #[arg(long, value_name = "MS")]
    pub elastic_urgent_interval_ms: Option<u64>,
    /// Node memory utilisation r_0 to hold, in (0, 1) [default: 0.95].
    #[arg(long, value_name = "R0")]
    pub elastic_threshold: Option<f64>,
    /// Gain λ of the control law, in (0, 2) [default: 0.5].
    #[arg(long, value_name = "LAMBDA")]
    pub elastic_gain: Option<f64>,
    /// Gain for shrinks only, in (0, 2) [default: λ]; 1 removes the
    /// measured excess in one step (growth keeps λ).
    #[arg(long, value_name = "GAIN")]
    pub elastic_shrink_gain: Option<f64>,
    /// Apply the law to the use expected at the next step (v plus the
    /// last step's rise of the memory outside the store), so a burst that
    /// keeps growing is met as it grows; best with --elastic-shrink-gain 1.
    #[arg(long)]
    pub elastic_feed_forward: bool,
    /// The capacity never shrinks below this (U_min) [default: 0].
    #[arg(long, value_parser = crate::args::size, value_name = "SIZE")]
    pub elastic_min: Option<u64>,
    /// U_max = this share α of the node's memory, in (0, 1] [default: 0.48,
    /// the paper's 60 of 125 GB]; --capacity caps it too.
    #[arg(long, value_name = "ALPHA")]
    pub elastic_max_fraction: Option<f64>,
    /// Where the node's memory use is read: auto (the daemon's cgroup v2 if
    /// memory-limited, else the host), host, cgroup:DIR, or meminfo:FILE (a
    /// file in /proc/meminfo's format, for tests and benchmarks) [default: auto].
    #[arg(long, value_name = "SOURCE")]
    pub elastic_source: Option<String>,
    /// With meminfo:FILE, a file in /proc/pressure/memory's format.
    #[arg(long, value_name = "FILE")]
    pub elastic_pressure_file: Option<PathBuf>,
    /// Do not let memory pressure (PSI) hold growth back or boost shrinks.
    #[arg(long)]
    pub elastic_no_psi: bool,
    /// Prefetch on growth: what leaves memory while the store is shrunk is
    /// restored in the background when it grows again, in the order it is
    /// predicted to be read, into free room only, at most SIZE each time
    /// the store shrinks from its full size [default: 0, off].
    #[arg(long, value_parser = crate::args::size, value_name = "SIZE")]
    pub elastic_prefetch: Option<u64>,
}

impl ElasticArgs {
    /// The controller's configuration: these flags over the node's table;
    /// `None` when the controller is off.
    pub fn config(&self, node: Option<&NodeElastic>) -> Result<Option<ElasticConfig>> {
        let node = node.cloned().unwrap_or_default();
        let tuned = self.elastic_interval_ms.is_some()
            || self.elastic_urgent_interval_ms.is_some()
            || self.elastic_threshold.is_some()
            || self.elastic_gain.is_some()
            || self.elastic_shrink_gain.is_some()
            || self.elastic_feed_forward
            || self.elastic_min.is_some()
            || self.elastic_max_fraction.is_some()
            || self.elastic_source.is_some()
            || self.elastic_pressure_file.is_some()
            || self.elastic_no_psi
            || self.elastic_prefetch.is_some();
        if !self.elastic && !node.enabled {
            if tuned {
                bail!(
                    "--elastic-* settings need --elastic (or [node.elastic] in the cluster file)"
                );
            }
            return Ok(None);
        }
        let mut config = ElasticConfig::default();
        let c = &mut config.controller;
        if let Some(ms) = self.elastic_interval_ms.or(node.interval_ms) {
            c.interval = Duration::from_millis(ms);
        }
        match self.elastic_urgent_interval_ms.or(node.urgent_interval_ms) {
            Some(0) => c.urgent_interval = None,
            Some(ms) => c.urgent_interval = Some(Duration::from_millis(ms)),
            // A T set below the default urgent interval keeps every step T apart.
            None => c.urgent_interval = c.urgent_interval.filter(|u| *u <= c.interval),
        }
        if let Some(r0) = self.elastic_threshold.or(node.threshold) {
            c.threshold = r0;
        }
        if let Some(gain) = self.elastic_gain.or(node.gain) {
            c.gain = gain;
        }
        if let Some(gain) = self.elastic_shrink_gain.or(node.shrink_gain) {
            c.shrink_gain = Some(gain);
        }
        if self.elastic_feed_forward || node.feed_forward == Some(true) {
            c.feed_forward = true;
        }
        if let Some(min) = self.elastic_min.or(node.min_capacity) {
            c.min_capacity = min;
        }
        if let Some(alpha) = self.elastic_max_fraction.or(node.max_fraction) {
            c.max_fraction = alpha;
        }
        if self.elastic_no_psi || node.psi == Some(false) {
            c.psi.enabled = false;
        }
        c.validate()?;
        config.prefetch = self.elastic_prefetch.or(node.prefetch).unwrap_or(0);
        let pressure = self.elastic_pressure_file.clone().or(node.pressure_file);
        let source = self.elastic_source.clone().or(node.source);
        config.source = parse_source(source.as_deref().unwrap_or("auto"), pressure)?;
        Ok(Some(config))
    }
}

/// What the controller is doing, in a few words.
pub fn mode(c: &CapacityReport) -> &'static str {
    match (c.enabled, c.over_target, c.psi_action) {
        (false, ..) => "static",
        (true, true, _) => "elastic, objects in use exceed the target (creates refused)",
        (true, false, PsiAction::Boost) => "elastic, memory pressure: shrinking faster",
        (true, false, PsiAction::HoldGrowth) => "elastic, memory pressure: not growing",
        (true, false, PsiAction::None) => "elastic",
    }
}

/// `shoal stat`'s controller lines.
pub fn print_report(c: &CapacityReport) {
    println!("controller  {}", mode(c));
    if !c.enabled {
        return;
    }
    let step = if c.last_step < 0 { "-" } else { "+" };
    println!(
        "  target {} (capacity {}, last step {step}{}), bounds [{}, {}]",
        format_size(c.target),
        format_size(c.capacity),
        format_size(c.last_step.unsigned_abs()),
        format_size(c.min_capacity),
        format_size(c.max_capacity)
    );
    println!(
        "  node memory {} of {} used: r = {:.3} (r0 {}, gain {}), source {}",
        format_size(c.node_used),
        format_size(c.node_total),
        c.utilisation,
        c.threshold,
        c.gain,
        c.source
    );
    let stall = c.stall_share.map_or_else(
        || "no PSI".to_owned(),
        |s| format!("stalled {:.1}%", 100.0 * s),
    );
    println!(
        "  {} steps every {:?} ({} urgent), region holds {}, {} given back to the kernel, {} in use, {stall}",
        c.steps,
        c.interval,
        c.urgent_steps,
        format_size(c.resident),
        format_size(c.released_bytes),
        format_size(c.pinned)
    );
}

pub fn report_json(c: &CapacityReport) -> String {
    format!(
        "{{\"mode\":{:?},\"enabled\":{},\"source\":{:?},\"interval_ms\":{},\"threshold\":{},\"gain\":{},\"min_capacity\":{},\"max_capacity\":{},\"target\":{},\"capacity\":{},\"used\":{},\"pinned\":{},\"resident\":{},\"over_target\":{},\"ratio\":{},\"node_used\":{},\"node_total\":{},\"last_step\":{},\"stall_share\":{},\"steps\":{},\"released_bytes\":{},\"cpu_seconds\":{},\"release_cpu_seconds\":{},\"urgent_steps\":{}}}",
        mode(c),
        c.enabled,
        c.source,
        c.interval.as_millis(),
        c.threshold,
        c.gain,
        c.min_capacity,
        c.max_capacity,
        c.target,
        c.capacity,
        c.used,
        c.pinned,
        c.resident,
        c.over_target,
        c.utilisation,
        c.node_used,
        c.node_total,
        c.last_step,
        c.stall_share.map_or("null".to_owned(), |s| s.to_string()),
        c.steps,
        c.released_bytes,
        c.cpu_seconds,
        c.release_cpu_seconds,
        c.urgent_steps
    )
}

/// The capacity-over-time trace as CSV (`shoal stat --trace`).
pub fn print_trace(c: &CapacityReport) {
    println!("time_s,target,capacity,store_used,node_used,node_total,ratio");
    for p in &c.trace {
        println!(
            "{:.3},{},{},{},{},{},{:.5}",
            p.time.as_secs_f64(),
            p.target,
            p.capacity,
            p.store_used,
            p.node_used,
            p.node_total,
            p.utilisation
        );
    }
}

fn parse_source(text: &str, pressure: Option<PathBuf>) -> Result<SourceChoice> {
    let choice = match text.split_once(':') {
        None if text == "auto" => SourceChoice::Detect,
        None if text == "host" => SourceChoice::Host,
        Some(("cgroup", dir)) if !dir.is_empty() => SourceChoice::Cgroup(dir.into()),
        Some(("meminfo", file)) if !file.is_empty() => {
            return Ok(SourceChoice::Files {
                meminfo: file.into(),
                pressure,
            })
        }
        _ => bail!("memory source {text:?} is none of auto, host, cgroup:DIR, meminfo:FILE"),
    };
    if pressure.is_some() {
        bail!("a pressure file goes with a meminfo:FILE source only");
    }
    Ok(choice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_unless_asked_and_flags_override_the_file() {
        let none = ElasticArgs::default();
        assert_eq!(none.config(None).unwrap(), None);
        let tuned_only = ElasticArgs {
            elastic_gain: Some(0.3),
            ..Default::default()
        };
        assert!(tuned_only.config(None).is_err(), "tuning without --elastic");

        let file = NodeElastic {
            enabled: true,
            threshold: Some(0.9),
            gain: Some(0.4),
            source: Some("host".into()),
            prefetch: Some(64 << 20),
            shrink_gain: Some(1.0),
            feed_forward: Some(true),
            ..Default::default()
        };
        let from_file = none.config(Some(&file)).unwrap().unwrap();
        assert_eq!(from_file.controller.threshold, 0.9);
        assert_eq!(from_file.controller.gain, 0.4);
        assert_eq!(from_file.source, SourceChoice::Host);
        assert_eq!(from_file.prefetch, 64 << 20);
        assert_eq!(from_file.controller.shrink_gain, Some(1.0));
        assert!(from_file.controller.feed_forward);
        assert!(
            !ElasticArgs {
                elastic: true,
                ..Default::default()
            }
            .config(None)
            .unwrap()
            .unwrap()
            .controller
            .feed_forward
        );
        let flags = ElasticArgs {
            elastic_gain: Some(0.7),
            elastic_source: Some("meminfo:/tmp/m".into()),
            elastic_pressure_file: Some("/tmp/p".into()),
            elastic_no_psi: true,
            elastic_prefetch: Some(0),
            ..Default::default()
        };
        let merged = flags.config(Some(&file)).unwrap().unwrap();
        assert_eq!(
            (merged.controller.threshold, merged.controller.gain),
            (0.9, 0.7)
        );
        assert!(!merged.controller.psi.enabled);
        assert_eq!(
            merged.prefetch, 0,
            "--elastic-prefetch 0 turns the file's off"
        );
        assert_eq!(
            merged.source,
            SourceChoice::Files {
                meminfo: "/tmp/m".into(),
                pressure: Some("/tmp/p".into())
            }
        );
        // The urgent interval: 20 ms by default, the file's, the flag's,
        // 0 for none; a T below 20 ms keeps every step T apart.
        let on = ElasticArgs {
            elastic: true,
            ..Default::default()
        };
        let urgent = |args: &ElasticArgs, file: Option<&NodeElastic>| {
            args.config(file)
                .unwrap()
                .unwrap()
                .controller
                .urgent_interval
        };
        assert_eq!(urgent(&on, None), Some(Duration::from_millis(20)));
        let file_urgent = NodeElastic {
            enabled: true,
            urgent_interval_ms: Some(5),
            ..Default::default()
        };
        assert_eq!(
            urgent(&on, Some(&file_urgent)),
            Some(Duration::from_millis(5))
        );
        let flag_off = ElasticArgs {
            elastic_urgent_interval_ms: Some(0),
            ..on.clone()
        };
        assert_eq!(urgent(&flag_off, Some(&file_urgent)), None);
        let fast_t = ElasticArgs {
            elastic_interval_ms: Some(10),
            ..on.clone()
        };
        assert_eq!(urgent(&fast_t, None), None);
        let off = NodeElastic {
            enabled: false,
            ..file
        };
        assert_eq!(none.config(Some(&off)).unwrap(), None);
    }

    #[test]
    fn bad_settings_are_refused() {
        for bad in [
            ElasticArgs {
                elastic: true,
                elastic_urgent_interval_ms: Some(500),
                ..Default::default()
            },
            ElasticArgs {
                elastic: true,
                elastic_threshold: Some(1.5),
                ..Default::default()
            },
            ElasticArgs {
                elastic: true,
                elastic_source: Some("swap".into()),
                ..Default::default()
            },
            ElasticArgs {
                elastic: true,
                elastic_pressure_file: Some("/tmp/p".into()),
                ..Default::default()
            },
        ] {
            assert!(bad.config(None).is_err(), "{bad:?}");
        }
    }
}

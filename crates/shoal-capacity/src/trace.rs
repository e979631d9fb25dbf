//! The capacity-over-time trace: the last N control steps, oldest first, for
//! the benchmarks' memory-over-time plots and the status page.
//!
//! A ring buffer of fixed length allocated once: the controller runs every
//! 100 ms for the daemon's whole life, so the trace forgets its oldest points
//! rather than grow (30 min at 10 Hz is 18,000 points of 56 bytes, 1 MiB).

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::time::Duration;

use shoal_core::protocol::TracePoint;

use super::controller::{ControllerState, MemorySample};

#[derive(Debug, Clone)]
pub struct CapacityTrace {
    points: VecDeque<TracePoint>,
    limit: usize,
    recorded: u64,
}

impl CapacityTrace {
    /// A trace keeping the last `limit` points.
    pub fn new(limit: NonZeroUsize) -> Self {
        Self {
            points: VecDeque::with_capacity(limit.get()),
            limit: limit.get(),
            recorded: 0,
        }
    }

    /// Records one control step: its sample, the controller's answer and
    /// the capacity the store actually took.
    pub fn record_step(&mut self, sample: &MemorySample, state: &ControllerState, capacity: u64) {
        self.record(TracePoint {
            time: sample.time,
            target: state.target,
            capacity,
            store_used: sample.store_resident,
            node_used: sample.usage.used(),
            node_total: sample.usage.total(),
            utilisation: state.utilisation,
        });
    }

    /// Appends a point, forgetting the oldest when full.
    pub fn record(&mut self, point: TracePoint) {
        if self.points.len() == self.limit {
            self.points.pop_front();
        }
        self.points.push_back(point);
        self.recorded += 1;
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Points recorded since the start, forgotten ones included.
    pub fn recorded(&self) -> u64 {
        self.recorded
    }

    /// Points forgotten to stay within the limit.
    pub fn dropped(&self) -> u64 {
        self.recorded - self.points.len() as u64
    }

    /// All kept points, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &TracePoint> {
        self.points.iter()
    }

    /// Kept points later than `time`, oldest first: a poller passes the time
    /// of the last point it has.
    pub fn since(&self, time: Duration) -> impl Iterator<Item = &TracePoint> {
        // Times come from one monotonic clock, so the points are sorted.
        let start = self.points.partition_point(|p| p.time <= time);
        self.points.range(start..)
    }

    pub fn latest(&self) -> Option<&TracePoint> {
        self.points.back()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(ms: u64) -> TracePoint {
        TracePoint {
            time: Duration::from_millis(ms),
            target: ms,
            capacity: ms,
            store_used: 0,
            node_used: 0,
            node_total: 1,
            utilisation: 0.0,
        }
    }

    #[test]
    fn keeps_the_last_points_in_order() {
        let mut trace = CapacityTrace::new(NonZeroUsize::new(3).unwrap());
        assert!(trace.is_empty() && trace.latest().is_none());
        for ms in [100, 200, 300, 400, 500] {
            trace.record(point(ms));
        }
        let times: Vec<u64> = trace.iter().map(|p| p.target).collect();
        assert_eq!(times, vec![300, 400, 500]);
        assert_eq!((trace.len(), trace.limit()), (3, 3));
        assert_eq!((trace.recorded(), trace.dropped()), (5, 2));
        assert_eq!(trace.latest().unwrap().target, 500);
    }

    #[test]
    fn since_returns_only_newer_points() {
        let mut trace = CapacityTrace::new(NonZeroUsize::new(10).unwrap());
        for ms in [100, 200, 300] {
            trace.record(point(ms));
        }
        let newer = |ms| {
            trace
                .since(Duration::from_millis(ms))
                .map(|p| p.target)
                .collect::<Vec<_>>()
        };
        assert_eq!(newer(0), vec![100, 200, 300]);
        assert_eq!(newer(200), vec![300]);
        assert_eq!(newer(250), vec![300]);
        assert_eq!(newer(300), Vec::<u64>::new());
    }

    #[test]
    fn a_point_records_the_step() {
        use crate::{Controller, ControllerConfig, MemoryUsage};
        let sample = MemorySample {
            time: Duration::from_secs(2),
            usage: MemoryUsage::new(600, 1000).unwrap(),
            store_resident: 200,
            pressure: None,
        };
        let state = Controller::new(ControllerConfig::default(), 300)
            .unwrap()
            .step(&sample);
        let mut trace = CapacityTrace::new(NonZeroUsize::new(1).unwrap());
        trace.record_step(&sample, &state, 310);
        let p = trace.latest().unwrap();
        assert_eq!(
            (p.target, p.capacity, p.store_used),
            (state.target, 310, 200)
        );
        assert_eq!((p.node_used, p.node_total, p.utilisation), (600, 1000, 0.6));
    }
}

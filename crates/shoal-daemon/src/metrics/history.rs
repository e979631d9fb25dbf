//! Capacity and usage over the last minutes: the status page's chart.

use std::collections::VecDeque;

/// One sample a second; ten minutes of them.
const KEPT: usize = 600;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds since the Unix epoch.
    pub at: f64,
    pub capacity: u64,
    pub used: u64,
    pub objects: u64,
}

#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<Sample>,
}

impl History {
    pub fn push(&mut self, sample: Sample) {
        if self.samples.len() == KEPT {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    pub fn samples(&self) -> impl ExactSizeIterator<Item = &Sample> {
        self.samples.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_ten_minutes() {
        let mut history = History::default();
        for i in 0..(KEPT as u64 + 5) {
            history.push(Sample {
                at: i as f64,
                capacity: 100,
                used: i,
                objects: 1,
            });
        }
        assert_eq!(history.samples().len(), KEPT);
        assert_eq!(history.samples().next().unwrap().used, 5);
    }
}

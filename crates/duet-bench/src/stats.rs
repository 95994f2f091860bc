//! Latency histograms (hdrhistogram, nanosecond resolution, 3 significant
//! digits) and their summaries in microseconds.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Latencies of one kind of operation; merge per-thread recorders at the end.
#[derive(Clone)]
pub struct Latencies {
    hist: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

/// Highest trackable latency: 10 minutes; longer ones are clamped.
const MAX_NS: u64 = 600_000_000_000;

impl Latencies {
    pub fn new() -> Latencies {
        Latencies {
            hist: Histogram::new_with_bounds(1, MAX_NS, 3)
                .expect("static histogram bounds are valid"),
        }
    }

    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos())
            .unwrap_or(MAX_NS)
            .clamp(1, MAX_NS);
        self.hist.saturating_record(ns);
    }

    pub fn merge(&mut self, other: &Latencies) {
        // Both have the same bounds, so adding cannot fail.
        let _ = self.hist.add(&other.hist);
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The `q` quantile (0..=1) in microseconds; 0 when empty.
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.hist.is_empty() {
            return 0.0;
        }
        self.hist.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn mean_us(&self) -> f64 {
        self.hist.mean() / 1000.0
    }

    pub fn max_us(&self) -> f64 {
        self.hist.max() as f64 / 1000.0
    }
}

/// min, median, max of repeated measurements.
pub fn spread(values: &[f64]) -> (f64, f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (v[0], median, v[v.len() - 1])
}

/// The median of a list (0 when empty).
pub fn median(values: &[f64]) -> f64 {
    spread(values).1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_spread() {
        let mut l = Latencies::new();
        for us in 1..=100u64 {
            l.record(Duration::from_micros(us));
        }
        assert_eq!(l.count(), 100);
        let p99 = l.quantile_us(0.99);
        assert!((98.0..=100.5).contains(&p99), "{p99}");
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (1.0, 2.0, 3.0));
        assert_eq!(spread(&[4.0, 1.0, 2.0, 3.0]), (1.0, 2.5, 4.0));
    }
}

//! Summaries of timing samples.

use std::time::Duration;

/// Median, minimum, 99th percentile and maximum of a set of samples, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Summary {
    /// The median (the mean of the two middle samples for an even count).
    pub(crate) median_us: f64,
    /// The smallest sample.
    pub(crate) min_us: f64,
    /// The 99th percentile (the nearest rank).
    pub(crate) p99_us: f64,
    /// The largest sample.
    pub(crate) max_us: f64,
    /// How many samples.
    pub(crate) samples: usize,
}

impl Summary {
    /// Summarises `samples` (microseconds); `None` when there are none.
    pub(crate) fn of_us(mut samples: Vec<f64>) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let median_us = if n % 2 == 1 {
            samples[n / 2]
        } else {
            (samples[n / 2 - 1] + samples[n / 2]) / 2.0
        };
        Some(Summary {
            median_us,
            min_us: samples[0],
            p99_us: samples[((n - 1) as f64 * 0.99).round() as usize],
            max_us: samples[n - 1],
            samples: n,
        })
    }

    /// Summarises durations, each divided by `per` (e.g. the batch size).
    pub(crate) fn of_durations(samples: &[Duration], per: usize) -> Option<Summary> {
        let per = per.max(1) as f64;
        Summary::of_us(samples.iter().map(|d| us(*d) / per).collect())
    }
}

/// A duration in microseconds.
pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let s = Summary::of_us(vec![5.0, 1.0, 3.0]).unwrap();
        assert_eq!(
            (s.median_us, s.min_us, s.max_us, s.samples),
            (3.0, 1.0, 5.0, 3)
        );
        let s = Summary::of_us(vec![4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median_us, s.min_us, s.max_us), (2.5, 1.0, 4.0));
        // The 99th percentile is the nearest rank: the largest of 100 distinct samples'
        // 99 smallest.
        let s = Summary::of_us((1..=100).map(f64::from).collect()).unwrap();
        assert_eq!((s.median_us, s.p99_us, s.max_us), (50.5, 99.0, 100.0));
        assert_eq!(Summary::of_us(Vec::new()), None);
    }

    #[test]
    fn durations_are_divided_per_batch() {
        let d = [Duration::from_micros(100), Duration::from_micros(300)];
        let s = Summary::of_durations(&d, 100).unwrap();
        assert_eq!((s.median_us, s.min_us, s.max_us), (2.0, 1.0, 3.0));
    }
}

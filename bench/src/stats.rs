//! Small statistics over samples: median and range of repetitions, nearest-rank
//! percentiles of latency observations.

/// Median, minimum and maximum of a set of repetitions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Median (mean of the middle two for an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// How many values.
    pub n: usize,
}

/// The summary of `values`, or `None` when there are none (NaNs are ignored).
pub fn summarize(values: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Summary {
        median,
        min: v[0],
        max: v[n - 1],
        n,
    })
}

/// The nearest-rank `p`-th percentile (`0 < p <= 100`) of values sorted ascending.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(p > 0.0 && p <= 100.0) {
        return None;
    }
    // The epsilon keeps 99.9% of 1000 at rank 999 despite rounding (999.0000000000001).
    let rank = (p / 100.0 * sorted.len() as f64 - 1e-9).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even() {
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = summarize(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!(summarize(&[]).is_none());
        assert_eq!(summarize(&[f64::NAN, 5.0]).unwrap().median, 5.0);
    }

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile_sorted(&v, 50.0), Some(500.0));
        assert_eq!(percentile_sorted(&v, 99.0), Some(990.0));
        assert_eq!(percentile_sorted(&v, 99.9), Some(999.0));
        assert_eq!(percentile_sorted(&v, 100.0), Some(1000.0));
        assert_eq!(percentile_sorted(&[7.0], 99.9), Some(7.0));
        assert_eq!(percentile_sorted(&[], 50.0), None);
        assert_eq!(percentile_sorted(&v, 0.0), None);
    }
}

//! ministat's columns (N, min, max, median, average, standard deviation) over run figures.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub max: f64,
    pub median: f64,
    pub avg: f64,
    pub stddev: f64,
}

impl Summary {
    pub fn of(xs: &[f64]) -> Summary {
        assert!(!xs.is_empty());
        let mut v = xs.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        let avg = v.iter().sum::<f64>() / n as f64;
        // Sample standard deviation, as ministat prints it.
        let var = if n > 1 { v.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / (n - 1) as f64 } else { 0.0 };
        Summary { n, min: v[0], max: v[n - 1], median, avg, stddev: var.sqrt() }
    }
}

/// A ministat-style header for rows labelled by `label`.
pub fn header(label: &str, unit: &str) -> String {
    format!(
        "{:>10} {:>4} {:>12} {:>12} {:>12} {:>12} {:>10}   ({unit})",
        label, "N", "Min", "Max", "Median", "Avg", "Stddev"
    )
}

pub fn row(label: &str, s: &Summary) -> String {
    format!(
        "{:>10} {:>4} {:>12.0} {:>12.0} {:>12.0} {:>12.0} {:>10.0}",
        label, s.n, s.min, s.max, s.median, s.avg, s.stddev
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ministat_figures() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.n, s.min, s.max, s.median, s.avg), (5, 1.0, 5.0, 3.0, 3.0));
        assert!((s.stddev - 1.5811).abs() < 1e-3);
        assert_eq!(Summary::of(&[1.0, 2.0]).median, 1.5);
        assert_eq!(Summary::of(&[7.0]).stddev, 0.0);
    }
}

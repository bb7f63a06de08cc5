//! Counters, gauges and histograms written in the Prometheus text format (0.0.4) directly:
//! a handful of series do not need a metrics framework.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Upper bounds (seconds) of the default latency buckets (a millisecond to half a minute).
pub const LATENCY_BUCKETS: [f64; 16] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A histogram of seconds (bucket counts, sum, count).
pub struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<(Vec<u64>, f64, u64)>,
}

impl Default for Histogram {
    /// Buckets [`LATENCY_BUCKETS`].
    fn default() -> Self {
        Self::with_buckets(&LATENCY_BUCKETS)
    }
}

impl Histogram {
    /// A histogram with these (increasing) bucket upper bounds; `+Inf` is added.
    pub fn with_buckets(bounds: &'static [f64]) -> Self {
        Self { bounds, inner: Mutex::new((vec![0; bounds.len()], 0.0, 0)) }
    }

    pub fn observe(&self, secs: f64) {
        let mut g = self.inner.lock().unwrap();
        if let Some(i) = self.bounds.iter().position(|&b| secs <= b) {
            g.0[i] += 1;
        }
        g.1 += secs;
        g.2 += 1;
    }

    /// Appends the `# HELP`/`# TYPE` lines, the cumulative buckets, the sum and the count.
    pub fn write(&self, out: &mut String, name: &str, help: &str) {
        let g = self.inner.lock().unwrap();
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            cum += g.0[i];
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}", g.2, g.1, g.2);
    }
}

/// HTTP responses counted by (endpoint, status).
#[derive(Default)]
pub struct StatusCounts(Mutex<BTreeMap<(String, u16), u64>>);

impl StatusCounts {
    pub fn count(&self, endpoint: &str, status: u16) {
        *self.0.lock().unwrap().entry((endpoint.to_string(), status)).or_default() += 1;
    }

    /// Appends counter `name` with labels `endpoint` and `status`.
    pub fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for ((ep, st), n) in self.0.lock().unwrap().iter() {
            let _ = writeln!(out, "{name}{{endpoint=\"{ep}\",status=\"{st}\"}} {n}");
        }
    }
}

/// Appends one unlabelled series; `kind` is `counter` or `gauge`.
pub fn write_value(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        static B: [f64; 3] = [1.0, 2.0, 4.0];
        let h = Histogram::with_buckets(&B);
        for s in [0.5, 1.0, 3.0, 9.0] {
            h.observe(s);
        }
        let mut o = String::new();
        h.write(&mut o, "x_seconds", "X.");
        let want = "# HELP x_seconds X.\n# TYPE x_seconds histogram\nx_seconds_bucket{le=\"1\"} 2\nx_seconds_bucket{le=\"2\"} 2\nx_seconds_bucket{le=\"4\"} 3\nx_seconds_bucket{le=\"+Inf\"} 4\nx_seconds_sum 13.5\nx_seconds_count 4\n";
        assert_eq!(o, want);
    }

    #[test]
    fn status_counts_and_values() {
        let c = StatusCounts::default();
        c.count("/a", 200);
        c.count("/a", 200);
        c.count("/a", 429);
        let mut o = String::new();
        c.write(&mut o, "r_total", "R.");
        write_value(&mut o, "q", "gauge", "Q.", 3);
        assert_eq!(o, "# HELP r_total R.\n# TYPE r_total counter\nr_total{endpoint=\"/a\",status=\"200\"} 2\nr_total{endpoint=\"/a\",status=\"429\"} 1\n# HELP q Q.\n# TYPE q gauge\nq 3\n");
    }
}

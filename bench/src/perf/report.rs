//! A run's results: one row per load level, as a table, JSON or CSV.

use std::fmt::Write as _;

use serde::Serialize;

use crate::perf::measure::Measurement;

/// One measured level, flattened for output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LevelResult {
    pub protocol: &'static str,
    /// `concurrency` or `request_rate`.
    pub mode: &'static str,
    pub concurrency: Option<usize>,
    pub request_rate: Option<f64>,
    /// Successful inferences per second.
    pub throughput: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p95_us: u64,
    pub p99_us: u64,
    pub avg_us: f64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Open loop: sends that left late (always 0 in closed loop).
    pub late: u64,
    pub stable: bool,
    pub windows: usize,
    /// The server's CPU time per successful request (with `--server-pid`).
    pub server_cpu_us_per_request: Option<f64>,
}

/// Which knob a level turned.
#[derive(Debug, Clone, Copy)]
pub enum Level {
    Concurrency(usize),
    RequestRate(f64),
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Level::Concurrency(c) => write!(f, "c={c}"),
            Level::RequestRate(r) => write!(f, "rate={r}"),
        }
    }
}

impl LevelResult {
    pub fn new(protocol: &'static str, level: Level, m: &Measurement) -> Self {
        let (mode, concurrency, request_rate) = match level {
            Level::Concurrency(c) => ("concurrency", Some(c), None),
            Level::RequestRate(r) => ("request_rate", None, Some(r)),
        };
        LevelResult {
            protocol,
            mode,
            concurrency,
            request_rate,
            throughput: m.throughput,
            p50_us: m.latency.p50_us,
            p90_us: m.latency.p90_us,
            p95_us: m.latency.p95_us,
            p99_us: m.latency.p99_us,
            avg_us: m.latency.avg_us,
            errors: m.errors,
            first_error: m.first_error.clone(),
            late: m.late,
            stable: m.stable,
            windows: m.windows,
            server_cpu_us_per_request: m.server_cpu_us_per_request,
        }
    }

    fn level_label(&self) -> String {
        match (self.concurrency, self.request_rate) {
            (Some(c), _) => Level::Concurrency(c).to_string(),
            (_, Some(r)) => Level::RequestRate(r).to_string(),
            _ => String::new(),
        }
    }
}

/// The human table for stdout, with first error messages underneath.
pub fn table(rows: &[LevelResult]) -> String {
    let mut out = format!(
        "{:<11} {:<12} {:>12} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>7} {:>8} {:>11}\n",
        "proto",
        "level",
        "infer/s",
        "p50 us",
        "p90 us",
        "p95 us",
        "p99 us",
        "avg us",
        "errors",
        "late",
        "stable",
        "srv cpu us"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<11} {:<12} {:>12.1} {:>9} {:>9} {:>9} {:>9} {:>10.1} {:>8} {:>7} {:>8} {:>11}",
            r.protocol,
            r.level_label(),
            r.throughput,
            r.p50_us,
            r.p90_us,
            r.p95_us,
            r.p99_us,
            r.avg_us,
            r.errors,
            r.late,
            if r.stable { "yes" } else { "NO" },
            r.server_cpu_us_per_request
                .map(|us| format!("{us:.1}"))
                .unwrap_or_else(|| "-".into()),
        );
    }
    for r in rows {
        if let Some(e) = &r.first_error {
            let _ = writeln!(out, "first error at {}: {e}", r.level_label());
        }
    }
    out
}

pub fn json(rows: &[LevelResult]) -> String {
    serde_json::to_string_pretty(rows).unwrap_or_else(|_| "[]".into())
}

const CSV_HEADER: &str = "protocol,mode,concurrency,request_rate,throughput,p50_us,p90_us,p95_us,p99_us,avg_us,errors,late,stable,first_error,server_cpu_us_per_request";

/// Quotes a CSV field when it needs it (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

pub fn csv(rows: &[LevelResult]) -> String {
    let mut out = format!("{CSV_HEADER}\n");
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{:.3},{},{},{},{},{:.1},{},{},{},{},{}",
            r.protocol,
            r.mode,
            r.concurrency.map(|c| c.to_string()).unwrap_or_default(),
            r.request_rate.map(|v| v.to_string()).unwrap_or_default(),
            r.throughput,
            r.p50_us,
            r.p90_us,
            r.p95_us,
            r.p99_us,
            r.avg_us,
            r.errors,
            r.late,
            r.stable,
            csv_field(r.first_error.as_deref().unwrap_or("")),
            r.server_cpu_us_per_request
                .map(|us| format!("{us:.2}"))
                .unwrap_or_default(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::LatencySummary;

    fn row() -> LevelResult {
        let m = Measurement {
            throughput: 1234.5,
            latency: LatencySummary {
                p50_us: 10,
                p90_us: 20,
                p95_us: 30,
                p99_us: 40,
                avg_us: 12.5,
            },
            errors: 1,
            first_error: Some("status: HTTP 500: \"boom\", sorry".into()),
            late: 0,
            stable: true,
            windows: 3,
            server_cpu_us_per_request: Some(21.5),
        };
        LevelResult::new("http", Level::Concurrency(4), &m)
    }

    #[test]
    fn csv_has_header_and_quotes() {
        let text = csv(&[row()]);
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(CSV_HEADER));
        assert_eq!(
            lines.next(),
            Some(
                "http,concurrency,4,,1234.500,10,20,30,40,12.5,1,0,true,\"status: HTTP 500: \"\"boom\"\", sorry\",21.50"
            )
        );
    }

    #[test]
    fn json_has_the_fields() {
        let v: serde_json::Value = serde_json::from_str(&json(&[row()])).unwrap();
        let o = &v[0];
        assert_eq!(o["protocol"], "http");
        assert_eq!(o["mode"], "concurrency");
        assert_eq!(o["concurrency"], 4);
        assert!(o["request_rate"].is_null());
        assert_eq!(o["p99_us"], 40);
        assert_eq!(o["stable"], true);
        assert_eq!(o["server_cpu_us_per_request"], 21.5);
        let rate = LevelResult::new("grpc", Level::RequestRate(50.0), &Measurement::default());
        let v: serde_json::Value = serde_json::from_str(&json(&[rate])).unwrap();
        assert_eq!(v[0]["request_rate"], 50.0);
        assert_eq!(v[0]["stable"], false);
    }

    #[test]
    fn table_marks_unstable_levels() {
        let mut r = row();
        r.stable = false;
        let t = table(&[r]);
        assert!(t.contains("c=4"));
        assert!(t.contains("NO"));
        assert!(t.contains("first error at c=4"));
    }
}

//! Measuring one load level: warm up, then fixed windows until the last
//! three agree (or the trial budget runs out).
//!
//! The reported throughput and latencies come from the last three windows
//! (fewer if fewer were taken), like perf_analyzer. Errors and late sends
//! are summed over every measured window, so a failure early in the level
//! is not hidden by a stable ending.

use std::time::Duration;

use tokio::time::Instant;

use crate::latency::LatencySummary;
use crate::perf::recorder::{Recorder, Window};
use crate::perf::stability::{self, WINDOWS};
use crate::process_cpu::ProcessCpu;

#[derive(Debug, Clone)]
pub struct MeasureConfig {
    pub interval: Duration,
    pub warmup: Duration,
    pub stability_pct: f64,
    pub max_trials: usize,
    /// The server's process, when its CPU per request is asked for.
    pub server_cpu: Option<ProcessCpu>,
}

/// One window and how long it actually lasted.
#[derive(Debug, Clone)]
pub struct TimedWindow {
    pub window: Window,
    pub elapsed: Duration,
    /// The server's CPU time over the window, when it is watched.
    pub server_cpu: Option<Duration>,
}

impl TimedWindow {
    fn throughput(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.window.latencies_us.len() as f64 / secs
        } else {
            0.0
        }
    }
}

/// A level's result.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measurement {
    /// Successful inferences per second.
    pub throughput: f64,
    pub latency: LatencySummary,
    pub errors: u64,
    pub first_error: Option<String>,
    pub late: u64,
    pub stable: bool,
    /// Windows measured (after warmup).
    pub windows: usize,
    /// The server's CPU time per successful request over the windows the
    /// rates come from, in microseconds.
    pub server_cpu_us_per_request: Option<f64>,
}

/// Measures while workers feed `recorder`; returns when stable or after
/// `max_trials` windows.
pub async fn measure(recorder: &Recorder, config: &MeasureConfig) -> Measurement {
    tokio::time::sleep(config.warmup).await;
    let cpu_now = || config.server_cpu.as_ref().and_then(|p| p.used().ok());
    recorder.take();
    let mut start = Instant::now();
    let mut cpu_start = cpu_now();
    let mut windows = Vec::new();
    let mut throughputs = Vec::new();
    for _ in 0..config.max_trials.max(1) {
        tokio::time::sleep_until(start + config.interval).await;
        let window = recorder.take();
        let now = Instant::now();
        let cpu = cpu_now();
        let timed = TimedWindow {
            window,
            elapsed: now - start,
            server_cpu: cpu.zip(cpu_start).map(|(end, begin)| end.saturating_sub(begin)),
        };
        start = now;
        cpu_start = cpu;
        throughputs.push(timed.throughput());
        windows.push(timed);
        if stability::is_stable(&throughputs, config.stability_pct) {
            break;
        }
    }
    summarize(windows, config.stability_pct)
}

/// Combines measured windows into a level's result.
pub fn summarize(windows: Vec<TimedWindow>, stability_pct: f64) -> Measurement {
    let throughputs: Vec<f64> = windows.iter().map(TimedWindow::throughput).collect();
    let stable = stability::is_stable(&throughputs, stability_pct);
    let errors = windows.iter().map(|w| w.window.errors).sum();
    let late = windows.iter().map(|w| w.window.late).sum();
    let first_error = windows.iter().find_map(|w| w.window.first_error.clone());
    let count = windows.len();
    let last = &windows[count.saturating_sub(WINDOWS)..];
    let elapsed: f64 = last.iter().map(|w| w.elapsed.as_secs_f64()).sum();
    let mut latencies: Vec<u64> = last
        .iter()
        .flat_map(|w| w.window.latencies_us.iter().copied())
        .collect();
    let throughput = if elapsed > 0.0 {
        latencies.len() as f64 / elapsed
    } else {
        0.0
    };
    let server_cpu: Option<Duration> = last.iter().map(|w| w.server_cpu).sum();
    let server_cpu_us_per_request = server_cpu
        .filter(|_| !latencies.is_empty())
        .map(|cpu| cpu.as_secs_f64() * 1e6 / latencies.len() as f64);
    Measurement {
        throughput,
        latency: LatencySummary::from_samples(&mut latencies),
        errors,
        first_error,
        late,
        stable,
        windows: count,
        server_cpu_us_per_request,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(successes: u64, latency: u64, errors: u64, ms: u64) -> TimedWindow {
        TimedWindow {
            window: Window {
                latencies_us: vec![latency; successes as usize],
                errors,
                first_error: (errors > 0).then(|| format!("e{latency}")),
                late: 0,
            },
            elapsed: Duration::from_millis(ms),
            server_cpu: Some(Duration::from_millis(ms / 10)),
        }
    }

    #[test]
    fn uses_last_three_windows_for_rates_and_all_for_errors() {
        let windows = vec![
            window(10, 900, 2, 1000),
            window(100, 100, 0, 1000),
            window(100, 100, 0, 1000),
            window(100, 100, 0, 1000),
        ];
        let m = summarize(windows, 10.0);
        assert!(m.stable);
        assert!((m.throughput - 100.0).abs() < 1e-9);
        assert_eq!(m.latency.p99_us, 100);
        assert_eq!(m.errors, 2);
        assert_eq!(m.first_error.as_deref(), Some("e900"));
        assert_eq!(m.windows, 4);
        // 3 windows of 100 ms of server CPU over 300 requests.
        assert_eq!(m.server_cpu_us_per_request, Some(1000.0));
    }

    #[test]
    fn unstable_and_short_runs_are_reported_as_such() {
        let m = summarize(vec![window(50, 10, 0, 1000), window(100, 10, 0, 1000)], 10.0);
        assert!(!m.stable);
        assert!((m.throughput - 75.0).abs() < 1e-9);
        let m = summarize(vec![], 10.0);
        assert!(!m.stable);
        assert_eq!(m.throughput, 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn stops_once_stable() {
        let recorder = Recorder::new();
        let config = MeasureConfig {
            interval: Duration::from_millis(100),
            warmup: Duration::from_millis(50),
            stability_pct: 10.0,
            max_trials: 10,
            server_cpu: None,
        };
        let feeder = async {
            loop {
                recorder.success(Duration::from_micros(5));
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let m = tokio::select! {
            m = measure(&recorder, &config) => m,
            () = feeder => unreachable!(),
        };
        assert!(m.stable);
        assert_eq!(m.windows, 3);
        assert!(m.throughput > 500.0, "{}", m.throughput);
    }
}

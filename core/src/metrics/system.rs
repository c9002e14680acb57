//! Triton's CPU metrics, read from /proc every `--metrics-interval-ms`:
//! `nv_cpu_utilization` (all cores, since the last interval, 0 to 1),
//! `nv_cpu_memory_total_bytes` and `nv_cpu_memory_used_bytes` (system-wide;
//! used is total minus available, as `free` counts it).

use std::time::Duration;

use nereid_proto::contract::metrics as family;
use prometheus::{Gauge, IntGauge};

use super::Metrics;

/// The CPU gauges and the previous `/proc/stat` reading.
pub struct SystemMetrics {
    utilization: Gauge,
    memory_total: IntGauge,
    memory_used: IntGauge,
    previous: Option<CpuTimes>,
}

/// Jiffies spent busy and in total, from the `cpu` line of /proc/stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CpuTimes {
    busy: u64,
    total: u64,
}

impl SystemMetrics {
    /// Registers the gauges into `metrics`.
    pub fn register(metrics: &Metrics) -> Self {
        let utilization =
            Gauge::new(family::CPU_UTILIZATION, "CPU utilization rate [0.0 - 1.0]").expect("metric options are valid");
        let memory_total = IntGauge::new(family::CPU_MEMORY_TOTAL, "CPU total memory (RAM), in bytes")
            .expect("metric options are valid");
        let memory_used = IntGauge::new(family::CPU_MEMORY_USED, "CPU used memory (RAM), in bytes")
            .expect("metric options are valid");
        metrics.register(Box::new(utilization.clone()));
        metrics.register(Box::new(memory_total.clone()));
        metrics.register(Box::new(memory_used.clone()));
        SystemMetrics {
            utilization,
            memory_total,
            memory_used,
            previous: None,
        }
    }

    /// Reads /proc once; a file that cannot be read leaves its gauges as they were.
    pub fn refresh(&mut self) {
        if let Some(now) = std::fs::read_to_string("/proc/stat").ok().and_then(|s| cpu_times(&s)) {
            if let Some(before) = self.previous {
                self.utilization.set(utilization(before, now));
            }
            self.previous = Some(now);
        }
        if let Some((total, available)) = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| memory(&s)) {
            self.memory_total.set(i64::try_from(total).unwrap_or(i64::MAX));
            self.memory_used
                .set(i64::try_from(total.saturating_sub(available)).unwrap_or(i64::MAX));
        }
    }

    /// Refreshes every `interval` on the async runtime, forever.
    pub async fn run(mut self, interval: Duration) {
        super::refresh_every(interval, move || self.refresh()).await;
    }
}

fn cpu_times(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user)
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some(CpuTimes {
        busy: total.saturating_sub(idle),
        total,
    })
}

fn utilization(before: CpuTimes, now: CpuTimes) -> f64 {
    let total = now.total.saturating_sub(before.total);
    if total == 0 {
        return 0.0;
    }
    (now.busy.saturating_sub(before.busy) as f64 / total as f64).clamp(0.0, 1.0)
}

/// (MemTotal, MemAvailable) in bytes.
fn memory(meminfo: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
            .map(|kib| kib * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_formats() {
        let before = cpu_times("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n").unwrap();
        let now = cpu_times("cpu  150 0 150 800 100 0 0 0 0 0\n").unwrap();
        assert_eq!(before, CpuTimes { busy: 200, total: 1000 });
        assert_eq!(utilization(before, now), 0.5);
        assert_eq!(utilization(now, now), 0.0);
        let (total, available) = memory("MemTotal:       2048 kB\nMemFree: 1 kB\nMemAvailable:   1024 kB\n").unwrap();
        assert_eq!((total, available), (2 << 20, 1 << 20));
    }

    #[test]
    fn refreshes_from_this_machine() {
        let metrics = Metrics::new(&super::super::MetricsConfig::default(), true);
        let mut system = SystemMetrics::register(&metrics);
        system.refresh();
        std::thread::sleep(Duration::from_millis(20));
        system.refresh();
        let text = metrics.encode();
        assert!(text.contains("nv_cpu_utilization "), "{text}");
        assert!(system.memory_total.get() > 0 && system.memory_used.get() > 0);
    }
}

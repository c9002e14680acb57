//! Triton's GPU metrics, read through NVML every `--metrics-interval-ms`,
//! one series per visible device labelled `gpu_uuid`: utilisation (0 to
//! 1), memory total and used (bytes), power usage and limit (watts), and
//! energy since the server started (joules, a counter). A server that sees
//! no GPU registers none of these families, as Triton's.

use std::collections::HashMap;
use std::time::Duration;

use nereid_gpu::{GpuMonitor, GpuReading};
use nereid_proto::contract::metrics as family;
use prometheus::{CounterVec, GaugeVec, Opts};

use super::Metrics;

/// The GPU families and the monitor that feeds them.
pub struct GpuMetrics {
    monitor: GpuMonitor,
    families: GpuFamilies,
}

/// The registered families, and what each device's energy counter holds.
struct GpuFamilies {
    utilization: GaugeVec,
    memory_total: GaugeVec,
    memory_used: GaugeVec,
    power_usage: GaugeVec,
    power_limit: GaugeVec,
    energy: CounterVec,
    /// The energy already counted per device, joules.
    counted: HashMap<String, f64>,
}

impl GpuMetrics {
    /// Registers the families into `metrics`, one series per device `monitor` reads.
    pub fn register(metrics: &Metrics, monitor: GpuMonitor) -> Self {
        GpuMetrics {
            monitor,
            families: GpuFamilies::register(metrics),
        }
    }

    /// Reads every device once; a figure a device does not report is left out.
    pub fn refresh(&mut self) {
        for reading in self.monitor.read() {
            self.families.record(&reading);
        }
    }

    /// Refreshes every `interval` on the async runtime, forever.
    pub async fn run(mut self, interval: Duration) {
        super::refresh_every(interval, move || self.refresh()).await;
    }
}

impl GpuFamilies {
    fn register(metrics: &Metrics) -> Self {
        let gauge = |name: &str, help: &str| {
            let vec =
                GaugeVec::new(Opts::new(name, help), &[family::GPU_UUID_LABEL]).expect("metric options are valid");
            metrics.register(Box::new(vec.clone()));
            vec
        };
        let utilization = gauge(family::GPU_UTILIZATION, "GPU utilization rate [0.0 - 1.0)");
        let memory_total = gauge(family::GPU_MEMORY_TOTAL, "GPU total memory, in bytes");
        let memory_used = gauge(family::GPU_MEMORY_USED, "GPU used memory, in bytes");
        let power_usage = gauge(family::GPU_POWER_USAGE, "GPU power usage in watts");
        let power_limit = gauge(family::GPU_POWER_LIMIT, "GPU power management limit in watts");
        let energy = CounterVec::new(
            Opts::new(
                family::GPU_ENERGY,
                "GPU energy consumption in joules since the server started",
            ),
            &[family::GPU_UUID_LABEL],
        )
        .expect("metric options are valid");
        metrics.register(Box::new(energy.clone()));
        GpuFamilies {
            utilization,
            memory_total,
            memory_used,
            power_usage,
            power_limit,
            energy,
            counted: HashMap::new(),
        }
    }

    fn record(&mut self, reading: &GpuReading) {
        let labels = [reading.uuid.as_str()];
        let set = |vec: &GaugeVec, value: Option<f64>| {
            if let Some(value) = value {
                vec.with_label_values(&labels).set(value);
            }
        };
        set(&self.utilization, reading.utilization);
        set(&self.memory_total, reading.memory_total_bytes.map(|b| b as f64));
        set(&self.memory_used, reading.memory_used_bytes.map(|b| b as f64));
        set(&self.power_usage, reading.power_watts);
        set(&self.power_limit, reading.power_limit_watts);
        if let Some(joules) = reading.energy_joules {
            let counted = self.counted.entry(reading.uuid.clone()).or_insert(0.0);
            if joules > *counted {
                self.energy.with_label_values(&labels).inc_by(joules - *counted);
                *counted = joules;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MetricsConfig;

    /// How a reading shows on the page: Triton's names, one series per
    /// `gpu_uuid`, energy counted up from the readings' running total, and
    /// a figure the device does not report left out.
    #[test]
    fn readings_show_under_triton_names_per_device() {
        let metrics = Metrics::new(&MetricsConfig::default(), true);
        let mut families = GpuFamilies::register(&metrics);
        let reading = |energy: f64| GpuReading {
            uuid: "GPU-1".into(),
            utilization: Some(0.25),
            memory_total_bytes: Some(80 << 30),
            memory_used_bytes: Some(1 << 30),
            power_watts: Some(71.5),
            power_limit_watts: None,
            energy_joules: Some(energy),
        };
        families.record(&reading(10.0));
        families.record(&reading(12.5));
        let text = metrics.encode();
        for line in [
            "nv_gpu_utilization{gpu_uuid=\"GPU-1\"} 0.25",
            "nv_gpu_memory_total_bytes{gpu_uuid=\"GPU-1\"} 85899345920",
            "nv_gpu_memory_used_bytes{gpu_uuid=\"GPU-1\"} 1073741824",
            "nv_gpu_power_usage{gpu_uuid=\"GPU-1\"} 71.5",
            "nv_energy_consumption{gpu_uuid=\"GPU-1\"} 12.5",
        ] {
            assert!(text.lines().any(|l| l == line), "no '{line}' in:\n{text}");
        }
        assert!(!text.contains("nv_gpu_power_limit{"), "{text}");
    }
}

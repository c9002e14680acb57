//! `pb_utils.MetricFamily`: a model's own counters, gauges and histograms,
//! exported on the metrics port beside the server's families.
//!
//! A family is registered once per name for the whole server (every
//! instance of every model that defines it shares it, as in Triton); each
//! stub numbers its families and metrics itself, so each instance keeps
//! its own map from those numbers to the handles ([`StubMetrics`]).
//! Prometheus fixes a family's label names: they are those of its first
//! metric, and a metric with other names is refused. Families stay
//! registered until the server stops.

use std::collections::HashMap;

use parking_lot::Mutex;
use prometheus::core::Collector;
use prometheus::{CounterVec, GaugeVec, HistogramOpts, HistogramVec, Opts, Registry};

use crate::protocol::FromStub;

/// The most label sets (and the most families) one stub may create: each
/// is a series the server exports until it stops.
const MAX_METRICS_PER_STUB: usize = 10_000;

#[derive(Clone)]
enum Family {
    Counter(CounterVec),
    Gauge(GaugeVec),
    Histogram(HistogramVec),
}

#[derive(Clone)]
enum Handle {
    Counter(prometheus::Counter),
    Gauge(prometheus::Gauge),
    Histogram(prometheus::Histogram),
}

/// A registered family: its kind, its label names, its handles.
type Registered = (String, Vec<String>, Family);

/// The families every Python model defined, by name.
pub struct CustomMetrics {
    registry: Option<Registry>,
    families: Mutex<HashMap<String, Registered>>,
}

impl CustomMetrics {
    /// `None`: metrics are off, and models' metrics go nowhere.
    pub fn new(registry: Option<Registry>) -> Self {
        CustomMetrics {
            registry,
            families: Mutex::new(HashMap::new()),
        }
    }

    /// The family `name` of `kind` with `labels`, registered on first use.
    fn family(
        &self,
        name: &str,
        description: &str,
        kind: &str,
        labels: &[String],
        buckets: Option<&[f64]>,
    ) -> Result<Family, String> {
        let mut families = self.families.lock();
        if let Some((have, have_labels, family)) = families.get(name) {
            if have != kind {
                return Err(format!("metric family '{name}' is already a {have}"));
            }
            if have_labels != labels {
                return Err(format!(
                    "metric family '{name}' has the labels {have_labels:?}; a metric with {labels:?} cannot join it"
                ));
            }
            return Ok(family.clone());
        }
        let help = if description.is_empty() { name } else { description };
        let names: Vec<&str> = labels.iter().map(String::as_str).collect();
        let made = match kind {
            "COUNTER" => CounterVec::new(Opts::new(name, help), &names).map(Family::Counter),
            "GAUGE" => GaugeVec::new(Opts::new(name, help), &names).map(Family::Gauge),
            "HISTOGRAM" => {
                let mut opts = HistogramOpts::new(name, help);
                if let Some(buckets) = buckets {
                    opts = opts.buckets(buckets.to_vec());
                }
                HistogramVec::new(opts, &names).map(Family::Histogram)
            }
            other => return Err(format!("unknown metric kind '{other}'")),
        }
        .map_err(|e| format!("metric family '{name}': {e}"))?;
        if let Some(registry) = &self.registry {
            let collector: Box<dyn Collector> = match &made {
                Family::Counter(c) => Box::new(c.clone()),
                Family::Gauge(g) => Box::new(g.clone()),
                Family::Histogram(h) => Box::new(h.clone()),
            };
            registry
                .register(collector)
                .map_err(|e| format!("metric family '{name}' cannot be registered: {e}"))?;
        }
        families.insert(name.to_string(), (kind.to_string(), labels.to_vec(), made.clone()));
        Ok(made)
    }
}

/// One stub's families and metrics, by the stub's numbers.
#[derive(Default)]
pub struct StubMetrics {
    /// (name, description, kind) until its first metric says the buckets.
    families: HashMap<u64, (String, String, String)>,
    metrics: HashMap<u64, Handle>,
}

impl StubMetrics {
    /// Applies one metric message; a bad one is logged, never fatal.
    pub fn apply(&mut self, shared: &CustomMetrics, model: &str, message: &FromStub) {
        if let Err(why) = self.try_apply(shared, message) {
            tracing::warn!(model, error = %why, "a custom metric update was refused");
        }
    }

    fn try_apply(&mut self, shared: &CustomMetrics, message: &FromStub) -> Result<(), String> {
        match message {
            FromStub::MetricFamily {
                family,
                name,
                description,
                kind,
            } => {
                if self.families.len() >= MAX_METRICS_PER_STUB {
                    return Err(format!(
                        "a stub may define at most {MAX_METRICS_PER_STUB} metric families"
                    ));
                }
                if !matches!(kind.as_str(), "COUNTER" | "GAUGE" | "HISTOGRAM") {
                    return Err(format!("unknown metric kind '{kind}'"));
                }
                self.families
                    .insert(*family, (name.clone(), description.clone(), kind.clone()));
                Ok(())
            }
            FromStub::Metric {
                family,
                metric,
                labels,
                buckets,
            } => {
                if self.metrics.len() >= MAX_METRICS_PER_STUB {
                    return Err(format!("a stub may create at most {MAX_METRICS_PER_STUB} metrics"));
                }
                let (name, description, kind) = self
                    .families
                    .get(family)
                    .ok_or_else(|| format!("no metric family {family}"))?;
                let labels: HashMap<String, String> = labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_string)))
                    .collect();
                let mut names: Vec<String> = labels.keys().cloned().collect();
                names.sort();
                let family = shared.family(name, description, kind, &names, buckets.as_deref())?;
                let labels: HashMap<&str, &str> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let handle = match family {
                    Family::Counter(c) => c.get_metric_with(&labels).map(Handle::Counter),
                    Family::Gauge(g) => g.get_metric_with(&labels).map(Handle::Gauge),
                    Family::Histogram(h) => h.get_metric_with(&labels).map(Handle::Histogram),
                }
                .map_err(|e| format!("metric of '{name}': {e}"))?;
                self.metrics.insert(*metric, handle);
                Ok(())
            }
            FromStub::MetricUpdate { metric, action, value } => {
                let handle = self.metrics.get(metric).ok_or_else(|| format!("no metric {metric}"))?;
                match (handle, action.as_str()) {
                    (Handle::Counter(c), "increment") if *value >= 0.0 => c.inc_by(*value),
                    (Handle::Gauge(g), "increment") => g.add(*value),
                    (Handle::Gauge(g), "set") => g.set(*value),
                    (Handle::Histogram(h), "observe") => h.observe(*value),
                    (_, action) => return Err(format!("'{action}' of {value} does not apply to this metric")),
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

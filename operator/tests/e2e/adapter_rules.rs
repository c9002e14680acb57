//! The chart's prometheus-adapter rules, checked against a live server: the
//! rendered PromQL is parsed (promql-parser), every series it selects must be
//! in a real serving pod's /metrics with the labels the rules match on, and
//! each query is evaluated over two recorded scrapes, as Prometheus would
//! over its last two samples, and compared with the figure its name
//! promises. Only the PromQL the rules use is evaluated here (selectors,
//! `rate`, `clamp_min`, `sum by`, `/`); an unknown construct fails the check.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use promql_parser::parser::{self, Expr, LabelModifier, VectorSelector};
use serde_json::Value;

use crate::env::Env;

type Labels = BTreeMap<String, String>;
type Vector = Vec<(Labels, f64)>;

/// One recorded scrape: every series, with `namespace` added as Prometheus'
/// pod scrape configuration adds it.
struct Scrape {
    at: Instant,
    series: Vec<(Labels, f64)>,
}

/// Renders the rules, records two scrapes of `pod` `gap` apart while it
/// serves, and checks every rule.
pub async fn check(env: &Env, namespace: &str, model: &str, pod: (IpAddr, i32), gap: Duration) -> Result<()> {
    let rules = rendered_rules(env).await?;
    let first = scrape(namespace, pod).await?;
    tokio::time::sleep(gap).await;
    let second = scrape(namespace, pod).await?;
    let matchers = format!("namespace=\"{namespace}\",model=\"{model}\"");
    let totals = |scrape: &Scrape, name: &str| -> f64 {
        scrape
            .series
            .iter()
            .filter(|(l, _)| l["__name__"] == name && l.get("model").map(String::as_str) == Some(model))
            .map(|(_, v)| v)
            .sum()
    };
    let delta = |name: &str| totals(&second, name) - totals(&first, name);
    let dt = second.at.duration_since(first.at).as_secs_f64();
    let mut checked = Vec::new();
    for rule in &rules {
        let name = rule["name"]["as"].as_str().context("a rule without name.as")?;
        let series_query = rule["seriesQuery"].as_str().context("seriesQuery")?;
        let series = parser::parse(series_query).map_err(|e| anyhow::anyhow!("{name}: seriesQuery: {e}"))?;
        ensure!(
            !eval(&series, &first, &first, 1.0)?.is_empty(),
            "{name}: seriesQuery {series_query} selects nothing in a live scrape"
        );
        let query = rule["metricsQuery"]
            .as_str()
            .context("metricsQuery")?
            .replace("<<.LabelMatchers>>", &matchers);
        let expr = parser::parse(&query).map_err(|e| anyhow::anyhow!("{name}: metricsQuery: {e}"))?;
        let result = eval(&expr, &first, &second, dt)?;
        ensure!(result.len() == 1, "{name}: {query} gives {result:?}, not one series");
        let (labels, value) = &result[0];
        ensure!(
            labels.get("model").map(String::as_str) == Some(model),
            "{name}: labels {labels:?}"
        );
        let wanted = match name {
            "nereid_queue_time_microseconds" => {
                delta("nv_inference_queue_duration_us") / delta("nv_inference_request_success").max(1e-9)
            }
            "nereid_pending_requests" => {
                totals(&second, "nv_inference_pending_request_count")
                    + totals(&second, "nereid_inference_executing_request_count")
            }
            "nereid_inference_rate" => delta("nv_inference_count") / dt,
            other => bail!("a rule for {other}, which the operator does not serve"),
        };
        ensure!(
            (value - wanted).abs() <= 1e-6 * wanted.abs().max(1.0),
            "{name}: {query} evaluates to {value}, the figure is {wanted}"
        );
        checked.push(format!("{name}={value:.1}"));
    }
    ensure!(checked.len() == 3, "rules for {checked:?}");
    println!(
        "e2e: prometheus-adapter rules evaluated on two live scrapes: {}",
        checked.join(", ")
    );
    Ok(())
}

/// The chart's rules, rendered by helm.
async fn rendered_rules(env: &Env) -> Result<Vec<Value>> {
    let chart = env.path("charts/nereid");
    let rendered = env
        .helm([
            "template",
            "nereid",
            chart.to_str().context("a UTF-8 path")?,
            "--set",
            "prometheusAdapter.rules.enabled=true",
            "--show-only",
            "templates/prometheus-adapter-rules.yaml",
        ])
        .await?;
    let config_map: Value = serde_saphyr::from_str(&rendered)?;
    let config: Value = serde_saphyr::from_str(config_map["data"]["config.yaml"].as_str().context("config.yaml")?)?;
    Ok(config["externalRules"].as_array().context("externalRules")?.clone())
}

async fn scrape(namespace: &str, (ip, port): (IpAddr, i32)) -> Result<Scrape> {
    let text = crate::inference::client()
        .get(format!("http://{ip}:{port}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let at = Instant::now();
    let mut series = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (head, value) = line.rsplit_once(' ').context("a sample line")?;
        let (name, labels) = match head.split_once('{') {
            Some((name, labels)) => (name, labels.strip_suffix('}').context("a label set")?),
            None => (head, ""),
        };
        let mut set = Labels::from([
            ("__name__".to_string(), name.to_string()),
            ("namespace".to_string(), namespace.to_string()),
        ]);
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').context("a label")?;
            set.insert(key.to_string(), value.trim_matches('"').to_string());
        }
        series.push((set, value.parse()?));
    }
    Ok(Scrape { at, series })
}

/// Evaluates `expr` at the second scrape, with `first` as the earlier sample
/// for range functions, `dt` seconds before.
fn eval(expr: &Expr, first: &Scrape, second: &Scrape, dt: f64) -> Result<Vector> {
    Ok(match expr {
        Expr::Paren(paren) => eval(&paren.expr, first, second, dt)?,
        Expr::VectorSelector(selector) => select(selector, second),
        Expr::Call(call) if call.func.name == "rate" => {
            let Some(Expr::MatrixSelector(matrix)) = call.args.args.first().map(|a| &**a) else {
                bail!("rate() of something other than a range selector");
            };
            let earlier = select(&matrix.vs, first);
            select(&matrix.vs, second)
                .into_iter()
                .filter_map(|(labels, now)| {
                    let before = earlier.iter().find(|(l, _)| *l == labels)?.1;
                    let mut labels = labels;
                    labels.remove("__name__");
                    Some((labels, (now - before) / dt))
                })
                .collect()
        }
        Expr::Call(call) if call.func.name == "clamp_min" => {
            let [vector, Expr::NumberLiteral(floor)] = call.args.args.iter().map(|a| &**a).collect::<Vec<_>>()[..]
            else {
                bail!("clamp_min(vector, number) expected");
            };
            eval(vector, first, second, dt)?
                .into_iter()
                .map(|(l, v)| (l, v.max(floor.val)))
                .collect()
        }
        Expr::Aggregate(aggregate) if aggregate.op.to_string() == "sum" => {
            let Some(LabelModifier::Include(by)) = &aggregate.modifier else {
                bail!("sum without `by (...)`");
            };
            let mut groups: BTreeMap<Labels, f64> = BTreeMap::new();
            for (labels, value) in eval(&aggregate.expr, first, second, dt)? {
                let key = by
                    .labels
                    .iter()
                    .filter_map(|name| Some((name.to_string(), labels.get(name.as_str())?.clone())))
                    .collect();
                *groups.entry(key).or_default() += value;
            }
            groups.into_iter().collect()
        }
        Expr::Binary(binary) if binary.op.to_string() == "/" => {
            let right = eval(&binary.rhs, first, second, dt)?;
            eval(&binary.lhs, first, second, dt)?
                .into_iter()
                .filter_map(|(labels, left)| {
                    let divisor = right.iter().find(|(l, _)| *l == labels)?.1;
                    Some((labels, left / divisor))
                })
                .collect()
        }
        other => bail!("PromQL this check does not evaluate: {other}"),
    })
}

/// The series of `scrape` that `selector` picks (its name and matchers).
fn select(selector: &VectorSelector, scrape: &Scrape) -> Vector {
    scrape
        .series
        .iter()
        .filter(|(labels, _)| {
            selector.name.as_ref().is_none_or(|n| labels["__name__"] == *n)
                && selector
                    .matchers
                    .matchers
                    .iter()
                    .all(|m| m.is_match(labels.get(&m.name).map(String::as_str).unwrap_or("")))
        })
        .cloned()
        .collect()
}

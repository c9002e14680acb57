//! A measurement, run only when asked for by name
//! (`cargo test -p nereid-operator --test e2e -- measure_operator_scraping`):
//! what the chart's operator pods cost while they scrape 20 serving pods, as
//! against 2. Each operator replica's CPU time and resident memory are read
//! from /proc over the same span; the operator scrapes every second in the
//! e2e (the chart's default is every 5 s, so this is five times the load).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::env::{Env, OPERATOR_NAMESPACE, RELEASE};
use crate::operator::{self, Replica};
use crate::procfs;
use crate::simple_model::{self, MODEL, NAMESPACE};
use crate::wait;

const SPAN: Duration = Duration::from_secs(30);

pub async fn run(env: &Env) -> Result<()> {
    simple_model::deployed(env).await?;
    let replicas = operator::replicas(env, OPERATOR_NAMESPACE, RELEASE).await?;
    ensure!(!replicas.is_empty(), "no operator pod");
    measure(&replicas, 2).await?;
    env.kubectl(["scale", "-n", NAMESPACE, &format!("nmodel/{MODEL}"), "--replicas=20"])
        .await?;
    let measured = measure(&replicas, 20).await;
    env.kubectl(["scale", "-n", NAMESPACE, &format!("nmodel/{MODEL}"), "--replicas=2"])
        .await?;
    measured
}

/// Waits until every replica scrapes `pods` ready pods, then measures each
/// over [`SPAN`].
async fn measure(replicas: &[Replica], pods: u32) -> Result<()> {
    let series = format!("nereid_operator_pods_scraped{{model=\"{MODEL}\",namespace=\"{NAMESPACE}\"}}");
    wait::until(
        &format!("every operator replica to scrape {pods} pods"),
        Duration::from_secs(300),
        || async {
            for replica in replicas {
                let scraped = replica.metric(&series).await?;
                ensure!(scraped == f64::from(pods), "{} scrapes {scraped} pods", replica.name);
            }
            Ok(())
        },
    )
    .await?;
    let processes: Vec<u32> = replicas
        .iter()
        .map(|r| operator::process_of_pod(&r.name))
        .collect::<Result<_>>()?;
    let ticks = |pid: u32| procfs::cpu_ticks(pid).with_context(|| format!("the CPU time of process {pid}"));
    let before: Vec<u64> = processes.iter().map(|pid| ticks(*pid)).collect::<Result<_>>()?;
    let started = Instant::now();
    tokio::time::sleep(SPAN).await;
    let elapsed = started.elapsed().as_secs_f64();
    let ticks_per_second = 100.0; // USER_HZ on Linux
    for ((replica, pid), before) in replicas.iter().zip(&processes).zip(before) {
        let cpu = (ticks(*pid)? - before) as f64 / ticks_per_second;
        let (rss, peak) = procfs::memory_kib(*pid).with_context(|| format!("the memory of process {pid}"))?;
        let rounds = replica
            .metric("nereid_operator_scrape_round_duration_seconds_count")
            .await?;
        println!(
            "e2e: operator {} scraping {pods} pods: {:.2}% of a core ({:.1} ms CPU per second), RSS {:.1} MiB \
             (peak {:.1} MiB), {rounds} rounds so far",
            replica.name,
            100.0 * cpu / elapsed,
            1000.0 * cpu / elapsed,
            rss as f64 / 1024.0,
            peak as f64 / 1024.0
        );
    }
    Ok(())
}

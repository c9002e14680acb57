//! Closed loop (`--concurrency-range`): N workers, each with its own
//! connection, each sending its next request as soon as the previous one
//! is answered. The offered load adapts to the server; latency is what a
//! client with N outstanding requests sees.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::perf::measure::{self, MeasureConfig, Measurement};
use crate::perf::sender::Sender;

/// Runs `concurrency` workers until the level is measured, then stops them.
pub async fn run_level(sender: &Sender, concurrency: usize, config: &MeasureConfig) -> Measurement {
    let stop = CancellationToken::new();
    let tracker = TaskTracker::new();
    for _ in 0..concurrency {
        let sender = sender.clone();
        let stop = stop.clone();
        tracker.spawn(async move {
            // Dropping the loop at cancellation drops any request in
            // flight with its connection; the next level opens new ones.
            stop.run_until_cancelled(worker(sender)).await;
        });
    }
    tracker.close();
    let measurement = measure::measure(&sender.recorder, config).await;
    stop.cancel();
    tracker.wait().await;
    measurement
}

async fn worker(sender: Sender) {
    let mut conn = None;
    loop {
        if conn.is_none() {
            conn = sender.connect().await;
        }
        if let Some(c) = conn.as_mut()
            && !sender.send(c).await
        {
            conn = None;
        }
    }
}

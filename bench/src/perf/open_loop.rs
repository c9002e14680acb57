//! Open loop (`--request-rate-range`): requests are sent on a fixed
//! schedule (constant interval at the level's rate) whether or not earlier
//! ones have been answered, so a slow server builds a queue instead of
//! slowing the client down.
//!
//! Each send runs in its own task on a connection taken from an idle pool
//! (a new one is opened when none is idle), so the number of connections
//! follows the number of requests in flight. `--max-inflight` bounds that;
//! when it is reached the scheduler waits, and the sends it owes go out
//! late. A send is *late* when it leaves more than [`LATE`] after its
//! scheduled time: tokio's timer ticks in milliseconds, so at rates above
//! 1000/s sends leave in small bursts within a tick, which is not counted.
//! Latency is measured from the actual send.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connection::Connection;
use crate::perf::measure::{self, MeasureConfig, Measurement};
use crate::perf::sender::Sender;

/// How far behind schedule a send may leave before it counts as late.
pub const LATE: Duration = Duration::from_millis(2);

type Pool = Arc<Mutex<Vec<Connection>>>;

/// Sends at `rate` per second until the level is measured.
pub async fn run_level(sender: &Sender, rate: f64, max_inflight: usize, config: &MeasureConfig) -> Measurement {
    let stop = CancellationToken::new();
    let tracker = TaskTracker::new();
    let scheduler = Scheduler {
        sender: sender.clone(),
        interval: Duration::from_secs_f64(1.0 / rate),
        slots: Arc::new(Semaphore::new(max_inflight.max(1))),
        pool: Pool::default(),
        tracker: tracker.clone(),
        stop: stop.clone(),
    };
    tracker.spawn(stop.clone().run_until_cancelled_owned(scheduler.run()));
    tracker.close();
    let measurement = measure::measure(&sender.recorder, config).await;
    stop.cancel();
    tracker.wait().await;
    measurement
}

struct Scheduler {
    sender: Sender,
    interval: Duration,
    slots: Arc<Semaphore>,
    pool: Pool,
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Scheduler {
    async fn run(self) {
        let start = Instant::now();
        let due = |n: u64| start + self.interval.mul_f64(n as f64);
        let mut next: u64 = 0;
        loop {
            tokio::time::sleep_until(due(next)).await;
            let now = Instant::now();
            while due(next) <= now {
                let Ok(permit) = self.slots.clone().acquire_owned().await else {
                    return;
                };
                let sender = self.sender.clone();
                let pool = self.pool.clone();
                let scheduled = due(next);
                self.tracker
                    .spawn(self.stop.clone().run_until_cancelled_owned(async move {
                        let _permit = permit;
                        send_one(sender, pool, scheduled).await;
                    }));
                next += 1;
            }
        }
    }
}

async fn send_one(sender: Sender, pool: Pool, scheduled: Instant) {
    let idle = pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
    let mut conn = match idle {
        Some(conn) => conn,
        None => match sender.connect().await {
            Some(conn) => conn,
            None => return,
        },
    };
    if scheduled.elapsed() > LATE {
        sender.recorder.late();
    }
    if sender.send(&mut conn).await {
        pool.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
    }
}

//! The batcher's timing on tokio's paused clock: the test plays the
//! instances (it takes each batch and says when the instance is free
//! again), so nothing depends on how fast this machine runs, and no test
//! sleeps to let something happen.

use std::time::Duration;

use crossbeam_channel::Receiver;
use nereid_proto::inference::model_config::SchedulingChoice;
use tokio::sync::mpsc;

use super::*;
use crate::instance_pool::Job;
use crate::model_config::text::parse;
use crate::parameter::Parameter;
use crate::scheduler::Responses;

/// A batcher for one identity-like model whose `dynamic_batching` is
/// `batching`, in front of one instance the test plays.
struct Bench {
    batcher: Arc<DynamicBatchScheduler>,
    jobs: Receiver<Job>,
    idle: mpsc::UnboundedSender<Finished>,
}

fn bench(max_batch_size: u32, batching: &str) -> Bench {
    let config = parse(&format!(
        r#"name: "m" max_batch_size: {max_batch_size}
           input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
           output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
           dynamic_batching {{ {batching} }}"#
    ))
    .unwrap();
    let Some(SchedulingChoice::DynamicBatching(dynamic)) = &config.scheduling_choice else {
        panic!("no dynamic_batching");
    };
    let settings = BatcherConfig::from_config(&config, dynamic).unwrap();
    let (pool, mut queues) = InstancePool::without_instances(1);
    let (idle, idle_rx) = mpsc::unbounded_channel();
    let batcher = DynamicBatchScheduler::start("m", settings, pool, 1, idle_rx).unwrap();
    Bench {
        batcher,
        jobs: queues.remove(0),
        idle,
    }
}

impl Bench {
    /// Queues a request tagged `tag` (its id) with `parameters`.
    fn send(&self, tag: &str, parameters: &[(&str, Parameter)]) -> Responses {
        let (mut request, responses) = Request::for_test(Vec::new(), 1);
        request.id = tag.to_string();
        request.parameters = parameters.iter().map(|(k, v)| ((*k).to_string(), v.clone())).collect();
        self.batcher.enqueue(request).unwrap();
        responses
    }

    /// The batch handed to the instance by now, by tags.
    async fn batch(&self) -> Option<Vec<String>> {
        settle().await;
        let job = self.jobs.try_recv().ok()?;
        Some(job.requests.iter().map(|r| r.id.clone()).collect())
    }

    /// The instance runs the next batch: answers it and is free again.
    async fn run_next(&self) -> Vec<String> {
        settle().await;
        let job = self.jobs.try_recv().expect("a batch was sent");
        let tags = job.requests.iter().map(|r| r.id.clone()).collect();
        for request in job.requests {
            request.responder.answer(Ok(Vec::new().into()));
        }
        self.idle.send(Finished::default()).unwrap();
        tags
    }

    /// The instance takes the next batch and stays busy with it.
    async fn hold_next(&self) -> Job {
        settle().await;
        self.jobs.try_recv().expect("a batch was sent")
    }

    fn free(&self, job: Job) {
        for request in job.requests {
            request.responder.answer(Ok(Vec::new().into()));
        }
        self.idle.send(Finished::default()).unwrap();
    }
}

/// Lets the batcher's task run to where it waits (on paused time, it never
/// waits for the clock: the clock moves only when the test moves it).
async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_waits_max_queue_delay_for_its_preferred_size_and_no_longer() {
    let bench = bench(4, "preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 100000");
    let _a = bench.send("a", &[]);
    let _b = bench.send("b", &[]);
    assert_eq!(bench.batch().await, None, "two of a preferred four wait");
    tokio::time::advance(Duration::from_micros(99_999)).await;
    assert_eq!(bench.batch().await, None, "still within the delay");
    tokio::time::advance(Duration::from_micros(1)).await;
    assert_eq!(
        bench.batch().await,
        Some(vec!["a".into(), "b".into()]),
        "the delay is up"
    );

    // The preferred size goes at once, without waiting for the delay.
    bench.idle.send(Finished::default()).unwrap();
    let _rest: Vec<Responses> = ["c", "d", "e", "f"].iter().map(|t| bench.send(t, &[])).collect();
    assert_eq!(bench.batch().await.map(|b| b.len()), Some(4));
}

#[tokio::test(start_paused = true)]
async fn higher_priority_levels_are_served_first() {
    let bench = bench(1, "priority_levels: 2 default_priority_level: 2");
    let _blocker = bench.send("blocker", &[]);
    let running = bench.hold_next().await;
    let _queued: Vec<Responses> = [("low1", 2), ("low2", 2), ("high1", 1), ("high2", 1)]
        .into_iter()
        .map(|(tag, level)| bench.send(tag, &[("priority", Parameter::Int(level))]))
        .collect();
    settle().await;
    bench.free(running);
    let mut order = Vec::new();
    for _ in 0..4 {
        order.extend(bench.run_next().await);
    }
    assert_eq!(order, ["high1", "high2", "low1", "low2"]);
    // A level the model does not have is refused before it queues.
    let (mut request, _) = Request::for_test(Vec::new(), 1);
    request.parameters.insert("priority".into(), Parameter::Int(3));
    let error = bench.batcher.enqueue(request).unwrap_err();
    assert!(error.message().contains("invalid priority 3"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn queue_timeouts_reject_or_delay_at_their_deadline() {
    let bench = bench(
        1,
        "priority_levels: 2 default_priority_level: 1 \
         priority_queue_policy { key: 1 value: { timeout_action: REJECT default_timeout_microseconds: 100000 } } \
         priority_queue_policy { key: 2 value: { timeout_action: DELAY default_timeout_microseconds: 100000 } }",
    );
    let _blocker = bench.send("blocker", &[]);
    let running = bench.hold_next().await;
    let mut rejected = bench.send("rejected", &[]);
    let _delayed = bench.send("delayed", &[("priority", Parameter::Int(2))]);
    tokio::time::advance(Duration::from_micros(99_999)).await;
    settle().await;
    assert!(rejected.try_recv().is_err(), "not before its deadline");
    tokio::time::advance(Duration::from_micros(1)).await;
    settle().await;
    let outcome = rejected.try_recv().expect("answered at its deadline");
    assert_eq!(outcome.unwrap_err().message(), "Request timeout expired");

    // The delayed one stays queued, behind what arrives after it on its level.
    let _later = bench.send("later", &[("priority", Parameter::Int(2))]);
    settle().await;
    bench.free(running);
    assert_eq!(bench.run_next().await, ["later"]);
    assert_eq!(bench.run_next().await, ["delayed"]);
}

#[tokio::test(start_paused = true)]
async fn a_request_timeout_override_shortens_its_wait() {
    let bench = bench(
        1,
        "default_queue_policy { allow_timeout_override: true timeout_action: REJECT }",
    );
    let _blocker = bench.send("blocker", &[]);
    let running = bench.hold_next().await;
    let mut short = bench.send("short", &[("timeout", Parameter::Int(50_000))]);
    let mut long = bench.send("long", &[("timeout", Parameter::Int(5_000_000))]);
    tokio::time::advance(Duration::from_millis(50)).await;
    settle().await;
    assert!(short.try_recv().unwrap().is_err(), "the 50 ms override expired");
    assert!(long.try_recv().is_err(), "the 5 s one waits on");
    bench.free(running);
    assert_eq!(bench.run_next().await, ["long"]);
    assert!(long.recv().await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_full_level_refuses_the_next_request_at_once() {
    let bench = bench(1, "default_queue_policy { max_queue_size: 2 }");
    let _blocker = bench.send("blocker", &[]);
    let running = bench.hold_next().await;
    let _queued: Vec<Responses> = ["q1", "q2"].iter().map(|t| bench.send(t, &[])).collect();
    let mut refused = bench.send("refused", &[]);
    settle().await;
    let error = refused.try_recv().expect("answered at once").unwrap_err();
    assert_eq!(error.message(), "Exceeds maximum queue size");
    // The queued two run in their order once the instance is free.
    bench.free(running);
    assert_eq!(bench.run_next().await, ["q1"]);
    assert_eq!(bench.run_next().await, ["q2"]);
}

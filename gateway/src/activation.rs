//! Waking a model scaled to zero: a request for a model with
//! `minReplicas: 0` and no ready pod is held here while the gateway asks
//! for a replica, then forwarded to the first pod that becomes ready.
//!
//! What is held is bounded before it is taken: per model, the requests
//! (`--max-held-requests-per-model`) and their body bytes
//! (`--max-held-bytes-per-model`, on top of the global
//! `--max-in-flight-bytes` those bytes are already charged to), and in time,
//! by the model's `activationTimeout`. A request over a bound, or one whose
//! model is not ready in time, is answered 503 / UNAVAILABLE with a message
//! saying that the model is waking up. Nothing else waits on a held
//! request: it is one parked task, woken by the router's updates.
//!
//! One wake-up loop runs per model while requests are held: it asks the
//! [`Waker`] for a replica (the scale subresource, [`crate::scale_up`]),
//! then asks again every [`WAKE_AGAIN`] until a pod is ready or no request
//! waits, so a wake-up undone meanwhile (KEDA deciding on an older
//! IsActive) is redone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use prometheus::IntGauge;
use thiserror::Error;

use crate::limits::flag;
use crate::metrics::Metrics;
use crate::registry::ModelKey;
use crate::router::{Router, Sleeper};

/// How often a wake-up is asked for again while requests wait.
pub const WAKE_AGAIN: Duration = Duration::from_secs(5);

/// What asks the cluster for a replica of a model.
pub trait Waker: Send + Sync + 'static {
    /// Sets one replica if the model has none; `Ok(true)` when this call
    /// did, `Ok(false)` when it had replicas already (or someone else
    /// changed them first).
    fn wake(&self, model: &ModelKey) -> BoxFuture<'static, Result<bool, String>>;
}

/// The bounds on what waits for models waking up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldLimits {
    /// Requests held at once for one model.
    pub max_requests: usize,
    /// Request body bytes held at once for one model.
    pub max_bytes: usize,
}

/// Why a request for a model waking up was not forwarded.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum WakeError {
    #[error(
        "model {model} is waking up from zero replicas and {limit} requests already wait for it, the most \
         the gateway holds per model ({flag}): retry in a few seconds",
        flag = flag::MAX_HELD_REQUESTS
    )]
    TooManyHeld { model: String, limit: usize },
    #[error(
        "model {model} is waking up from zero replicas and the requests waiting for it hold {held} bytes; \
         this one's {bytes} would pass the gateway's {limit} per model ({flag}): retry in a few seconds",
        flag = flag::MAX_HELD_BYTES
    )]
    TooManyBytes {
        model: String,
        held: usize,
        bytes: usize,
        limit: usize,
    },
    #[error(
        "model {model} is waking up from zero replicas and no pod of it was ready within its \
         activationTimeout ({seconds} s): retry shortly"
    )]
    TimedOut { model: String, seconds: u64 },
    #[error("model {model} is waking up from zero replicas, but the gateway cannot ask for a replica: {why}")]
    NoWaker { model: String, why: &'static str },
}

/// What waits for one model.
#[derive(Debug, Default)]
struct Waiting {
    requests: AtomicUsize,
    bytes: AtomicUsize,
    /// A wake-up loop runs for the model.
    waking: AtomicBool,
}

/// The held requests of every model, and the wake-up loops.
pub struct Activation {
    limits: HoldLimits,
    waker: OnceLock<Arc<dyn Waker>>,
    models: Mutex<HashMap<ModelKey, Arc<Waiting>>>,
}

/// One held request, counted against its model's bounds (and in its
/// `nereid_gateway_held_requests` gauge, once admitted) until dropped.
#[derive(Debug)]
pub struct Held {
    waiting: Arc<Waiting>,
    bytes: usize,
    gauge: Option<IntGauge>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.waiting.requests.fetch_sub(1, Ordering::AcqRel);
        self.waiting.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        if let Some(gauge) = &self.gauge {
            gauge.dec();
        }
    }
}

impl Activation {
    pub fn new(limits: HoldLimits) -> Arc<Self> {
        Arc::new(Activation {
            limits,
            waker: OnceLock::new(),
            models: Mutex::new(HashMap::new()),
        })
    }

    /// Sets how replicas are asked for (once the cluster client exists);
    /// a second call is ignored.
    pub fn set_waker(&self, waker: Arc<dyn Waker>) {
        let _ = self.waker.set(waker);
    }

    /// Requests held for `model` now.
    pub fn held(&self, model: &ModelKey) -> usize {
        self.models
            .lock()
            .get(model)
            .map_or(0, |w| w.requests.load(Ordering::Acquire))
    }

    /// Holds a request of `bytes` for `sleeper` until one of its pods is
    /// ready: asks for a replica, then waits for the router to have a ready
    /// endpoint, until `deadline` at most (the model's activation timeout
    /// after the request was first held: [`Sleeper::deadline`]). The
    /// returned [`Held`] stays counted until the caller drops it.
    pub async fn wait(
        self: &Arc<Self>,
        router: &Arc<Router>,
        metrics: &Arc<Metrics>,
        sleeper: &Sleeper,
        bytes: usize,
        deadline: tokio::time::Instant,
    ) -> Result<Held, WakeError> {
        let model = sleeper.label.to_string();
        let Some(waker) = self.waker.get().cloned() else {
            return Err(WakeError::NoWaker {
                model,
                why: "it discovers no cluster (--endpoint)",
            });
        };
        // Subscribed before the check, so an update in between is seen.
        let mut updates = router.updates();
        let held = self.hold(&sleeper.key, &model, bytes, metrics.held(&sleeper.label))?;
        self.keep_waking(router, metrics, waker, sleeper);
        let outcome = loop {
            if router.is_ready(&sleeper.key) {
                break Ok(());
            }
            tokio::select! {
                changed = updates.changed() => if changed.is_err() {
                    // The router is gone: the process is ending.
                    break Err(());
                },
                () = tokio::time::sleep_until(deadline) => break Err(()),
            }
        };
        match outcome {
            Ok(()) => Ok(held),
            Err(()) => Err(WakeError::TimedOut {
                model,
                seconds: sleeper.activation_timeout.as_secs(),
            }),
        }
    }

    /// Counts a request of `bytes` for `key`, if the model's bounds allow.
    fn hold(&self, key: &ModelKey, model: &str, bytes: usize, gauge: IntGauge) -> Result<Held, WakeError> {
        let waiting = Arc::clone(self.models.lock().entry(key.clone()).or_default());
        let held = waiting.requests.fetch_add(1, Ordering::AcqRel);
        let bytes_held = waiting.bytes.fetch_add(bytes, Ordering::AcqRel);
        // Counted first, so that two requests racing for the last slot
        // cannot both take it; undone (by the drop) when over.
        let mut guard = Held {
            waiting,
            bytes,
            gauge: None,
        };
        if held >= self.limits.max_requests {
            return Err(WakeError::TooManyHeld {
                model: model.to_string(),
                limit: self.limits.max_requests,
            });
        }
        if bytes_held + bytes > self.limits.max_bytes {
            return Err(WakeError::TooManyBytes {
                model: model.to_string(),
                held: bytes_held,
                bytes,
                limit: self.limits.max_bytes,
            });
        }
        gauge.inc();
        guard.gauge = Some(gauge);
        Ok(guard)
    }

    /// Starts the model's wake-up loop unless one runs.
    fn keep_waking(
        self: &Arc<Self>,
        router: &Arc<Router>,
        metrics: &Arc<Metrics>,
        waker: Arc<dyn Waker>,
        sleeper: &Sleeper,
    ) {
        let waiting = Arc::clone(self.models.lock().entry(sleeper.key.clone()).or_default());
        if waiting.waking.swap(true, Ordering::AcqRel) {
            return;
        }
        let (this, router, metrics, sleeper) = (
            Arc::clone(self),
            Arc::clone(router),
            Arc::clone(metrics),
            sleeper.clone(),
        );
        tokio::spawn(async move {
            loop {
                let wanted = || waiting.requests.load(Ordering::Acquire) > 0 && !router.is_ready(&sleeper.key);
                if wanted() {
                    match waker.wake(&sleeper.key).await {
                        Ok(true) => {
                            tracing::info!(model = %sleeper.label, "waking a model scaled to zero: asked for one replica");
                            metrics.activated(&sleeper.label);
                        }
                        Ok(false) => {}
                        Err(error) => {
                            tracing::warn!(model = %sleeper.label, %error, "cannot ask for a replica of a model scaled to zero");
                        }
                    }
                    tokio::time::sleep(WAKE_AGAIN).await;
                    continue;
                }
                // Done; but a request held between the check and here must
                // not be left without a loop.
                waiting.waking.store(false, Ordering::Release);
                if !wanted() || waiting.waking.swap(true, Ordering::AcqRel) {
                    break;
                }
            }
            this.forget_if_idle(&sleeper.key);
        });
    }

    /// Drops the record of a model nothing waits for, so that the map holds
    /// only models with requests held or a loop running.
    fn forget_if_idle(&self, key: &ModelKey) {
        let mut models = self.models.lock();
        if let Some(waiting) = models.get(key)
            && waiting.requests.load(Ordering::Acquire) == 0
            && !waiting.waking.load(Ordering::Acquire)
            && Arc::strong_count(waiting) == 1
        {
            models.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::load::Ejection;
    use crate::picker::RoundRobin;
    use crate::registry::{Address, Registry};
    use crate::router::Routed;

    /// A waker that counts its calls and makes the model ready after a
    /// delay, as a pod starting would.
    struct Starter {
        router: Arc<Router>,
        calls: Arc<AtomicUsize>,
        ready_after: Option<Duration>,
    }

    impl Waker for Starter {
        fn wake(&self, model: &ModelKey) -> BoxFuture<'static, Result<bool, String>> {
            let first = self.calls.fetch_add(1, Ordering::AcqRel) == 0;
            let (router, model, after) = (Arc::clone(&self.router), model.clone(), self.ready_after);
            Box::pin(async move {
                if let (true, Some(after)) = (first, after) {
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let address: SocketAddr = "127.0.0.1:9".parse().unwrap();
                        router.update(|r| {
                            r.set_endpoints(
                                model,
                                &[Address {
                                    http: address,
                                    grpc: address,
                                }],
                                1,
                            )
                        });
                    });
                }
                Ok(first)
            })
        }
    }

    /// A sleeping model `ml/sleepy`, its router, and an activation whose
    /// waker makes it ready `ready_after` its first call (never: `None`).
    struct Scene {
        router: Arc<Router>,
        sleeper: Sleeper,
        activation: Arc<Activation>,
        metrics: Arc<Metrics>,
        calls: Arc<AtomicUsize>,
    }

    impl Scene {
        fn new(timeout: Duration, ready_after: Option<Duration>, limits: HoldLimits) -> Scene {
            let key = ModelKey {
                namespace: "ml".into(),
                name: "sleepy".into(),
            };
            let router = Router::new(
                Registry::new(None),
                Box::new(RoundRobin::default()),
                Ejection::default(),
            );
            router.update(|r| {
                r.set_endpoints(key.clone(), &[], 0);
                r.set_activation_timeout(&key, Some(timeout));
            });
            let Ok(Routed::Hold(sleeper)) = router.route("sleepy", &[]) else {
                panic!("a sleeping model is held for");
            };
            let calls = Arc::new(AtomicUsize::new(0));
            let activation = Activation::new(limits);
            activation.set_waker(Arc::new(Starter {
                router: Arc::clone(&router),
                calls: Arc::clone(&calls),
                ready_after,
            }));
            Scene {
                router,
                sleeper,
                activation,
                metrics: Arc::new(Metrics::new()),
                calls,
            }
        }

        /// One request of `bytes` waiting for the model, on its own task.
        fn park(&self, bytes: usize) -> tokio::task::JoinHandle<Result<Held, WakeError>> {
            let (activation, router, metrics, sleeper) = (
                Arc::clone(&self.activation),
                Arc::clone(&self.router),
                Arc::clone(&self.metrics),
                self.sleeper.clone(),
            );
            tokio::spawn(async move {
                let deadline = sleeper.deadline();
                activation.wait(&router, &metrics, &sleeper, bytes, deadline).await
            })
        }

        async fn wait(&self, bytes: usize) -> Result<Held, WakeError> {
            self.activation
                .wait(
                    &self.router,
                    &self.metrics,
                    &self.sleeper,
                    bytes,
                    self.sleeper.deadline(),
                )
                .await
        }

        fn held(&self) -> usize {
            self.activation.held(&self.sleeper.key)
        }
    }

    const ROOMY: HoldLimits = HoldLimits {
        max_requests: 100,
        max_bytes: 1 << 20,
    };

    #[tokio::test(start_paused = true)]
    async fn held_requests_go_on_once_a_pod_is_ready_and_one_wake_up_is_asked() {
        let scene = Scene::new(Duration::from_secs(60), Some(Duration::from_secs(8)), ROOMY);
        let waits: Vec<_> = (0..50).map(|_| scene.park(100)).collect();
        let started = tokio::time::Instant::now();
        let held: Vec<_> = futures::future::join_all(waits).await;
        assert!(
            started.elapsed() >= Duration::from_secs(8),
            "held until the pod was ready"
        );
        for result in &held {
            assert!(result.as_ref().unwrap().is_ok(), "answered once the pod is ready");
        }
        assert!(
            matches!(scene.router.route("sleepy", &[]), Ok(Routed::To(_))),
            "ready now"
        );
        assert_eq!(scene.held(), 50, "counted until forwarded");
        drop(held);
        assert_eq!(scene.held(), 0);
        // One replica asked for, then asked again every WAKE_AGAIN until ready.
        let asked = scene.calls.load(Ordering::Acquire);
        assert!((1..=3).contains(&asked), "{asked} wake-ups");
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_activation_timeout_the_request_is_told_the_model_is_waking() {
        let scene = Scene::new(Duration::from_secs(10), None, ROOMY);
        let error = scene.wait(0).await.unwrap_err();
        assert_eq!(
            error,
            WakeError::TimedOut {
                model: "ml/sleepy".into(),
                seconds: 10
            }
        );
        assert!(error.to_string().contains("is waking up from zero replicas"));
        assert_eq!(scene.held(), 0, "nothing stays counted");
    }

    #[tokio::test(start_paused = true)]
    async fn over_the_bounds_requests_are_refused_at_once() {
        let limits = HoldLimits {
            max_requests: 3,
            max_bytes: 1000,
        };
        let scene = Scene::new(Duration::from_secs(30), None, limits);
        let parked: Vec<_> = (0..3).map(|_| scene.park(100)).collect();
        tokio::task::yield_now().await;
        assert_eq!(scene.held(), 3);
        let error = scene.wait(0).await.unwrap_err();
        assert!(matches!(error, WakeError::TooManyHeld { limit: 3, .. }), "{error}");
        assert!(error.to_string().contains("--max-held-requests-per-model"));
        assert_eq!(scene.held(), 3, "the refused one is not counted");
        for task in parked {
            task.abort();
        }
        tokio::task::yield_now().await;
        assert_eq!(scene.held(), 0);

        let error = scene.wait(1001).await.unwrap_err();
        assert!(matches!(error, WakeError::TooManyBytes { bytes: 1001, .. }), "{error}");
        assert!(error.to_string().contains("--max-held-bytes-per-model"));
    }

    #[tokio::test]
    async fn without_a_cluster_nothing_is_held() {
        let mut scene = Scene::new(Duration::from_secs(30), None, ROOMY);
        scene.activation = Activation::new(ROOMY);
        assert!(matches!(scene.wait(0).await.unwrap_err(), WakeError::NoWaker { .. }));
    }
}

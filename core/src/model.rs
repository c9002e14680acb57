//! One loaded version of a model: its final config, its instances, and the
//! path of a request through them.

pub mod classification;
pub mod normalize;
pub mod stream;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Instant;

use nereid_proto::inference::{ModelConfig, model_config::SchedulingChoice, model_instance_group::Kind};
use tracing::Instrument;

use crate::backend::BackendKind;
use crate::backend::{self, Device};
use crate::batch::BatchKey;
use crate::dynamic_batch_scheduler::{BatcherConfig, DynamicBatchScheduler};
use crate::ensemble_scheduler::EnsembleScheduler;
use crate::error::{Error, Result};
use crate::instance_pool::{Inline, InstancePool, InstanceSource, Placement};
use crate::memory_budget::Reservation;
use crate::metrics::FailureReason;
use crate::model_config::sequence::SequenceConfig;
use crate::model_config::{file_names, parameter};
use crate::model_lifecycle::LoadOptions;
use crate::model_repository_manager::Members;
use crate::parameter::Parameters;
use crate::request::{InferRequest, RequestedOutput};
use crate::response::{InferResponse, Produced};
use crate::scheduler::responder::{self, Responses, UNARY_DEPTH, single};
use crate::scheduler::{CancelOnDrop, Payload, Request, Scheduler};
use crate::sequence_batcher::SequenceBatcher;
use crate::statistics::ModelStatistics;
use crate::tensor::Tensor;
use crate::trace::RequestTrace;

pub struct Model {
    name: String,
    version: i64,
    /// The model's folder (a local copy of an object-storage one): what
    /// front ends read beside the config (a chat template).
    dir: std::path::PathBuf,
    config: Arc<ModelConfig>,
    scheduler: Scheduler,
    statistics: Arc<ModelStatistics>,
    /// Output name to the lines of its `label_filename`, for classification.
    labels: HashMap<String, Vec<String>>,
    /// Whether its backend tells the model which outputs a request named
    /// ([`backend::Backend::reads_requested_outputs`]); the names are
    /// copied per request only then.
    passes_requested: bool,
    /// Gone when its instances are ([`InstancePool::instances`]); `None`
    /// for a model without instances (an ensemble, a remote model).
    instances: Option<Weak<InstanceSource>>,
}

/// A version taken out of service: it tells when the requests that held it
/// have finished and its instances are dropped, so an unload can wait for
/// that and say when memory has come back.
#[derive(Debug, Clone)]
pub struct Retired {
    model: Weak<Model>,
    instances: Option<Weak<InstanceSource>>,
}

impl Retired {
    /// Gives up `model`, which the caller held as the index's copy.
    pub fn new(model: Arc<Model>) -> Self {
        Retired {
            model: Arc::downgrade(&model),
            instances: model.instances.clone(),
        }
    }

    /// Whether nothing holds the version any more (no request, no stream)
    /// and every instance has been dropped.
    pub fn is_gone(&self) -> bool {
        self.model.strong_count() == 0 && self.instances.as_ref().is_none_or(|i| i.strong_count() == 0)
    }
}

/// One version to load.
#[derive(Debug, Clone)]
pub struct VersionSource<'a> {
    pub name: &'a str,
    pub version: i64,
    pub dir: &'a Path,
    /// The completed, validated config.
    pub config: Arc<ModelConfig>,
    pub kind: BackendKind,
}

impl Model {
    /// Creates the instances of one version (or, for an ensemble or a
    /// model that runs elsewhere, what stands in for them). Blocking: model files are
    /// read and sessions built here.
    pub fn load(source: VersionSource<'_>, options: &LoadOptions) -> Result<Model> {
        let VersionSource {
            name,
            version,
            dir: version_dir,
            config,
            kind,
        } = source;
        let started = Instant::now();
        let mut labels = HashMap::new();
        let model_dir = version_dir.parent().unwrap_or(version_dir);
        for output in config.output.iter().filter(|o| !o.label_filename.is_empty()) {
            let what = format!("label file of output '{}'", output.name);
            let path = file_names::resolve(model_dir, model_dir, &output.label_filename, &what)?;
            // The path is inside the model folder: its error may be told.
            let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidData => {
                    Error::invalid(format!("{what} '{}' is not valid UTF-8 text", output.label_filename))
                }
                _ => Error::invalid(format!("{what} '{}' could not be read: {e}", output.label_filename)),
            })?;
            labels.insert(output.name.clone(), text.lines().map(str::to_owned).collect());
        }
        let statistics = Arc::new(ModelStatistics::new(options.metrics.model(name, version)));
        let (scheduler, instances) = match kind {
            BackendKind::Ensemble => (
                Scheduler::Ensemble(Arc::new(EnsembleScheduler::new(&config, options.members.clone())?)),
                None,
            ),
            _ => match kind.implementation().runner(&config)? {
                Some(runner) => (Scheduler::Runner(runner), None),
                None => {
                    let (scheduler, instances) =
                        on_instances(name, version, version_dir, &config, kind, &statistics, &options.members)?;
                    (scheduler, Some(instances))
                }
            },
        };
        statistics.metrics().load_duration(started.elapsed());
        Ok(Model {
            name: name.to_string(),
            version,
            dir: model_dir.to_path_buf(),
            config,
            scheduler,
            labels,
            statistics,
            passes_requested: kind.implementation().reads_requested_outputs(),
            instances,
        })
    }

    /// Whether the model can answer now: an ensemble also needs each of
    /// its members to have a ready version.
    pub fn check_ready(&self) -> Result<()> {
        match &self.scheduler {
            Scheduler::Ensemble(ensemble) => ensemble.members_ready(),
            _ => Ok(()),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn version(&self) -> i64 {
        self.version
    }

    /// The model's folder in the repository (or its local copy).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &Arc<ModelConfig> {
        &self.config
    }

    pub fn statistics(&self) -> &ModelStatistics {
        &self.statistics
    }

    /// Checks a request, runs it on a free instance and shapes the response.
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        // The request's span travels with it (`scheduler::Request::span`),
        // so whatever logs about it, on whichever thread, names it. It is
        // disabled, a level check, unless verbose logging is on: an enabled
        // span per request costs about a tenth of a small request's CPU time
        // (measured with bench/vad.sh). Entered by hand, not with
        // #[instrument], whose future holds the body's future twice (with
        // and without the span).
        let span = tracing::debug_span!("infer", model = %self.name, version = self.version, request_id = %request.id);
        if self.is_decoupled() {
            return Err(Error::unsupported(format!(
                "model '{}' is decoupled (it may answer with many responses): call it over a stream \
                 (gRPC ModelStreamInfer, HTTP generate_stream)",
                self.name
            )));
        }
        // Recorded once whatever happens; if this future is dropped before
        // the answer (the client went away), the request counts as CANCELED.
        let mut outcome = Outcome {
            statistics: &self.statistics,
            arrived: Instant::now(),
            failure: Some(FailureReason::Canceled),
        };
        let result = match self.scheduler.inline() {
            // Answered here and now (identity): nothing to wait for.
            Some(instances) => span.in_scope(|| self.run_now(instances, request, outcome.arrived)),
            // The future of a request that waits in a queue is kilobytes,
            // and every future awaiting this one would carry its size:
            // boxed, it costs the requests above nothing, and one
            // allocation is nothing beside a queued model's compute.
            None => Box::pin(self.run(request, span.clone()).instrument(span.clone())).await,
        };
        outcome.failure = result.as_ref().err().map(FailureReason::of);
        span.in_scope(|| match &result {
            Ok(_) => tracing::debug!("inference done"),
            Err(e) => tracing::debug!(error = %e, "inference failed"),
        });
        result
    }

    /// A queued request: submitted, and its one response awaited.
    async fn run(&self, request: InferRequest, span: tracing::Span) -> Result<InferResponse> {
        let mut submitted = self.submit(request, UNARY_DEPTH, span)?;
        let produced = single(&mut submitted.responses).await?;
        self.respond(submitted.id, produced, &submitted.wanted, submitted.batch_size, true)
    }

    /// [`Self::run`] on instances that run on the calling thread.
    fn run_now(&self, instances: &Inline, request: InferRequest, arrived: Instant) -> Result<InferResponse> {
        let Prepared {
            id,
            reservation,
            trace,
            normalized,
            ..
        } = self.prepare(request)?;
        // As in `submit`: given back once the answer is built.
        let _reservation = reservation;
        let produced = instances.run_now(normalized.inputs, normalized.batch_size, trace, arrived)?;
        self.respond(id, produced, &normalized.outputs, normalized.batch_size, true)
    }

    /// Checks a request and hands it to the scheduler: the one way in for
    /// unary and decoupled calls alike. Its responses (`depth` of them may
    /// wait for the caller) come on the returned [`Submitted`], and dropping
    /// that cancels the request wherever it is.
    fn submit(&self, request: InferRequest, depth: usize, span: tracing::Span) -> Result<Submitted> {
        let Prepared {
            id,
            parameters,
            reservation,
            trace,
            trace_parent,
            normalized,
        } = self.prepare(request)?;
        let (responder, responses) = responder::channel(depth);
        let key = match self.scheduler.batches() {
            true => BatchKey::of(&normalized.inputs),
            false => BatchKey::default(),
        };
        let payload = Payload::new(normalized.inputs);
        let cancel = CancelOnDrop(Arc::clone(&payload));
        let request = Request {
            id: id.clone(),
            payload,
            batch_size: normalized.batch_size,
            key,
            parameters,
            requested: match self.passes_requested {
                true => requested_names(&normalized.outputs),
                false => Vec::new(),
            },
            priority: 0,
            deadline: None,
            sequence: None,
            enqueued_at: tokio::time::Instant::now(),
            queued: self.statistics.pending(),
            span,
            trace: trace.clone(),
            trace_parent,
            responder,
        };
        self.scheduler.submit(request, &self.statistics)?;
        Ok(Submitted {
            id,
            wanted: normalized.outputs,
            batch_size: normalized.batch_size,
            responses,
            _cancel: cancel,
            _reservation: reservation,
            trace,
        })
    }

    /// Takes a request apart for its scheduler, its inputs checked against
    /// the config.
    fn prepare(&self, mut request: InferRequest) -> Result<Prepared> {
        let id = std::mem::take(&mut request.id);
        let parameters = std::mem::take(&mut request.parameters);
        let reservation = std::mem::take(&mut request.reservation);
        let trace = request.trace.take();
        let trace_parent = std::mem::take(&mut request.trace_parent);
        let normalized = normalize::normalize(&self.config, &self.name, &id, request)?;
        Ok(Prepared {
            id,
            parameters,
            reservation,
            trace,
            trace_parent,
            normalized,
        })
    }

    /// The answer from what an execution `produced`: the `wanted` outputs
    /// in the client's shapes (classified when asked). With `all`, a wanted
    /// output the model did not produce is an error; a decoupled model's
    /// response may carry only some.
    fn respond(
        &self,
        id: String,
        produced: Produced,
        wanted: &[RequestedOutput],
        batch_size: usize,
        all: bool,
    ) -> Result<InferResponse> {
        let Produced {
            outputs: mut produced,
            parameters,
        } = produced;
        let batching = self.config.max_batch_size > 0;
        let mut outputs = Vec::with_capacity(wanted.len());
        for wanted in wanted {
            // Moved out, not cloned: normalize let each output be asked for once.
            let Some(tensor) = produced
                .iter()
                .position(|t| t.name == wanted.name)
                .map(|at| produced.swap_remove(at))
            else {
                if !all {
                    continue;
                }
                return Err(Error::internal(format!(
                    "model '{}' produced no output '{}'",
                    self.name, wanted.name
                )));
            };
            let tensor = self.client_shape(tensor, batching, batch_size);
            outputs.push(match wanted.classification {
                Some(k) => {
                    classification::classify(&tensor, k, batching, self.labels.get(&wanted.name).map(Vec::as_slice))?
                }
                None => tensor,
            });
        }
        Ok(InferResponse {
            model_name: self.name.clone(),
            model_version: self.version,
            id,
            outputs,
            parameters,
            queue_depth: self.statistics.queue_depth(),
            output_parameters: Default::default(),
        })
    }

    /// Whether the model is decoupled: it answers a request with any number
    /// of responses, over a stream only.
    /// An ensemble is, too, when one of its steps is.
    pub fn is_decoupled(&self) -> bool {
        let declared = self
            .config
            .model_transaction_policy
            .as_ref()
            .is_some_and(|p| p.decoupled);
        declared || matches!(&self.scheduler, Scheduler::Ensemble(ensemble) if ensemble.is_decoupled())
    }

    /// Undoes an output `reshape`: the client sees the config's dims.
    fn client_shape(&self, mut tensor: Tensor, batching: bool, batch_size: usize) -> Tensor {
        let Some(output) = self.config.output.iter().find(|o| o.name == tensor.name) else {
            return tensor;
        };
        if output.reshape.is_some() && !output.dims.contains(&-1) {
            let mut shape = Vec::with_capacity(output.dims.len() + 1);
            if batching {
                shape.push(i64::try_from(batch_size).unwrap_or(i64::MAX));
            }
            shape.extend_from_slice(&output.dims);
            tensor.shape = shape;
        }
        tensor
    }
}

/// The names of the outputs a request asked for (every output, when it
/// named none).
fn requested_names(outputs: &[RequestedOutput]) -> Vec<String> {
    outputs.iter().map(|o| o.name.clone()).collect()
}

/// The instances of a version and the scheduler in front of them: the
/// sequence or dynamic batcher when the config asks for one, else the
/// default one.
fn on_instances(
    name: &str,
    version: i64,
    version_dir: &Path,
    config: &Arc<ModelConfig>,
    kind: BackendKind,
    statistics: &Arc<ModelStatistics>,
    members: &Members,
) -> Result<(Scheduler, Weak<InstanceSource>)> {
    let placements = placements(config)?;
    let model_dir = version_dir.parent().unwrap_or(version_dir);
    let warmup = crate::warmup::prepare(config, name, model_dir)?;
    let source = |idle| InstanceSource {
        model: name.to_string(),
        version,
        backend: backend::for_kind(kind),
        config: Arc::clone(config),
        version_dir: version_dir.to_path_buf(),
        statistics: Arc::clone(statistics),
        members: members.clone(),
        idle,
    };
    if crate::model_config::sequence::of(config).is_some() {
        let settings = SequenceConfig::from_config(config, model_dir)?;
        let pool = InstancePool::start_per_instance(source(None), &placements, warmup)?;
        let instances = pool.instances();
        let decoupled = config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled);
        let batcher = SequenceBatcher::start(name, settings, pool, decoupled)?;
        return Ok((Scheduler::Sequence(batcher), instances));
    }
    let batching = match &config.scheduling_choice {
        Some(SchedulingChoice::DynamicBatching(batching)) => Some(BatcherConfig::from_config(config, batching)?),
        _ => None,
    };
    let (idle_tx, idle_rx) = match batching {
        Some(_) => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    let pool = InstancePool::start(source(idle_tx), &placements, warmup)?;
    let instances = pool.instances();
    let scheduler = match (batching, idle_rx) {
        (Some(batching), Some(idle)) => {
            let threads = pool.threads();
            Scheduler::Dynamic(DynamicBatchScheduler::start(name, batching, pool, threads, idle)?)
        }
        _ => Scheduler::Default(pool),
    };
    Ok((scheduler, instances))
}

/// A request taken apart: what its answer and its scheduler need besides
/// the checked inputs.
struct Prepared {
    id: String,
    parameters: Parameters,
    reservation: Reservation,
    trace: Option<Arc<RequestTrace>>,
    trace_parent: Vec<(String, String)>,
    normalized: normalize::Normalized,
}

/// A request in its scheduler's hands: what its answers need, its
/// responses, and what it holds until they are done.
struct Submitted {
    id: String,
    wanted: Vec<RequestedOutput>,
    batch_size: usize,
    responses: Responses,
    /// Dropped with this: a request whose caller went away drops its inputs
    /// at once, wherever it is queued.
    _cancel: CancelOnDrop,
    /// The request data's share of the memory budget, given back with it.
    _reservation: Reservation,
    trace: Option<Arc<RequestTrace>>,
}

/// Records a request's end in the statistics (and metrics) when dropped.
struct Outcome<'a> {
    statistics: &'a ModelStatistics,
    arrived: Instant,
    failure: Option<FailureReason>,
}

impl Drop for Outcome<'_> {
    fn drop(&mut self) {
        self.statistics.record_request(self.failure, self.arrived.elapsed());
    }
}

/// The most instances one model may have (the sum over its groups, a
/// group's count once per GPU it names): each is a thread and a backend
/// session. Triton sets none; 256 is far above any machine's cores.
pub const MAX_INSTANCES: usize = 256;

/// The most threads one instance's backend may be asked to run
/// (`intra_op_thread_count`).
pub const MAX_INTRA_OP_THREADS: usize = 256;

/// One placement per instance from `instance_group`, as
/// [`instance_group::resolve`](crate::model_config::instance_group::resolve)
/// left it: a KIND_GPU group names its GPUs, KIND_MODEL runs on the CPU.
fn placements(config: &ModelConfig) -> Result<Vec<Placement>> {
    // Counted before anything is made: each instance is a thread and a
    // session, and a count of 2147483647 asked for a 16 GiB vector.
    let mut total = 0usize;
    for group in &config.instance_group {
        let per_device = usize::try_from(group.count.max(1)).unwrap_or(usize::MAX);
        total = total.saturating_add(per_device.saturating_mul(group.gpus.len().max(1)));
    }
    if total > MAX_INSTANCES {
        return Err(Error::invalid(format!(
            "instance_group asks for {total} instances; a model may have at most {MAX_INSTANCES}"
        )));
    }
    let mut devices = Vec::new();
    for group in &config.instance_group {
        let count = group.count.max(1) as usize;
        match Kind::try_from(group.kind).unwrap_or(Kind::Auto) {
            Kind::Gpu if group.gpus.is_empty() => {
                return Err(Error::internal(format!(
                    "instance group '{}' is KIND_GPU with no GPU resolved",
                    group.name
                )));
            }
            Kind::Gpu => {
                for gpu in &group.gpus {
                    devices.extend(std::iter::repeat_n(Device::Gpu(*gpu), count));
                }
            }
            Kind::Cpu | Kind::Auto | Kind::Model => {
                devices.extend(std::iter::repeat_n(Device::Cpu, count));
            }
        }
    }
    if devices.is_empty() {
        devices.push(Device::Cpu);
    }
    let threads = match parameter(config, "intra_op_thread_count") {
        Some(value) => value.parse::<usize>().map_err(|_| {
            Error::invalid(format!(
                "parameter 'intra_op_thread_count' must be a non-negative integer, got '{value}'"
            ))
        })?,
        // 0 means "pick": share the cores between the instances.
        None => 0,
    };
    if threads > MAX_INTRA_OP_THREADS {
        return Err(Error::invalid(format!(
            "parameter 'intra_op_thread_count' is {threads}; an instance may have at most {MAX_INTRA_OP_THREADS} threads"
        )));
    }
    let threads = if threads > 0 {
        threads
    } else {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / devices.len()).max(1)
    };
    Ok(devices
        .into_iter()
        .map(|device| Placement {
            device,
            intra_op_threads: threads,
        })
        .collect())
}

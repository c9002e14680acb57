//! One instance of a Python model: its stub, and the loop that runs a batch
//! through it.
//!
//! An instance thread writes the batch's inputs into the host pool, sends
//! `execute`, and when its turn comes reads the stub until `executed`,
//! which carries every response; meanwhile the stub may call other models
//! (BLS, answered from the async runtime), log and update its metrics. Two
//! threads (lanes) take turns on one stub, so that the next batch is in
//! the stub's socket before the current one is done. A decoupled model's
//! stub is read by its [`Pump`](crate::pump::Pump) instead: its requests
//! outlive their execute, so the instance waits only for `executed` and
//! takes its next batch while they stream.
//!
//! A stub that dies, garbles the protocol or stays silent past the execute
//! timeout fails the batch it was running and is replaced: the next batch
//! starts a new stub, after a back-off that doubles with each failure in a
//! row (0.1 s up to 10 s).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nereid_core::backend::{Batch, Device, ModelInstance, RequestInfo, ResponseSink};
use nereid_core::datatype::DataType;
use nereid_core::error::{Error, Result};
use nereid_core::model_repository_manager::Members;
use nereid_core::response::Produced;
use nereid_core::sequence_batcher::correlation::CorrelationId;
use nereid_core::statistics::ComputeTiming;
use nereid_core::tensor::Tensor;
use parking_lot::{Condvar, Mutex};

use crate::bls::{self, Caller};
use crate::metrics::CustomMetrics;
use crate::protocol::{
    Descriptor, ExecRequest, FromStub, InitArgs, SEQUENCE_END, SEQUENCE_START, ShmSettings, ToStub, WireResponse,
    parameters_from_json, parameters_to_json,
};
use crate::shm::{HostPool, StubPool};
use crate::stub::{self, Gone, Launch, Stub, Writer};

/// What every instance of one model version shares.
pub struct Shared {
    pub model: String,
    pub version: i64,
    /// The config as Triton's JSON, for `initialize`'s `model_config`.
    pub config_json: String,
    pub model_file: String,
    pub model_dir: String,
    pub decoupled: bool,
    /// Each output's datatype and dims, for checking what the model returns.
    pub outputs: HashMap<String, (DataType, Vec<i64>)>,
    pub output_names: Vec<String>,
    pub batching: bool,
    pub launch: Launch,
    pub stub_timeout: Duration,
    pub execute_timeout: Duration,
    pub members: Members,
    pub runtime: tokio::runtime::Handle,
    pub metrics: Arc<CustomMetrics>,
    /// Outputs already warned about for a datatype other than the config's.
    pub mistyped: parking_lot::Mutex<std::collections::HashSet<String>>,
    /// How many executes an instance sends ahead while its stub runs the
    /// current one (a lane each; `execute-ahead`).
    pub execute_ahead: usize,
}

/// The longest wait before a new stub after failures in a row.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// One lane of an instance: with `execute-ahead` (the default), a model
/// that is not decoupled has two, on two pool threads, taking turns on the
/// instance's one stub
/// ([`ModelInstance::lane`]). While the stub runs one lane's execute, the
/// other lane's is already written and waits in the stub's socket, so the
/// stub goes from one execute to the next without waiting for the
/// server's round trip (reading `executed`, answering, taking the next
/// batch, writing its inputs): at one request per execute that round trip
/// had the stub idle nearly half the time.
pub struct PythonInstance {
    shared: Arc<Shared>,
    cell: Arc<Cell>,
}

/// The stub of one instance and the order its lanes use it in.
struct Cell {
    shared: Arc<Shared>,
    name: String,
    device: Device,
    state: Mutex<State>,
    /// Signalled when the turn to read the stub passes on, or the stub fails.
    turn: Condvar,
}

struct State {
    /// The stub, while no lane reads it (the lane whose turn it is takes
    /// it out); `None` too once it has failed, until the next batch starts
    /// a new one.
    stub: Option<Stub>,
    /// How lanes write to the stub while another reads it; `None` while
    /// there is no stub.
    link: Option<Link>,
    /// Executes sent to the stub, and the one whose answers are read next:
    /// the stub runs them in the order sent.
    sent: u64,
    serving: u64,
    /// Counts stubs: an execute sent to an earlier one failed with it, for
    /// the reason in `lost`.
    generation: u64,
    lost: String,
    /// The key of the next request sent to the stub: keys are unique per
    /// stub, so that an execute waiting in its socket never shares one with
    /// the execute running.
    next_key: u64,
    /// Stub failures in a row, and when the last one was.
    failures: u32,
    failed_at: Option<Instant>,
    /// The lanes made so far: this one and those given to the pool.
    lanes: usize,
}

impl State {
    /// Drops the stub (which kills what is left of it): executes sent to
    /// it can no longer be answered, and the next batch starts a new one.
    fn forget_stub(&mut self) {
        self.stub = None;
        self.link = None;
        self.generation += 1;
    }
}

/// What writing to a stub needs.
#[derive(Clone)]
struct Link {
    writer: Writer,
    host: Arc<Mutex<HostPool>>,
}

impl Link {
    fn of(stub: &Stub) -> Link {
        Link {
            writer: Arc::clone(stub.writer()),
            host: Arc::clone(&stub.host),
        }
    }
}

impl PythonInstance {
    /// Starts the instance's stub and initializes the model: an error
    /// here (the model's own, with its traceback) fails the load.
    pub fn start(shared: Arc<Shared>, name: String, device: Device) -> Result<Self> {
        let cell = Cell {
            shared: Arc::clone(&shared),
            name,
            device,
            state: Mutex::new(State {
                stub: None,
                link: None,
                sent: 0,
                serving: 0,
                generation: 0,
                lost: String::new(),
                next_key: 0,
                failures: 0,
                failed_at: None,
                lanes: 1,
            }),
            turn: Condvar::new(),
        };
        let stub = cell.launch()?;
        {
            let mut state = cell.state.lock();
            state.link = Some(Link::of(&stub));
            state.stub = Some(stub);
        }
        Ok(PythonInstance {
            shared,
            cell: Arc::new(cell),
        })
    }
}

impl Cell {
    fn launch(&self) -> Result<Stub> {
        let mut stub = self.initialized()?;
        if self.shared.decoupled {
            stub.start_pump(Arc::clone(&self.shared))?;
        }
        Ok(stub)
    }

    /// A new stub with the model initialized in it.
    fn initialized(&self) -> Result<Stub> {
        let shared = &self.shared;
        let mut stub = Stub::spawn(&shared.launch, &shared.model)?;
        // As Triton's args say it: the model picks its own device
        // (torch.device("cuda", id)) from these two.
        let (kind, device_id) = match self.device {
            Device::Cpu => ("CPU", 0),
            Device::Gpu(ordinal) => ("GPU", ordinal),
        };
        let init = ToStub::Init {
            model_file: shared.model_file.clone(),
            args: InitArgs {
                model_config: shared.config_json.clone(),
                model_instance_kind: kind.into(),
                model_instance_name: self.name.clone(),
                model_instance_device_id: device_id.to_string(),
                model_repository: shared.model_dir.clone(),
                model_version: shared.version.to_string(),
                model_name: shared.model.clone(),
            },
            shm: ShmSettings {
                default_byte_size: shared.launch.pool.default as u64,
                growth_byte_size: shared.launch.pool.growth as u64,
                limit_byte_size: shared.launch.pool.limit as u64,
            },
        };
        let failed = |why: String| Error::unavailable(format!("model '{}' failed to initialize: {why}", shared.model));
        stub.send(&init).map_err(|g| failed(g.describe()))?;
        match stub.answer(shared.stub_timeout, &shared.model, &shared.metrics) {
            Ok(FromStub::Ready) => Ok(stub),
            Ok(FromStub::Failed { message }) => Err(failed(message)),
            Ok(other) => Err(failed(format!("the stub answered {other:?} to init"))),
            Err(Gone::Silent(waited)) => Err(failed(format!(
                "the stub did not initialize within {} s (--backend-config=python,stub-timeout-seconds)",
                waited.as_secs()
            ))),
            Err(gone) => Err(failed(gone.describe())),
        }
    }

    /// Makes sure there is a stub to send to: the running one, or a new
    /// one once the back-off has passed. Called with no execute in the
    /// stub, or with the stub alive.
    fn ensure_stub(&self, state: &mut State) -> Result<Link> {
        let idle = state.sent == state.serving;
        if idle && state.stub.as_mut().is_some_and(Stub::has_exited) {
            tracing::warn!(model = %self.shared.model, instance = %self.name, "the Python stub exited while idle");
            state.forget_stub();
        }
        if let Some(link) = &state.link {
            return Ok(link.clone());
        }
        if let Some(at) = state.failed_at {
            let backoff = Duration::from_millis(100)
                .saturating_mul(1 << state.failures.saturating_sub(1).min(7))
                .min(MAX_BACKOFF);
            if let Some(wait) = (at + backoff).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        tracing::info!(model = %self.shared.model, instance = %self.name, "starting a new Python stub");
        match self.launch() {
            Ok(stub) => {
                let link = Link::of(&stub);
                state.link = Some(link.clone());
                state.stub = Some(stub);
                state.next_key = 0;
                Ok(link)
            }
            Err(e) => {
                state.failures += 1;
                state.failed_at = Some(Instant::now());
                Err(e)
            }
        }
    }

    /// The stub failed while a lane read it (the lane has dropped it):
    /// every execute sent to it fails, and the next batch starts a new one.
    fn failed(&self, state: &mut State, reason: &str) {
        tracing::error!(model = %self.shared.model, instance = %self.name, %reason, "the Python stub failed; its batches fail and a new stub will take the next");
        state.forget_stub();
        state.lost = reason.to_string();
        state.serving = state.sent;
        state.failures += 1;
        state.failed_at = Some(Instant::now());
        self.turn.notify_all();
    }

    fn restarting(&self, reason: &str) -> Error {
        Error::unavailable(format!(
            "model '{}' instance '{}': {reason}; the instance is restarting",
            self.shared.model, self.name
        ))
    }

    /// A decoupled model's batch: one lane, which holds the stub for the
    /// whole execute (its responses stream through the stub's pump).
    fn execute_decoupled(&self, batch: Batch, sink: &mut dyn ResponseSink) -> Result<ComputeTiming> {
        let started = Instant::now();
        let mut state = self.state.lock();
        self.ensure_stub(&mut state)?;
        let stub = state.stub.as_mut().expect("ensured above");
        if let Err(gone) = run_decoupled(&self.shared, stub, batch, sink) {
            let reason = gone.describe();
            if let Some(pump) = stub.pump() {
                pump.stopping(reason.clone());
            }
            // Dropping it kills whatever is left of it.
            self.failed(&mut state, &reason);
            return Err(self.restarting(&reason));
        }
        state.failures = 0;
        Ok(ComputeTiming {
            infer: started.elapsed(),
            ..ComputeTiming::default()
        })
    }

    /// A batch of a model that is not decoupled: its inputs written and
    /// its `execute` sent at once, its answers read when its turn comes.
    fn execute(&self, batch: Batch, sink: &mut dyn ResponseSink) -> Result<ComputeTiming> {
        let shared = &*self.shared;
        let writing = Instant::now();
        let mut state = self.state.lock();
        let link = self.ensure_stub(&mut state)?;
        let (sent, exec) = written(shared, &link.host, batch, sink);
        if sent.is_empty() {
            return Ok(ComputeTiming::default());
        }
        let first = state.next_key;
        state.next_key += sent.len() as u64;
        let (ticket, generation) = (state.sent, state.generation);
        // Sent under the lock, so that the tickets are in the order the
        // stub receives the executes.
        if let Err(e) = stub::send(&link.writer, &ToStub::Execute { requests: exec, first }) {
            // The stub is gone. If a lane is reading it, that lane finds out
            // and fails what was sent; else the next batch starts a new one.
            let reason = format!("the Python stub could not be written to ({e})");
            if state.sent == state.serving {
                self.failed(&mut state, &reason);
            }
            return Err(self.restarting(&reason));
        }
        state.sent += 1;
        let input = writing.elapsed();
        while state.serving != ticket && state.generation == generation {
            self.turn.wait(&mut state);
        }
        if state.generation != generation {
            return Err(self.restarting(&state.lost.clone()));
        }
        let mut stub = state.stub.take().expect("the stub waits for the lane whose turn it is");
        drop(state);
        // The stub starts this execute as it finishes the one before.
        let started = Instant::now();
        let ran = run(shared, &mut stub, first, &sent, sink);
        let infer = started.elapsed();
        let outcome = match ran {
            Ok(()) => Ok(stub),
            Err(gone) => {
                // Killed before the lock is taken: a lane blocked writing
                // to the stub (under the lock) then fails instead of waiting.
                drop(stub);
                Err(gone.describe())
            }
        };
        let mut state = self.state.lock();
        match outcome {
            Ok(stub) => {
                state.stub = Some(stub);
                state.failures = 0;
                state.serving += 1;
                self.turn.notify_all();
                Ok(ComputeTiming {
                    input,
                    infer,
                    ..ComputeTiming::default()
                })
            }
            Err(reason) => {
                self.failed(&mut state, &reason);
                Err(self.restarting(&reason))
            }
        }
    }
}

impl ModelInstance for PythonInstance {
    fn execute(&mut self, batch: Batch, sink: &mut dyn ResponseSink) -> Result<ComputeTiming> {
        match self.shared.decoupled {
            true => self.cell.execute_decoupled(batch, sink),
            false => self.cell.execute(batch, sink),
        }
    }

    /// Another lane, one per execute sent ahead, for a model that is not
    /// decoupled (a decoupled model's stub is read by its pump for as long
    /// as its requests stream, so its batches already overlap their answers).
    fn lane(&mut self) -> Option<Box<dyn ModelInstance>> {
        let mut state = self.cell.state.lock();
        if self.shared.decoupled || state.lanes > self.shared.execute_ahead {
            return None;
        }
        state.lanes += 1;
        Some(Box::new(PythonInstance {
            shared: Arc::clone(&self.shared),
            cell: Arc::clone(&self.cell),
        }))
    }
}

impl Drop for Cell {
    fn drop(&mut self) {
        if let Some(stub) = self.state.get_mut().stub.take() {
            stub.finalize(self.shared.stub_timeout, &self.shared.model, &self.shared.metrics);
        }
    }
}

/// Reads the answers of one execute from `stub` (sent with keys from
/// `first`, for the batch positions `sent`): every request ends, answered
/// or failed, unless the stub itself fails (then it is replaced, and the
/// caller fails what is left).
fn run(shared: &Shared, stub: &mut Stub, first: u64, sent: &[usize], sink: &mut dyn ResponseSink) -> Result<(), Gone> {
    let count = sent.len();
    let caller = Caller {
        runtime: shared.runtime.clone(),
        members: shared.members.clone(),
        writer: Arc::clone(stub.writer()),
        host: Arc::clone(&stub.host),
        model: shared.model.clone(),
    };
    let mut told_cancelled = vec![false; count];
    let mut looked = Instant::now();
    loop {
        // The stub is told of a client that has gone (its model's
        // is_cancelled() turns true) every CANCEL_POLL, whatever the stub
        // sends meanwhile: a model that answers once, at the end, can stop
        // early.
        let waiting = Instant::now();
        let message = loop {
            if looked.elapsed() >= CANCEL_POLL {
                tell_cancelled(stub, sink, first, sent, &mut told_cancelled)?;
                looked = Instant::now();
            }
            let left = shared.execute_timeout.saturating_sub(waiting.elapsed());
            match stub.recv(CANCEL_POLL.min(left)) {
                Err(Gone::Silent(_)) if !left.is_zero() => {}
                Err(Gone::Silent(_)) => return Err(Gone::Silent(waiting.elapsed())),
                received => break received?,
            }
        };
        match message {
            FromStub::Executed { responses, error } => {
                if let Some(error) = error {
                    let error = error.to_error();
                    sent.iter().for_each(|p| {
                        sink.fail(*p, error.clone());
                    });
                    return Ok(());
                }
                let responses = responses.unwrap_or_default();
                if responses.len() != count {
                    let error = Error::internal(format!(
                        "model '{}': execute returned {} responses for {count} requests",
                        shared.model,
                        responses.len()
                    ));
                    sent.iter().for_each(|p| {
                        sink.fail(*p, error.clone());
                    });
                    return Ok(());
                }
                for (i, response) in responses.into_iter().enumerate() {
                    match produced(shared, &stub.stub_pool, response) {
                        Ok(produced) => sink.send(sent[i], produced),
                        Err(e) => sink.fail(sent[i], e),
                    };
                }
                return Ok(());
            }
            FromStub::Response { .. } => {
                return Err(Gone::Garbled(
                    "a response sender's message from a model that is not decoupled".into(),
                ));
            }
            FromStub::Bls(call) => {
                let inputs: Result<Vec<Tensor>> = call.inputs.iter().map(|d| take(&stub.stub_pool, d)).collect();
                match inputs {
                    Ok(inputs) => bls::start(&caller, call, inputs),
                    Err(e) => bls::refuse(&caller, call.call, &e),
                }
            }
            FromStub::Log {
                level,
                message,
                file,
                line,
            } => {
                crate::log::emit(&shared.model, &level, &message, file.as_deref(), line);
            }
            FromStub::MetricFamily { .. } | FromStub::Metric { .. } | FromStub::MetricUpdate { .. } => {
                stub.metrics.apply(&shared.metrics, &shared.model, &message);
            }
            other => {
                return Err(Gone::Garbled(format!("{other:?} during execute")));
            }
        }
    }
}

/// Runs one batch of a decoupled model: its requests' responders go to
/// the pump, which sends their responses as they come, and the batch is
/// over once `execute` has returned.
fn run_decoupled(shared: &Shared, stub: &mut Stub, batch: Batch, sink: &mut dyn ResponseSink) -> Result<(), Gone> {
    let (sent, exec) = written(shared, &stub.host, batch, sink);
    if sent.is_empty() {
        return Ok(());
    }
    let responders = sent.iter().map(|p| sink.detach(*p)).collect();
    let pump = stub
        .pump()
        .ok_or_else(|| Gone::Garbled("a decoupled stub without its reader".into()))?;
    let first = pump.open(responders, &shared.runtime);
    let ran = stub
        .send(&ToStub::Execute { requests: exec, first })
        .and_then(|()| pump.executed(shared.execute_timeout));
    if let Err(gone) = &ran {
        let error = Error::unavailable(format!(
            "model '{}': {}; the instance is restarting",
            shared.model,
            gone.describe()
        ));
        pump.abandon(first, sent.len() as u64, &error);
    }
    ran
}

/// The batch's inputs written into the host pool: the batch positions of
/// the requests to send (a request whose inputs do not fit is failed here
/// and not sent), and the stub's view of each, in that order.
fn written(
    shared: &Shared,
    host: &Mutex<HostPool>,
    batch: Batch,
    sink: &mut dyn ResponseSink,
) -> (Vec<usize>, Vec<ExecRequest>) {
    let Batch { requests, info, .. } = batch;
    // Empty, or one per request in order.
    let mut info = info.into_iter();
    // The stub's request i is the batch's request sent[i]: a request whose
    // inputs do not fit is failed here and not sent.
    let mut sent = Vec::with_capacity(requests.len());
    let mut exec = Vec::with_capacity(requests.len());
    {
        let mut host = host.lock();
        for (position, inputs) in requests.into_iter().enumerate() {
            let info = info.next();
            let described: Result<Vec<Descriptor>> = inputs
                .iter()
                .map(|t| host.write(&t.name, t.datatype.as_wire(), &t.shape, &[&t.data]))
                .collect();
            match described {
                Ok(inputs) => {
                    exec.push(exec_request(shared, info, inputs));
                    sent.push(position);
                }
                Err(e) => {
                    sink.fail(position, e);
                }
            }
        }
    }
    (sent, exec)
}

/// How often a waiting instance (or a pump) looks for requests whose
/// clients have gone.
pub(crate) const CANCEL_POLL: Duration = Duration::from_millis(50);

/// Tells the stub, once each, of the running requests whose clients have
/// gone away.
fn tell_cancelled(
    stub: &Stub,
    sink: &dyn ResponseSink,
    first: u64,
    sent: &[usize],
    told: &mut [bool],
) -> Result<(), Gone> {
    for (i, told) in told.iter_mut().enumerate() {
        if !*told && sink.is_cancelled(sent[i]) {
            *told = true;
            stub.send(&ToStub::Cancelled {
                request: first + i as u64,
            })?;
        }
    }
    Ok(())
}

/// Request parameters the server itself acts on: Triton's front ends take
/// them out, so a model never sees them among `parameters()`.
const SERVER_PARAMETERS: [&str; 7] = [
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "priority",
    "timeout",
    "binary_data_output",
    "triton_enable_empty_final_response",
];

/// The stub's view of one request.
fn exec_request(shared: &Shared, info: Option<RequestInfo>, inputs: Vec<Descriptor>) -> ExecRequest {
    let RequestInfo {
        id,
        parameters,
        requested,
        sequence,
    } = info.unwrap_or_default();
    let mut parameters = parameters_to_json(&parameters);
    let timeout_us = parameters
        .get("timeout")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    parameters.retain(|key, _| !SERVER_PARAMETERS.contains(&key.as_str()));
    let (correlation_id, flags) = match sequence {
        Some(flags) => {
            let id = match &flags.id {
                CorrelationId::Number(n) => serde_json::Value::from(*n),
                CorrelationId::Text(s) => serde_json::Value::from(s.as_str()),
            };
            let bits = (u32::from(flags.start) * SEQUENCE_START) | (u32::from(flags.end) * SEQUENCE_END);
            (id, bits)
        }
        None => (serde_json::Value::from(0), 0),
    };
    ExecRequest {
        id,
        correlation_id,
        flags,
        inputs,
        requested_outputs: match requested.is_empty() {
            true => shared.output_names.clone(),
            false => requested,
        },
        parameters,
        timeout_us,
    }
}

/// One response as the model made it: its outputs, checked against the
/// config, and its parameters; or its error.
pub(crate) fn produced(shared: &Shared, pool: &Mutex<StubPool>, response: WireResponse) -> Result<Produced> {
    if let Some(error) = response.error {
        return Err(error.to_error());
    }
    let outputs = response
        .outputs
        .iter()
        .map(|d| take(pool, d).and_then(|t| check_output(shared, t)))
        .collect::<Result<Vec<Tensor>>>()?;
    let parameters = match &response.parameters {
        Some(json) => parameters_from_json(json).map_err(|e| {
            Error::internal(format!(
                "model '{}' returned bad response parameters: {}",
                shared.model,
                e.message()
            ))
        })?,
        None => Default::default(),
    };
    Ok(Produced { outputs, parameters })
}

/// A tensor from the stub's pool, without a copy.
pub(crate) fn take(pool: &Mutex<StubPool>, descriptor: &Descriptor) -> Result<Tensor> {
    let datatype = DataType::from_wire(&descriptor.datatype).ok_or_else(|| {
        Error::internal(format!(
            "tensor '{}' has an unknown datatype '{}'",
            descriptor.name, descriptor.datatype
        ))
    })?;
    let data: Bytes = pool.lock().take(descriptor)?;
    let tensor = Tensor::new(descriptor.name.clone(), datatype, descriptor.shape.clone(), data);
    tensor.check_data_size()?;
    Ok(tensor)
}

/// An output as the config declares it: a known name and a shape its dims
/// allow (after the batch dimension, for a batching model). Its datatype
/// may differ, as in Triton.
fn check_output(shared: &Shared, tensor: Tensor) -> Result<Tensor> {
    let model = &shared.model;
    let Some((datatype, dims)) = shared.outputs.get(&tensor.name) else {
        return Err(Error::internal(format!(
            "model '{model}' returned output '{}', which its config does not declare",
            tensor.name
        )));
    };
    if tensor.datatype != *datatype && shared.mistyped.lock().insert(tensor.name.clone()) {
        // Triton passes such an output on as the model made it, and
        // Triton's own examples rely on it (bls_decoupled returns int64
        // for a TYPE_INT32 output): so does this backend, saying so once.
        tracing::warn!(
            model = %model,
            output = %tensor.name,
            "the model returns {} for an output its config declares {}; it is sent as the model made it",
            tensor.datatype,
            datatype
        );
    }
    let shape = match shared.batching {
        true => tensor.shape.get(1..).unwrap_or(&[]),
        false => &tensor.shape[..],
    };
    let fits = shape.len() == dims.len() && shape.iter().zip(dims).all(|(s, d)| *d < 0 || s == d);
    if !fits || (shared.batching && tensor.shape.is_empty()) {
        return Err(Error::internal(format!(
            "model '{model}' returned output '{}' of shape {:?}, but its config says {:?}{}",
            tensor.name,
            tensor.shape,
            dims,
            if shared.batching {
                " after the batch dimension"
            } else {
                ""
            }
        )));
    }
    Ok(tensor)
}

//! One instance of a Python model: its stub, and the loop that runs a batch
//! through it.
//!
//! The instance thread writes the batch's inputs into the host pool, sends
//! `execute`, and reads the stub until `executed`, which carries every
//! response; meanwhile the stub may call other models (BLS, answered from
//! the async runtime), log and update its metrics. A decoupled model's
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
use parking_lot::Mutex;

use crate::bls::{self, Caller};
use crate::metrics::CustomMetrics;
use crate::protocol::{
    Descriptor, ExecRequest, FromStub, InitArgs, SEQUENCE_END, SEQUENCE_START, ShmSettings, ToStub, WireResponse,
    parameters_from_json, parameters_to_json,
};
use crate::shm::StubPool;
use crate::stub::{Gone, Launch, Stub};

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
}

/// The longest wait before a new stub after failures in a row.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

pub struct PythonInstance {
    shared: Arc<Shared>,
    name: String,
    device: Device,
    stub: Option<Stub>,
    /// Stub failures in a row, and when the last one was.
    failures: u32,
    failed_at: Option<Instant>,
}

impl PythonInstance {
    /// Starts the instance's stub and initializes the model: an error
    /// here (the model's own, with its traceback) fails the load.
    pub fn start(shared: Arc<Shared>, name: String, device: Device) -> Result<Self> {
        let mut instance = PythonInstance {
            shared,
            name,
            device,
            stub: None,
            failures: 0,
            failed_at: None,
        };
        instance.stub = Some(instance.launch()?);
        Ok(instance)
    }

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

    /// The running stub, or a new one once the back-off has passed.
    fn stub(&mut self) -> Result<&mut Stub> {
        if self.stub.as_mut().is_some_and(Stub::has_exited) {
            tracing::warn!(model = %self.shared.model, instance = %self.name, "the Python stub exited while idle");
            self.stub = None;
        }
        if self.stub.is_none() {
            if let Some(at) = self.failed_at {
                let backoff = Duration::from_millis(100)
                    .saturating_mul(1 << self.failures.saturating_sub(1).min(7))
                    .min(MAX_BACKOFF);
                if let Some(wait) = (at + backoff).checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            tracing::info!(model = %self.shared.model, instance = %self.name, "starting a new Python stub");
            match self.launch() {
                Ok(stub) => self.stub = Some(stub),
                Err(e) => {
                    self.failures += 1;
                    self.failed_at = Some(Instant::now());
                    return Err(e);
                }
            }
        }
        Ok(self.stub.as_mut().expect("started above"))
    }
}

impl ModelInstance for PythonInstance {
    fn execute(&mut self, batch: Batch, sink: &mut dyn ResponseSink) -> Result<ComputeTiming> {
        let started = Instant::now();
        let shared = Arc::clone(&self.shared);
        let stub = self.stub()?;
        let ran = match shared.decoupled {
            true => run_decoupled(&shared, stub, batch, sink),
            false => run(&shared, stub, batch, sink),
        };
        match ran {
            Ok(()) => {
                self.failures = 0;
                Ok(ComputeTiming {
                    infer: started.elapsed(),
                    ..ComputeTiming::default()
                })
            }
            Err(gone) => {
                let reason = gone.describe();
                tracing::error!(model = %shared.model, instance = %self.name, %reason, "the Python stub failed; its batch fails and a new stub will take the next");
                if let Some(pump) = self.stub.as_ref().and_then(Stub::pump) {
                    pump.stopping(reason.clone());
                }
                // Dropping it kills whatever is left of it.
                self.stub = None;
                self.failures += 1;
                self.failed_at = Some(Instant::now());
                Err(Error::unavailable(format!(
                    "model '{}' instance '{}': {reason}; the instance is restarting",
                    shared.model, self.name
                )))
            }
        }
    }
}

impl Drop for PythonInstance {
    fn drop(&mut self) {
        if let Some(stub) = self.stub.take() {
            stub.finalize(self.shared.stub_timeout, &self.shared.model, &self.shared.metrics);
        }
    }
}

/// Runs one batch through `stub`: every request ends, answered or failed,
/// unless the stub itself fails (then it is replaced, and the caller fails
/// what is left).
fn run(shared: &Shared, stub: &mut Stub, batch: Batch, sink: &mut dyn ResponseSink) -> Result<(), Gone> {
    let (sent, exec) = written(shared, stub, batch, sink);
    if sent.is_empty() {
        return Ok(());
    }
    let count = sent.len();
    stub.send(&ToStub::Execute {
        requests: exec,
        first: 0,
    })?;
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
                tell_cancelled(stub, sink, &sent, &mut told_cancelled)?;
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
    let (sent, exec) = written(shared, stub, batch, sink);
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
    stub: &mut Stub,
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
        let mut host = stub.host.lock();
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
fn tell_cancelled(stub: &Stub, sink: &dyn ResponseSink, sent: &[usize], told: &mut [bool]) -> Result<(), Gone> {
    for (i, told) in told.iter_mut().enumerate() {
        if !*told && sink.is_cancelled(sent[i]) {
            *told = true;
            stub.send(&ToStub::Cancelled { request: i as u64 })?;
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

//! Business-logic scripting: a model.py's `InferenceRequest(...).exec()`
//! runs any model this server serves, on the async runtime, while the
//! instance thread goes on reading the stub. Its responses go back through
//! the host pool and the stub's socket; a failure is a response with an
//! error, as Triton's `has_error()` expects, never a dropped call.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use nereid_core::error::{Error, Result};
use nereid_core::model_repository_manager::Members;
use nereid_core::parameter::Parameter;
use nereid_core::request::{InferRequest, RequestedOutput};
use nereid_core::response::InferResponse;
use nereid_core::tensor::Tensor;
use parking_lot::Mutex;

use crate::protocol::{BlsCall, SEQUENCE_END, SEQUENCE_START, ToStub, WireError, WireResponse, parameters_from_json};
use crate::shm::HostPool;
use crate::stub::{self, Writer};

/// What a call needs from the instance that received it.
#[derive(Clone)]
pub struct Caller {
    pub runtime: tokio::runtime::Handle,
    pub members: Members,
    pub writer: Writer,
    pub host: Arc<Mutex<HostPool>>,
    /// The calling model, for errors.
    pub model: String,
}

/// Starts `call` with its inputs (already taken from the stub's pool).
pub fn start(caller: &Caller, call: BlsCall, inputs: Vec<Tensor>) {
    let caller = caller.clone();
    caller.runtime.clone().spawn(async move {
        let id = call.call;
        let timeout = (call.timeout_us > 0).then(|| Duration::from_micros(call.timeout_us));
        let run = run(&caller, call, inputs);
        let finished = match timeout {
            Some(limit) => tokio::time::timeout(limit, run).await.unwrap_or_else(|_| {
                Err(Error::unavailable(format!(
                    "the request timed out after {} us",
                    limit.as_micros()
                )))
            }),
            None => run.await,
        };
        if let Err(e) = finished {
            reply(&caller, id, Some(failed(&e)), true);
        }
    });
}

/// Answers a call that cannot start (its inputs were not readable).
pub fn refuse(caller: &Caller, call: u64, error: &Error) {
    let caller = caller.clone();
    let wire = failed(error);
    caller.runtime.clone().spawn(async move {
        reply(&caller, call, Some(wire), true);
    });
}

/// Runs the call, sending each of its responses; the error that ends it.
async fn run(caller: &Caller, call: BlsCall, inputs: Vec<Tensor>) -> Result<()> {
    let version = (call.version > 0).then_some(call.version);
    let model = caller.members.get(&call.model, version)?;
    let id = call.call;
    let request = request(call.clone(), inputs)?;
    if !call.decoupled {
        if model.is_decoupled() {
            return Err(Error::invalid(format!(
                "model '{}' is decoupled: call it with exec(decoupled=True)",
                call.model
            )));
        }
        let response = model.infer(request).await?;
        let wire = written(caller, response);
        reply(caller, id, Some(wire), true);
        return Ok(());
    }
    if !model.is_decoupled() {
        // One response, then the end, as a stream of one.
        let response = model.infer(request).await?;
        let wire = written(caller, response);
        reply(caller, id, Some(wire), false);
        reply(caller, id, None, true);
        return Ok(());
    }
    let mut stream = model.infer_stream(request)?;
    while let Some(response) = stream.next().await {
        let wire = match response {
            Ok(response) => written(caller, response),
            Err(e) => failed(&e),
        };
        if !reply(caller, id, Some(wire), false) {
            // The stub has gone: nobody reads the rest.
            return Ok(());
        }
    }
    reply(caller, id, None, true);
    Ok(())
}

/// The server's request for a call: its sequence id and flags become the
/// parameters a sequence model reads.
fn request(call: BlsCall, inputs: Vec<Tensor>) -> Result<InferRequest> {
    let mut parameters = match &call.parameters {
        Some(json) => parameters_from_json(json)?,
        None => Default::default(),
    };
    match &call.correlation_id {
        serde_json::Value::Number(n) if n.as_u64().is_some_and(|n| n != 0) => {
            parameters.insert("sequence_id".into(), Parameter::Uint(n.as_u64().unwrap_or(0)));
        }
        serde_json::Value::String(s) if !s.is_empty() => {
            parameters.insert("sequence_id".into(), Parameter::String(s.clone()));
        }
        _ => {}
    }
    if call.flags & SEQUENCE_START != 0 {
        parameters.insert("sequence_start".into(), Parameter::Bool(true));
    }
    if call.flags & SEQUENCE_END != 0 {
        parameters.insert("sequence_end".into(), Parameter::Bool(true));
    }
    Ok(InferRequest {
        model_name: call.model,
        model_version: (call.version > 0).then_some(call.version),
        id: call.request_id,
        inputs,
        outputs: call.requested_outputs.iter().map(RequestedOutput::named).collect(),
        parameters,
        ..Default::default()
    })
}

/// A response's outputs written into the host pool, or the error saying
/// why they did not fit.
fn written(caller: &Caller, response: InferResponse) -> WireResponse {
    let mut host = caller.host.lock();
    let mut outputs = Vec::with_capacity(response.outputs.len());
    for tensor in &response.outputs {
        match host.write(&tensor.name, tensor.datatype.as_wire(), &tensor.shape, &[&tensor.data]) {
            Ok(descriptor) => outputs.push(descriptor),
            Err(e) => return failed(&e),
        }
    }
    WireResponse {
        outputs,
        error: None,
        parameters: Some(crate::protocol::parameters_to_json(&response.parameters)),
    }
}

fn failed(error: &Error) -> WireResponse {
    WireResponse {
        error: Some(WireError::from_error(error)),
        ..Default::default()
    }
}

/// Sends one answer of the call; `false` once the stub cannot be written to.
fn reply(caller: &Caller, call: u64, response: Option<WireResponse>, last: bool) -> bool {
    let message = ToStub::BlsResponse { call, response, last };
    // A stub that reads slowly must not hold up a runtime worker unnoticed.
    let sent = tokio::task::block_in_place(|| stub::send(&caller.writer, &message));
    if let Err(e) = &sent {
        tracing::debug!(model = %caller.model, call, error = %e, "a BLS answer could not reach its stub");
    }
    sent.is_ok()
}

//! `repeat`: a decoupled builtin in the spirit of Triton's `repeat_int32`
//! example. For each request it streams its first input back element by
//! element, one response per element, and then ends the request:
//!
//! ```text
//! name: "repeat"
//! backend: "repeat"
//! max_batch_size: 0
//! model_transaction_policy { decoupled: true }
//! input [
//!   { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },                # the elements
//!   { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] optional: true }, # ms before each
//!   { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] optional: true }    # ms the instance holds
//! ]
//! output [
//!   { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },                # the element
//!   { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }                # its position
//! ]
//! ```
//!
//! The tensors are taken by position, so any names work: the first input
//! (any fixed-size datatype; the first output has the same), an optional
//! second input of UINT32 delays in milliseconds (one per element, or one
//! for all; the parameter `delay_ms` when absent), an optional third input
//! WAIT, and a second output of UINT32 positions. A request whose client
//! has gone away gets no more responses: the backend stops at the next
//! element.
//!
//! WAIT (one UINT32, milliseconds) is how long the instance holds the
//! request before it takes the next one, as Triton's repeat backend has it.
//! Triton sends the responses from a thread of their own and releases the
//! instance after WAIT; here the instance sends them itself and then waits
//! out what is left of WAIT, so it is busy for the longer of the two. The
//! responses are the same; only how requests overlap on one instance
//! differs. A request whose client went away is not held.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nereid_proto::inference::ModelConfig;

use crate::backend::{Backend, Batch, InstanceSpec, ModelInstance, ResponseSink};
use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::model_config::autocomplete::ModelSignature;
use crate::model_config::{input_datatype, output_datatype, parameter};
use crate::statistics::ComputeTiming;
use crate::tensor::Tensor;

pub struct RepeatBackend;

impl Backend for RepeatBackend {
    fn signature(&self, _: &ModelConfig, _: &Path) -> Result<Option<ModelSignature>> {
        Ok(None)
    }

    fn create_instance(&self, spec: InstanceSpec<'_>) -> Result<Box<dyn ModelInstance>> {
        let config = spec.config;
        let bad = |why: &str| Error::invalid(format!("repeat model '{}': {why}", config.name));
        if !config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled) {
            return Err(bad("it is decoupled: set model_transaction_policy { decoupled: true }"));
        }
        if config.input.is_empty() || config.input.len() > 3 || config.output.len() != 2 {
            return Err(bad(
                "it needs one to three inputs (values, delays, wait) and two outputs (value, index)",
            ));
        }
        let datatype = input_datatype(&config.input[0])
            .filter(|t| t.byte_size().is_some())
            .ok_or_else(|| bad("its first input needs a fixed-size data_type"))?;
        if output_datatype(&config.output[0]) != Some(datatype) {
            return Err(bad("its first output needs the first input's data_type"));
        }
        if output_datatype(&config.output[1]) != Some(DataType::Uint32)
            || config.input[1..]
                .iter()
                .any(|d| input_datatype(d) != Some(DataType::Uint32))
        {
            return Err(bad("its delays and wait inputs and its index output are UINT32"));
        }
        let delay = match parameter(config, "delay_ms") {
            None => Duration::ZERO,
            Some(ms) => Duration::from_millis(
                ms.parse()
                    .map_err(|_| bad("parameter 'delay_ms' must be a whole number of milliseconds"))?,
            ),
        };
        Ok(Box::new(Repeat {
            values: config.input[0].name.clone(),
            delays: config.input.get(1).map(|i| i.name.clone()),
            wait: config.input.get(2).map(|i| i.name.clone()),
            value: config.output[0].name.clone(),
            index: config.output[1].name.clone(),
            datatype,
            delay,
        }))
    }

    fn decoupled(&self) -> bool {
        true
    }
}

struct Repeat {
    values: String,
    delays: Option<String>,
    wait: Option<String>,
    value: String,
    index: String,
    datatype: DataType,
    /// Before each response when the request sends no delays.
    delay: Duration,
}

impl ModelInstance for Repeat {
    fn execute(&mut self, batch: Batch, sink: &mut dyn ResponseSink) -> Result<ComputeTiming> {
        let started = Instant::now();
        let requests = batch.requests;
        let size = self.datatype.byte_size().expect("checked at creation");
        for (at, inputs) in requests.iter().enumerate() {
            let began = Instant::now();
            let values = inputs
                .iter()
                .find(|t| t.name == self.values)
                .ok_or_else(|| Error::invalid(format!("repeat: missing input '{}'", self.values)))?;
            let delays = uint32s(inputs, self.delays.as_deref());
            let wait = match uint32s(inputs, self.wait.as_deref()).as_slice() {
                [] => Duration::ZERO,
                [ms] => Duration::from_millis(u64::from(*ms)),
                many => {
                    return Err(Error::invalid(format!(
                        "repeat: input '{}' holds one value, got {}",
                        self.wait.as_deref().unwrap_or_default(),
                        many.len()
                    )));
                }
            };
            for (i, element) in values.data.chunks_exact(size).enumerate() {
                let wait = match delays.as_slice() {
                    [] => self.delay,
                    [one] => Duration::from_millis(u64::from(*one)),
                    many => Duration::from_millis(u64::from(many.get(i).copied().unwrap_or(0))),
                };
                // Cancellable, as WAIT is: a hung-up client's 20 s delay
                // held the instance for everyone else.
                hold(sink, at, Instant::now() + wait);
                if sink.is_cancelled(at) {
                    break;
                }
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                let response = vec![
                    Tensor::new(
                        self.value.clone(),
                        self.datatype,
                        vec![1],
                        Bytes::copy_from_slice(element),
                    ),
                    Tensor::new(
                        self.index.clone(),
                        DataType::Uint32,
                        vec![1],
                        Bytes::copy_from_slice(&index.to_le_bytes()),
                    ),
                ];
                if !sink.send(at, response.into()) {
                    break;
                }
            }
            hold(sink, at, began + wait);
        }
        Ok(ComputeTiming {
            infer: started.elapsed(),
            ..ComputeTiming::default()
        })
    }
}

/// How often a held request checks whether its client went away.
const HOLD_CHECK: Duration = Duration::from_millis(10);

/// Keeps the instance on request `at` until `until`, or until its client
/// goes away: a long WAIT holds nothing for a request nobody waits for.
fn hold(sink: &dyn ResponseSink, at: usize, until: Instant) {
    while !sink.is_cancelled(at) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(HOLD_CHECK));
    }
}

/// The UINT32 values of input `name`, if the request has it.
fn uint32s(inputs: &[Tensor], name: Option<&str>) -> Vec<u32> {
    name.and_then(|name| inputs.iter().find(|t| t.name == name))
        .map(|t| {
            t.data
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Device;
    use crate::model_config::text::parse;
    use crate::response::Produced;

    const CONFIG: &str = r#"name: "repeat" backend: "repeat" max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] optional: true },
                { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] optional: true } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]"#;

    /// Records responses; "cancels" a request after `stop_after` of them.
    struct Recorder {
        sent: Vec<(usize, Vec<Tensor>)>,
        stop_after: usize,
    }

    impl ResponseSink for Recorder {
        fn send(&mut self, request: usize, response: Produced) -> bool {
            self.sent.push((request, response.outputs));
            self.sent.len() < self.stop_after
        }
        fn fail(&mut self, _: usize, _: crate::error::Error) -> bool {
            false
        }
        fn is_cancelled(&self, _: usize) -> bool {
            self.sent.len() >= self.stop_after
        }
    }

    fn ints(values: &[i32]) -> Tensor {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new("IN", DataType::Int32, vec![values.len() as i64], data.into())
    }

    fn batch(requests: Vec<Vec<Tensor>>) -> Batch {
        Batch {
            sizes: vec![1; requests.len()],
            requests,
            info: Vec::new(),
        }
    }

    fn instance() -> Box<dyn ModelInstance> {
        let config = parse(CONFIG).unwrap();
        RepeatBackend
            .create_instance(InstanceSpec {
                config: &config,
                version_dir: Path::new("."),
                device: Device::Cpu,
                intra_op_threads: 1,
                members: &Default::default(),
            })
            .unwrap()
    }

    #[test]
    fn each_element_is_a_response_with_its_position() {
        let mut sink = Recorder {
            sent: Vec::new(),
            stop_after: usize::MAX,
        };
        instance()
            .execute(batch(vec![vec![ints(&[4, 5, 6])], vec![ints(&[9])]]), &mut sink)
            .unwrap();
        let seen: Vec<(usize, i32, u32)> = sink
            .sent
            .iter()
            .map(|(r, t)| {
                let v = i32::from_le_bytes(t[0].data[..4].try_into().unwrap());
                let i = u32::from_le_bytes(t[1].data[..4].try_into().unwrap());
                (*r, v, i)
            })
            .collect();
        assert_eq!(seen, [(0, 4, 0), (0, 5, 1), (0, 6, 2), (1, 9, 0)]);
    }

    fn uint32(name: &str, value: u32) -> Tensor {
        Tensor::new(
            name,
            DataType::Uint32,
            vec![1],
            Bytes::copy_from_slice(&value.to_le_bytes()),
        )
    }

    #[test]
    fn wait_holds_the_instance_after_the_responses() {
        let mut sink = Recorder {
            sent: Vec::new(),
            stop_after: usize::MAX,
        };
        let started = Instant::now();
        instance()
            .execute(batch(vec![vec![ints(&[7, 8]), uint32("WAIT", 150)]]), &mut sink)
            .unwrap();
        assert_eq!(sink.sent.len(), 2);
        assert!(
            started.elapsed() >= Duration::from_millis(150),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_cancelled_request_is_not_held() {
        let mut sink = Recorder {
            sent: Vec::new(),
            stop_after: 1,
        };
        let started = Instant::now();
        // Held for an hour unless the cancellation (after the one response) ends it.
        instance()
            .execute(batch(vec![vec![ints(&[7]), uint32("WAIT", 3_600_000)]]), &mut sink)
            .unwrap();
        assert_eq!(sink.sent.len(), 1);
        assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
    }

    #[test]
    fn a_cancelled_request_does_not_sit_out_its_delay() {
        // The first response is sent, then the client is gone; the second
        // element's delay is an hour.
        let (done, finished) = std::sync::mpsc::channel();
        /// Takes every response; the client is gone once it has one.
        struct GoneAfterOne(usize);
        impl ResponseSink for GoneAfterOne {
            fn send(&mut self, _: usize, _: Produced) -> bool {
                self.0 += 1;
                true
            }
            fn fail(&mut self, _: usize, _: crate::error::Error) -> bool {
                false
            }
            fn is_cancelled(&self, _: usize) -> bool {
                self.0 >= 1
            }
        }
        std::thread::spawn(move || {
            let mut sink = GoneAfterOne(0);
            let delays: Vec<u8> = [0u32, 3_600_000].iter().flat_map(|v| v.to_le_bytes()).collect();
            let delay = Tensor::new("DELAY", DataType::Uint32, vec![2], delays.into());
            let outcome = instance().execute(batch(vec![vec![ints(&[7, 8]), delay]]), &mut sink);
            let _ = done.send((outcome.is_ok(), sink.0));
        });
        let (ok, sent) = finished
            .recv_timeout(Duration::from_secs(60))
            .expect("the instance sat out the hour");
        assert!(ok);
        assert_eq!(sent, 1);
    }

    #[test]
    fn a_wait_of_more_than_one_value_is_refused() {
        let mut sink = Recorder {
            sent: Vec::new(),
            stop_after: usize::MAX,
        };
        let wait = Tensor::new("WAIT", DataType::Uint32, vec![2], Bytes::from_static(&[0; 8]));
        let e = instance()
            .execute(batch(vec![vec![ints(&[7]), wait]]), &mut sink)
            .unwrap_err();
        assert!(e.message().contains("'WAIT' holds one value, got 2"), "{e}");
        assert!(sink.sent.is_empty());
    }

    #[test]
    fn a_cancelled_request_gets_no_more_responses() {
        let mut sink = Recorder {
            sent: Vec::new(),
            stop_after: 2,
        };
        instance()
            .execute(batch(vec![vec![ints(&[1, 2, 3, 4, 5])]]), &mut sink)
            .unwrap();
        assert_eq!(sink.sent.len(), 2);
    }

    #[test]
    fn a_config_that_is_not_decoupled_is_refused() {
        let config = parse(&CONFIG.replace("decoupled: true", "decoupled: false")).unwrap();
        let e = RepeatBackend
            .create_instance(InstanceSpec {
                config: &config,
                version_dir: Path::new("."),
                device: Device::Cpu,
                intra_op_threads: 1,
                members: &Default::default(),
            })
            .err()
            .unwrap();
        assert!(e.message().contains("it is decoupled"), "{e}");
    }
}

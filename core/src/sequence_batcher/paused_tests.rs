//! The sequence batcher on tokio's paused clock, the test playing its one
//! instance: idle sequences are released at their limit and not before,
//! and a decoupled model's responses stream through with the states they
//! carry.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::Receiver;

use super::*;
use crate::model_config::text::parse;
use crate::parameter::Parameter;
use crate::tensor::Tensor;

const CONFIG: &str = r#"name: "s" max_batch_size: 1
    input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    sequence_batching {
      max_sequence_idle_microseconds: 300000
      direct { }
      control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
      state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 1 ]
                initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]
    }"#;

fn start(decoupled: bool) -> (SequenceBatcher, Receiver<Job>) {
    let config = parse(CONFIG).unwrap();
    let settings = SequenceConfig::from_config(&config, Path::new(".")).unwrap();
    let (pool, mut lanes) = InstancePool::without_instances(1);
    let batcher = SequenceBatcher::start("s", settings, pool, decoupled).unwrap();
    (batcher, lanes.remove(0))
}

fn int(name: &str, value: i32) -> Tensor {
    Tensor::new(
        name,
        DataType::Int32,
        vec![1, 1],
        Bytes::copy_from_slice(&value.to_le_bytes()),
    )
}

fn value_of(tensors: &[Tensor], name: &str) -> Option<i32> {
    let tensor = tensors.iter().find(|t| t.name == name)?;
    Some(i32::from_le_bytes(tensor.data[..4].try_into().unwrap()))
}

/// Sends a request of sequence `id`, its response channel deep enough for
/// a stream.
fn send(batcher: &SequenceBatcher, id: u64, start: bool) -> Responses {
    let (mut request, _) = Request::for_test(vec![int("INPUT", 1)], 1);
    let (responder, responses) = responder::channel(STREAM_DEPTH);
    request.responder = responder;
    request.parameters.insert("sequence_id".into(), Parameter::Uint(id));
    request
        .parameters
        .insert("sequence_start".into(), Parameter::Bool(start));
    batcher.enqueue(request).unwrap();
    responses
}

async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

/// The next batch's one request, with the inputs the batcher gave it.
async fn next_row(lane: &Receiver<Job>) -> Option<(Request, Vec<Tensor>)> {
    settle().await;
    let mut job = lane.try_recv().ok()?;
    assert_eq!(job.requests.len(), 1, "one slot: one row per batch");
    let request = job.requests.remove(0);
    let inputs = request.payload.take().unwrap();
    Some((request, inputs))
}

#[tokio::test(start_paused = true)]
async fn an_idle_sequence_is_released_at_its_limit_and_its_slot_goes_to_the_backlog() {
    let (batcher, lane) = start(false);
    let mut first = send(&batcher, 1, true);
    let (row, inputs) = next_row(&lane).await.expect("sequence 1 takes the slot");
    assert_eq!(value_of(&inputs, "START"), Some(1));
    row.responder.answer(Ok(vec![int("OUTPUT", 1), int("S_OUT", 1)].into()));
    settle().await;
    let answer = first.recv().await.unwrap().unwrap();
    assert_eq!(value_of(&answer.outputs, "S_OUT"), None, "states stay in the server");

    // Sequence 2 waits for the only slot while 1 is live.
    let _second = send(&batcher, 2, true);
    assert!(next_row(&lane).await.is_none());
    tokio::time::advance(Duration::from_micros(299_999)).await;
    assert!(next_row(&lane).await.is_none(), "1 is not idle for long enough yet");
    tokio::time::advance(Duration::from_micros(1)).await;
    let (row, _) = next_row(&lane).await.expect("1 released, 2 placed");
    drop(row);

    // A late request of sequence 1 is told why it is refused.
    let mut late = send(&batcher, 1, false);
    settle().await;
    let error = late.recv().await.unwrap().unwrap_err();
    assert!(
        error
            .message()
            .contains("was released after more than 300000 microseconds"),
        "{error}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_decoupled_sequence_streams_every_response_and_keeps_the_states_they_carry() {
    let (batcher, lane) = start(true);
    let mut responses = send(&batcher, 7, true);
    let (row, inputs) = next_row(&lane).await.unwrap();
    assert_eq!(value_of(&inputs, "S_IN"), Some(0), "the initial state");
    // Three responses; only the second updates the state.
    assert!(row.responder.send(Ok(vec![int("OUTPUT", 10)].into())).await);
    assert!(
        row.responder
            .send(Ok(vec![int("OUTPUT", 11), int("S_OUT", 5)].into()))
            .await
    );
    assert!(row.responder.send(Ok(vec![int("OUTPUT", 12)].into())).await);
    drop(row);
    let mut seen = Vec::new();
    while let Some(response) = responses.recv().await {
        let outputs = response.unwrap().outputs;
        assert_eq!(value_of(&outputs, "S_OUT"), None);
        seen.push(value_of(&outputs, "OUTPUT").unwrap());
    }
    assert_eq!(seen, [10, 11, 12], "every response, then the end");

    let _next = send(&batcher, 7, false);
    let (_, inputs) = next_row(&lane).await.unwrap();
    assert_eq!(value_of(&inputs, "S_IN"), Some(5), "the state the stream left");
    assert_eq!(value_of(&inputs, "START"), Some(0));
}

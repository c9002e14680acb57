//! A model as the OpenAI API sees it: a text model by Triton's conventions
//! for LLM models, chosen by its inputs.
//!
//! - `text_input` (BYTES) in and `text_output` (BYTES) out, always.
//! - `sampling_parameters` (BYTES), Triton's vLLM backend: the request's
//!   max_tokens, temperature, top_p, stop, seed and n as one JSON string.
//! - Otherwise, individual inputs where the model has them (Triton's
//!   TensorRT-LLM convention): `max_tokens`, `temperature`, `top_p`,
//!   `seed` or `random_seed`, `stop` or `stop_words`.
//! - `stream` (BOOL) when present; and, as the vLLM backend defines them,
//!   `exclude_input_in_output` set true, and `return_num_input_tokens`,
//!   `return_num_output_tokens` and `return_finish_reason` set true so that
//!   the outputs `num_input_tokens`, `num_output_tokens` (tokens in each
//!   response) and `finish_reason` carry the usage and the reason.

use bytes::Bytes;
use nereid_proto::inference::{ModelConfig, ModelInput};

use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::model_config::input_datatype;
use crate::request::InferRequest;
use crate::response::InferResponse;
use crate::tensor::{Tensor, bytes_elements, push_bytes_element};

pub const TEXT_INPUT: &str = "text_input";
pub const TEXT_OUTPUT: &str = "text_output";

/// The sampling an OpenAI request asks for.
#[derive(Debug, Default, Clone)]
pub struct Params {
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stop: Vec<String>,
    pub seed: Option<u64>,
    pub n: Option<u32>,
}

/// A model's inputs that carry an OpenAI request, found once per request
/// from its config (a handful of name comparisons).
#[derive(Debug)]
pub struct TextModel<'a> {
    config: &'a ModelConfig,
}

impl<'a> TextModel<'a> {
    /// `config`'s model as a text model, or why it is not one.
    pub fn of(config: &'a ModelConfig) -> std::result::Result<Self, String> {
        let bytes_input = config
            .input
            .iter()
            .any(|i| i.name == TEXT_INPUT && input_datatype(i) == Some(DataType::Bytes));
        let bytes_output = config
            .output
            .iter()
            .any(|o| o.name == TEXT_OUTPUT && DataType::from_config(o.data_type) == Some(DataType::Bytes));
        match bytes_input && bytes_output {
            true => Ok(TextModel { config }),
            false => Err(format!(
                "model '{}' is not a text model: it needs a BYTES input '{TEXT_INPUT}' and a BYTES output '{TEXT_OUTPUT}'",
                config.name
            )),
        }
    }

    fn input(&self, name: &str) -> Option<&'a ModelInput> {
        self.config.input.iter().find(|i| i.name == name)
    }

    /// Whether the model reports token counts (its `num_*_tokens` outputs).
    pub fn reports_tokens(&self) -> bool {
        ["num_input_tokens", "num_output_tokens"]
            .iter()
            .all(|name| self.config.output.iter().any(|o| o.name == *name))
    }

    /// The inference request for `prompt`.
    pub fn request(&self, id: String, prompt: &str, params: &Params, stream: bool) -> Result<InferRequest> {
        let mut inputs = vec![self.text(TEXT_INPUT, &[prompt])?];
        if self.input("sampling_parameters").is_some() {
            let mut sampling = serde_json::Map::new();
            if let Some(v) = params.max_tokens {
                sampling.insert("max_tokens".into(), v.into());
            }
            if let Some(v) = params.temperature {
                sampling.insert("temperature".into(), v.into());
            }
            if let Some(v) = params.top_p {
                sampling.insert("top_p".into(), v.into());
            }
            if !params.stop.is_empty() {
                sampling.insert("stop".into(), params.stop.clone().into());
            }
            if let Some(v) = params.seed {
                sampling.insert("seed".into(), v.into());
            }
            if let Some(v) = params.n {
                sampling.insert("n".into(), v.into());
            }
            let json = serde_json::Value::Object(sampling).to_string();
            inputs.push(self.text("sampling_parameters", &[&json])?);
        } else {
            let numbers = [
                ("max_tokens", params.max_tokens.map(|n| Number::Int(n.into()))),
                ("temperature", params.temperature.map(Number::Float)),
                ("top_p", params.top_p.map(Number::Float)),
            ];
            for (name, value) in numbers {
                if let (Some(value), Some(_)) = (value, self.input(name)) {
                    inputs.push(self.number(name, value)?);
                }
            }
            let seed_input = ["seed", "random_seed"].into_iter().find(|n| self.input(n).is_some());
            if let (Some(seed), Some(name)) = (params.seed, seed_input) {
                inputs.push(self.number(name, Number::Int(seed))?);
            }
            let stop_input = ["stop", "stop_words"].into_iter().find(|n| self.input(n).is_some());
            if let (false, Some(name)) = (params.stop.is_empty(), stop_input) {
                let words: Vec<&str> = params.stop.iter().map(String::as_str).collect();
                inputs.push(self.text(name, &words)?);
            }
        }
        if self.input("stream").is_some() {
            inputs.push(self.number("stream", Number::Int(stream.into()))?);
        }
        for flag in [
            "exclude_input_in_output",
            "return_num_input_tokens",
            "return_num_output_tokens",
            "return_finish_reason",
        ] {
            if self.input(flag).is_some() {
                inputs.push(self.number(flag, Number::Int(1))?);
            }
        }
        Ok(InferRequest {
            model_name: self.config.name.clone(),
            id,
            inputs,
            ..InferRequest::default()
        })
    }

    /// The shape `input` takes for `count` values: behind a batch of one
    /// when the model batches, its first variable dim taking them.
    fn shape(&self, input: &ModelInput, count: usize) -> Result<Vec<i64>> {
        let mut shape = Vec::with_capacity(input.dims.len() + 1);
        if self.config.max_batch_size > 0 {
            shape.push(1);
        }
        let mut filled = count == 1;
        for d in &input.dims {
            shape.push(match *d {
                d if d >= 0 => d,
                _ if !filled => {
                    filled = true;
                    count as i64
                }
                _ => 1,
            });
        }
        if shape.iter().product::<i64>() != count as i64 {
            return Err(Error::invalid(format!(
                "input '{}' of model '{}' cannot hold {count} value(s): its dims are {:?}",
                input.name, self.config.name, input.dims
            )));
        }
        Ok(shape)
    }

    /// A BYTES input of `values`.
    fn text(&self, name: &str, values: &[&str]) -> Result<Tensor> {
        let input = self
            .input(name)
            .ok_or_else(|| Error::internal(format!("no input '{name}'")))?;
        if input_datatype(input) != Some(DataType::Bytes) {
            return Err(Error::invalid(format!(
                "input '{name}' of model '{}' must be BYTES to take text",
                self.config.name
            )));
        }
        let mut data = Vec::new();
        for value in values {
            push_bytes_element(&mut data, value.as_bytes())?;
        }
        let shape = self.shape(input, values.len())?;
        Ok(Tensor::new(name, DataType::Bytes, shape, Bytes::from(data)))
    }

    /// A one-value input of whatever numeric type the model declares (a
    /// value out of its range saturates).
    fn number(&self, name: &str, value: Number) -> Result<Tensor> {
        let input = self
            .input(name)
            .ok_or_else(|| Error::internal(format!("no input '{name}'")))?;
        let datatype =
            input_datatype(input).ok_or_else(|| Error::internal(format!("input '{name}' has no datatype")))?;
        let (int, float) = match value {
            Number::Int(n) => (n, n as f64),
            Number::Float(f) => (f as u64, f),
        };
        let data: Vec<u8> = match datatype {
            DataType::Bool => vec![u8::from(float != 0.0)],
            DataType::Uint8 => vec![int.min(u8::MAX.into()) as u8],
            DataType::Int8 => (int.min(i8::MAX as u64) as i8).to_le_bytes().to_vec(),
            DataType::Uint16 => (int.min(u16::MAX.into()) as u16).to_le_bytes().to_vec(),
            DataType::Int16 => (int.min(i16::MAX as u64) as i16).to_le_bytes().to_vec(),
            DataType::Uint32 => (int.min(u32::MAX.into()) as u32).to_le_bytes().to_vec(),
            DataType::Int32 => (int.min(i32::MAX as u64) as i32).to_le_bytes().to_vec(),
            DataType::Uint64 => int.to_le_bytes().to_vec(),
            DataType::Int64 => (int.min(i64::MAX as u64) as i64).to_le_bytes().to_vec(),
            DataType::Fp32 => (float as f32).to_le_bytes().to_vec(),
            DataType::Fp64 => float.to_le_bytes().to_vec(),
            other => {
                return Err(Error::invalid(format!(
                    "input '{name}' of model '{}' is {other:?}, which cannot take a number",
                    self.config.name
                )));
            }
        };
        let shape = self.shape(input, 1)?;
        Ok(Tensor::new(name, datatype, shape, Bytes::from(data)))
    }
}

/// A value for a numeric input: counts and seeds exact, sampling floats.
#[derive(Debug, Clone, Copy)]
enum Number {
    Int(u64),
    Float(f64),
}

/// What one response of a text model says.
#[derive(Debug, Default)]
pub struct Piece {
    pub text: String,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub finish_reason: Option<String>,
}

impl Piece {
    /// Reads `response`'s text and, when the model sent them, its token
    /// counts and finish reason.
    pub fn of(response: &InferResponse) -> Result<Piece> {
        let mut piece = Piece::default();
        for tensor in &response.outputs {
            match tensor.name.as_str() {
                TEXT_OUTPUT => {
                    for element in bytes_elements(&tensor.data) {
                        piece.text.push_str(&String::from_utf8_lossy(element?));
                    }
                }
                "num_input_tokens" => piece.input_tokens = first_integer(tensor),
                "num_output_tokens" => piece.output_tokens = first_integer(tensor),
                "finish_reason" => {
                    if let Some(element) = bytes_elements(&tensor.data).next() {
                        let reason = String::from_utf8_lossy(element?).into_owned();
                        piece.finish_reason = (!reason.is_empty() && reason != "None").then_some(reason);
                    }
                }
                _ => {}
            }
        }
        Ok(piece)
    }
}

/// A tensor's first element as a count.
fn first_integer(tensor: &Tensor) -> Option<u64> {
    let bytes = &tensor.data;
    let take = |n: usize| bytes.get(..n);
    Some(match tensor.datatype {
        DataType::Uint32 => u32::from_le_bytes(take(4)?.try_into().ok()?).into(),
        DataType::Int32 => u64::try_from(i32::from_le_bytes(take(4)?.try_into().ok()?)).ok()?,
        DataType::Uint64 => u64::from_le_bytes(take(8)?.try_into().ok()?),
        DataType::Int64 => u64::try_from(i64::from_le_bytes(take(8)?.try_into().ok()?)).ok()?,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_config::text::parse;

    fn config(inputs: &str) -> ModelConfig {
        parse(&format!(
            r#"name: "llm" max_batch_size: 0
               input [ {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }}{inputs} ]
               output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }} ]"#
        ))
        .unwrap()
    }

    fn values(request: &InferRequest, name: &str) -> Vec<u8> {
        request.inputs.iter().find(|t| t.name == name).unwrap().data.to_vec()
    }

    #[test]
    fn vllm_models_get_one_sampling_json_and_trt_llm_models_their_inputs() {
        let params = Params {
            max_tokens: Some(5),
            temperature: Some(0.5),
            stop: vec!["\n".into()],
            seed: Some(7),
            ..Params::default()
        };
        let vllm = config(
            r#", { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] },
               { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true },
               { name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true }"#,
        );
        let request = TextModel::of(&vllm)
            .unwrap()
            .request("r".into(), "hi", &params, true)
            .unwrap();
        let names: Vec<&str> = request.inputs.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            ["text_input", "sampling_parameters", "stream", "exclude_input_in_output"]
        );
        let json = values(&request, "sampling_parameters");
        let sampling: serde_json::Value = serde_json::from_slice(&json[4..]).unwrap();
        assert_eq!(
            sampling,
            serde_json::json!({"max_tokens": 5, "temperature": 0.5, "stop": ["\n"], "seed": 7})
        );
        assert_eq!(values(&request, "stream"), [1]);

        let trt = config(
            r#", { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
               { name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
               { name: "random_seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true },
               { name: "stop_words" data_type: TYPE_STRING dims: [ -1 ] optional: true }"#,
        );
        let request = TextModel::of(&trt)
            .unwrap()
            .request("r".into(), "hi", &params, false)
            .unwrap();
        assert_eq!(values(&request, "max_tokens"), 5i32.to_le_bytes());
        assert_eq!(values(&request, "temperature"), 0.5f32.to_le_bytes());
        assert_eq!(values(&request, "random_seed"), 7u64.to_le_bytes());
        assert_eq!(values(&request, "stop_words"), [1, 0, 0, 0, b'\n']);
        assert!(request.inputs.iter().all(|t| t.name != "top_p"));
    }

    #[test]
    fn a_model_without_text_tensors_is_not_a_text_model() {
        let config = parse(
            r#"name: "m" input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
               output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]"#,
        )
        .unwrap();
        assert!(TextModel::of(&config).unwrap_err().contains("BYTES input 'text_input'"));
    }
}

//! What the model expects: fetched from the server, refined by flags.
//!
//! perf_analyzer's convention: the server's model metadata gives every
//! input's name, datatype and shape; a variable (`-1`) first dimension
//! becomes the batch size and any other `-1` becomes 1, unless `--shape`
//! gives the input's shape outright. Flags alone suffice when the server
//! has no metadata endpoint.

use nereid_proto::inference::ModelMetadataRequest;
use serde::Deserialize;

use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::flags::{DatatypeFlag, ShapeFlag};
use crate::grpc_client;
use crate::http_client::HttpConnection;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TensorMeta {
    pub name: String,
    pub datatype: String,
    #[serde(default)]
    pub shape: Vec<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ModelMeta {
    #[serde(default)]
    pub inputs: Vec<TensorMeta>,
    #[serde(default)]
    pub outputs: Vec<TensorMeta>,
}

/// An input's resolved signature: everything but the data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputSpec {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
}

/// GET /v2/models/{model}[/versions/{version}].
pub async fn fetch_http(url: &str, model: &str, version: &str) -> Result<ModelMeta> {
    let mut conn = HttpConnection::connect(url).await?;
    let path = if version.is_empty() {
        format!("/v2/models/{model}")
    } else {
        format!("/v2/models/{model}/versions/{version}")
    };
    let body = conn.get(&path).await?;
    serde_json::from_slice(&body).map_err(|e| Error::Protocol(format!("model metadata is not KServe v2 JSON: {e}")))
}

/// gRPC ModelMetadata.
pub async fn fetch_grpc(url: &str, model: &str, version: &str) -> Result<ModelMeta> {
    let mut client = grpc_client::connect(url).await?;
    let response = client
        .model_metadata(ModelMetadataRequest {
            name: model.to_string(),
            version: version.to_string(),
        })
        .await
        .map_err(|s| grpc_client::status_error(&s))?
        .into_inner();
    let convert = |t: Vec<nereid_proto::inference::model_metadata_response::TensorMetadata>| {
        t.into_iter()
            .map(|t| TensorMeta {
                name: t.name,
                datatype: t.datatype,
                shape: t.shape,
            })
            .collect()
    };
    Ok(ModelMeta {
        inputs: convert(response.inputs),
        outputs: convert(response.outputs),
    })
}

/// The concrete shape for a metadata shape: first `-1` → `batch`, others → 1.
pub fn concrete_shape(shape: &[i64], batch: i64) -> Vec<i64> {
    shape
        .iter()
        .enumerate()
        .map(|(i, &d)| match (i, d) {
            (0, -1) => batch,
            (_, -1) => 1,
            (_, d) => d,
        })
        .collect()
}

/// Combines metadata (when there is some) with `--shape` / `--datatype`.
pub fn resolve_inputs(
    meta: Option<&ModelMeta>,
    shapes: &[ShapeFlag],
    datatypes: &[DatatypeFlag],
    batch: i64,
) -> Result<Vec<InputSpec>> {
    let shape_of = |name: &str| shapes.iter().find(|s| s.name == name).map(|s| s.dims.clone());
    let datatype_of = |name: &str| datatypes.iter().find(|d| d.name == name).map(|d| d.datatype);
    let Some(meta) = meta else {
        if shapes.is_empty() {
            return Err(Error::Invalid(
                "no model metadata: give every input with --shape and --datatype".into(),
            ));
        }
        return shapes
            .iter()
            .map(|s| {
                let datatype = datatype_of(&s.name).ok_or_else(|| {
                    Error::Invalid(format!("no model metadata: --datatype {}:TYPE is needed", s.name))
                })?;
                Ok(InputSpec {
                    name: s.name.clone(),
                    datatype,
                    shape: s.dims.clone(),
                })
            })
            .collect();
    };
    let known = |name: &str| meta.inputs.iter().any(|t| t.name == name);
    if let Some(name) = shapes
        .iter()
        .map(|s| &s.name)
        .chain(datatypes.iter().map(|d| &d.name))
        .find(|n| !known(n))
    {
        return Err(Error::Invalid(format!("the model has no input '{name}'")));
    }
    if meta.inputs.is_empty() {
        return Err(Error::Invalid("the model's metadata lists no inputs".into()));
    }
    meta.inputs
        .iter()
        .map(|t| {
            let datatype = match datatype_of(&t.name) {
                Some(d) => d,
                None => t
                    .datatype
                    .parse()
                    .map_err(|e: String| Error::Invalid(format!("input '{}': {e}", t.name)))?,
            };
            Ok(InputSpec {
                name: t.name.clone(),
                datatype,
                shape: shape_of(&t.name).unwrap_or_else(|| concrete_shape(&t.shape, batch)),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ModelMeta {
        ModelMeta {
            inputs: vec![
                TensorMeta {
                    name: "INPUT0".into(),
                    datatype: "FP32".into(),
                    shape: vec![-1, 16],
                },
                TensorMeta {
                    name: "MASK".into(),
                    datatype: "BOOL".into(),
                    shape: vec![-1, -1],
                },
            ],
            outputs: vec![],
        }
    }

    #[test]
    fn variable_dims_become_batch_then_one() {
        assert_eq!(concrete_shape(&[-1, 16], 8), vec![8, 16]);
        assert_eq!(concrete_shape(&[-1, -1, 3], 4), vec![4, 1, 3]);
        assert_eq!(concrete_shape(&[2, -1], 4), vec![2, 1]);
        assert_eq!(concrete_shape(&[], 4), Vec::<i64>::new());
    }

    #[test]
    fn metadata_with_flag_overrides() {
        let shapes = [ShapeFlag {
            name: "MASK".into(),
            dims: vec![4, 7],
        }];
        let dts = [DatatypeFlag {
            name: "INPUT0".into(),
            datatype: DataType::Fp16,
        }];
        let specs = resolve_inputs(Some(&meta()), &shapes, &dts, 4).unwrap();
        assert_eq!(specs[0].shape, vec![4, 16]);
        assert_eq!(specs[0].datatype, DataType::Fp16);
        assert_eq!(specs[1].shape, vec![4, 7]);
        assert_eq!(specs[1].datatype, DataType::Bool);
    }

    #[test]
    fn unknown_names_are_errors() {
        let shapes = [ShapeFlag {
            name: "NOPE".into(),
            dims: vec![1],
        }];
        assert!(resolve_inputs(Some(&meta()), &shapes, &[], 1).is_err());
    }

    #[test]
    fn flags_alone_need_shape_and_datatype() {
        let shapes = [ShapeFlag {
            name: "X".into(),
            dims: vec![1, 4],
        }];
        assert!(resolve_inputs(None, &shapes, &[], 1).is_err());
        assert!(resolve_inputs(None, &[], &[], 1).is_err());
        let dts = [DatatypeFlag {
            name: "X".into(),
            datatype: DataType::Int64,
        }];
        let specs = resolve_inputs(None, &shapes, &dts, 1).unwrap();
        assert_eq!(specs[0].datatype, DataType::Int64);
        assert_eq!(specs[0].shape, vec![1, 4]);
    }

    #[test]
    fn parses_kserve_metadata_json() {
        let m: ModelMeta = serde_json::from_str(
            r#"{"name":"m","versions":["1"],"platform":"onnxruntime_onnx",
               "inputs":[{"name":"INPUT0","datatype":"FP32","shape":[-1,16]}],
               "outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[-1,16]}]}"#,
        )
        .unwrap();
        assert_eq!(m.inputs[0].shape, vec![-1, 16]);
        assert_eq!(m.outputs[0].name, "OUTPUT0");
    }
}

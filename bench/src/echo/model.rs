//! The model nereid-echo pretends to serve: input signatures from
//! `--input`, output i named `--output-name` #i (default `OUTPUTi`), each
//! output the same datatype and shape as its input.

use serde_json::json;

use crate::datatype::DataType;
use crate::flags::TensorFlag;

#[derive(Debug, Clone)]
pub struct EchoModel {
    pub inputs: Vec<TensorFlag>,
    output_names: Vec<String>,
}

/// The version the echo model reports.
pub const VERSION: &str = "1";

impl EchoModel {
    /// With no `--input`, one `INPUT0:FP32:-1,16`.
    pub fn new(inputs: Vec<TensorFlag>, output_names: Vec<String>) -> Self {
        let inputs = if inputs.is_empty() {
            vec![TensorFlag {
                name: "INPUT0".into(),
                datatype: DataType::Fp32,
                dims: vec![-1, 16],
            }]
        } else {
            inputs
        };
        EchoModel { inputs, output_names }
    }

    /// The name of the output that echoes input `i`.
    pub fn output_name(&self, i: usize) -> String {
        self.output_names
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("OUTPUT{i}"))
    }

    /// KServe v2 model metadata, for any model name asked about.
    pub fn metadata_json(&self, name: &str) -> serde_json::Value {
        let tensor =
            |name: String, t: &TensorFlag| json!({"name": name, "datatype": t.datatype.as_wire(), "shape": t.dims});
        json!({
            "name": name,
            "versions": [VERSION],
            "platform": "nereid_echo",
            "inputs": self.inputs.iter().map(|t| tensor(t.name.clone(), t)).collect::<Vec<_>>(),
            "outputs": self.inputs.iter().enumerate().map(|(i, t)| tensor(self.output_name(i), t)).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::parse_tensor_flag;

    #[test]
    fn output_names_and_metadata() {
        let m = EchoModel::new(
            vec![
                parse_tensor_flag("A:INT32:-1,4").unwrap(),
                parse_tensor_flag("B:BYTES:1").unwrap(),
            ],
            vec!["Y".into()],
        );
        assert_eq!(m.output_name(0), "Y");
        assert_eq!(m.output_name(1), "OUTPUT1");
        let meta = m.metadata_json("m");
        assert_eq!(meta["inputs"][0]["shape"], json!([-1, 4]));
        assert_eq!(meta["outputs"][1]["name"], "OUTPUT1");
        assert_eq!(meta["outputs"][1]["datatype"], "BYTES");
        let d = EchoModel::new(vec![], vec![]);
        assert_eq!(d.metadata_json("x")["outputs"][0]["name"], "OUTPUT0");
    }
}

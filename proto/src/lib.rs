//! Protocol types for Nereid, generated at build time from the `.proto`
//! files in this crate (compiled with `protox`; no `protoc` is needed).
//!
//! Layout:
//!
//! | Rust path | proto package | source file |
//! | --- | --- | --- |
//! | [`inference`] | `inference` | `inference/grpc_service.proto`, `inference/model_config.proto` |
//! | [`inference::grpc_inference_service_server`] | service `inference.GRPCInferenceService` (server) | `inference/grpc_service.proto` |
//! | [`inference::grpc_inference_service_client`] | service `inference.GRPCInferenceService` (client) | `inference/grpc_service.proto` |
//! | [`health::v1`] | `grpc.health.v1` | `grpc/health/v1/health.proto` |
//! | [`health::v1::health_server`], [`health::v1::health_client`] | service `grpc.health.v1.Health` | `grpc/health/v1/health.proto` |
//! | [`keda`], [`keda::external_scaler_server`], [`keda::external_scaler_client`] | `externalscaler` (KEDA's External Scaler) | `keda/externalscaler.proto` |
//! | [`FILE_DESCRIPTOR_SET`], [`descriptor_pool`] | all of the above, for `prost-reflect` | |
//! | [`frame`] | gRPC's length-prefixed message framing, for the paths that go around tonic | |
//! | [`contract`] | headers, exit statuses and metric families one Nereid process relies on another for | |
//! | [`ensemble_dag`] | an ensemble's steps as a graph of tensors, checked once for the CRD, the operator and the server | |
//! | [`codec`], [`footprint`] | the services' codec: a message's decoded size, read from its wire bytes, admitted before it is decoded | |
//!
//! The services and [`codec`] come with the `grpc` feature (tonic); without
//! it the crate is the messages alone.
//!
//! The `inference` package matches Triton Inference Server's gRPC protocol
//! and model configuration on the wire (names, field numbers and types), so
//! Triton's clients work against Nereid, and `config.pbtxt` files can be
//! parsed through [`descriptor_pool`] into [`inference::ModelConfig`].

use std::sync::LazyLock;

use prost_reflect::DescriptorPool;

#[cfg(feature = "grpc")]
pub mod codec;
pub mod contract;
pub mod datatype;
pub mod ensemble_dag;
pub mod footprint;
pub mod frame;

/// Triton / KServe v2 inference protocol and Triton's model configuration
/// (proto package `inference`).
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs, rustdoc::all)]
pub mod inference {
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

// Wire contracts used before `contract` existed, kept at the root for their users.
pub use contract::{NOT_SERVING_HEADER, QUEUE_DEPTH_HEADER};

/// KEDA's External Scaler protocol (proto package `externalscaler`), which
/// the operator serves for ScaledObjects with an `external` trigger.
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs, rustdoc::all)]
pub mod keda {
    include!(concat!(env!("OUT_DIR"), "/externalscaler.rs"));
}

/// The standard gRPC health checking protocol (proto package
/// `grpc.health.v1`).
pub mod health {
    /// Version 1 of the health protocol.
    #[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs, rustdoc::all)]
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
    }
}

/// Encoded `google.protobuf.FileDescriptorSet` of every file in this crate
/// (imports included), as produced by the build script.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));

static DESCRIPTOR_POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(FILE_DESCRIPTOR_SET)
        .expect("the descriptor set was produced by protox in build.rs and is always valid")
});

/// A `prost-reflect` pool holding every message, enum and service of this
/// crate, e.g. `inference.ModelConfig`, decoded once on first use.
pub fn descriptor_pool() -> &'static DescriptorPool {
    &DESCRIPTOR_POOL
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use prost_reflect::DynamicMessage;

    use super::descriptor_pool;
    use super::inference::{DataType, ModelConfig, ModelInferRequest};

    #[test]
    fn pool_holds_triton_and_health_descriptors() {
        let pool = descriptor_pool();
        assert!(pool.get_message_by_name("inference.ModelConfig").is_some());
        assert!(pool.get_message_by_name("inference.ModelInferRequest").is_some());
        assert!(pool.get_message_by_name("grpc.health.v1.HealthCheckRequest").is_some());

        let service = pool
            .get_service_by_name("inference.GRPCInferenceService")
            .expect("GRPCInferenceService is in the pool");
        let stream = service
            .methods()
            .find(|m| m.name() == "ModelStreamInfer")
            .expect("ModelStreamInfer is a method");
        assert!(stream.is_client_streaming() && stream.is_server_streaming());
        assert_eq!(service.methods().count(), 20);

        let health = pool
            .get_service_by_name("grpc.health.v1.Health")
            .expect("Health is in the pool");
        assert_eq!(health.methods().count(), 2);

        // The Triton files keep their upstream descriptor names.
        assert!(pool.get_file_by_name("grpc_service.proto").is_some());
        assert!(pool.get_file_by_name("model_config.proto").is_some());
        assert!(pool.get_file_by_name("grpc/health/v1/health.proto").is_some());
    }

    #[test]
    fn field_numbers_match_triton() {
        let pool = descriptor_pool();
        let cases = [
            ("inference.ModelConfig", "name", 1),
            ("inference.ModelConfig", "backend", 17),
            ("inference.ModelConfig", "runtime", 25),
            ("inference.ModelConfig", "dynamic_batching", 11),
            ("inference.ModelConfig", "sequence_batching", 13),
            ("inference.ModelConfig", "ensemble_scheduling", 15),
            ("inference.ModelConfig", "response_cache", 24),
            ("inference.ModelConfig", "model_metrics", 26),
            ("inference.ModelInstanceGroup", "kind", 4),
            ("inference.ModelInstanceGroup", "host_policy", 9),
            ("inference.ModelOutput", "label_filename", 4),
            ("inference.ModelOutput", "reshape", 5),
            ("inference.ModelInferRequest", "raw_input_contents", 7),
            ("inference.ModelInferResponse", "raw_output_contents", 6),
            ("inference.ModelStatistics", "response_stats", 9),
        ];
        for (message, field, number) in cases {
            let desc = pool
                .get_message_by_name(message)
                .unwrap_or_else(|| panic!("{message} is in the pool"));
            let got = desc
                .get_field_by_name(field)
                .unwrap_or_else(|| panic!("{message}.{field} exists"))
                .number();
            assert_eq!(got, number, "{message}.{field}");
        }
        assert_eq!(DataType::TypeBf16 as i32, 14);
        assert_eq!(DataType::TypeString as i32, 13);
    }

    #[test]
    fn infer_request_encodes_model_name_as_field_one() {
        let request = ModelInferRequest {
            model_name: "m".to_owned(),
            ..Default::default()
        };
        // Tag 0x0a = field 1, wire type 2 (length-delimited); then length 1.
        assert_eq!(request.encode_to_vec(), [0x0a, 0x01, b'm']);

        let request = ModelInferRequest {
            raw_input_contents: vec![vec![1, 2].into()],
            ..Default::default()
        };
        // Field 7, wire type 2.
        assert_eq!(request.encode_to_vec(), [0x3a, 0x02, 1, 2]);
    }

    #[test]
    fn pbtxt_parses_into_model_config() {
        let desc = descriptor_pool()
            .get_message_by_name("inference.ModelConfig")
            .expect("ModelConfig is in the pool");
        let text = r#"
            name: "x"
            max_batch_size: 8
            input: [{ name: "INPUT0" data_type: TYPE_INT32 dims: [16] }]
            dynamic_batching { max_queue_delay_microseconds: 100 }
            parameters { key: "k" value { string_value: "v" } }
        "#;
        let dynamic = DynamicMessage::parse_text_format(desc, text).expect("valid pbtxt");
        let config: ModelConfig = dynamic.transcode_to().expect("same schema");

        assert_eq!(config.name, "x");
        assert_eq!(config.max_batch_size, 8);
        assert_eq!(config.input.len(), 1);
        assert_eq!(config.input[0].name, "INPUT0");
        assert_eq!(config.input[0].data_type(), DataType::TypeInt32);
        assert_eq!(config.input[0].dims, [16]);
        assert_eq!(config.parameters["k"].string_value, "v");
        match config.scheduling_choice {
            Some(super::inference::model_config::SchedulingChoice::DynamicBatching(db)) => {
                assert_eq!(db.max_queue_delay_microseconds, 100);
            }
            other => panic!("expected dynamic batching, got {other:?}"),
        }
    }
}

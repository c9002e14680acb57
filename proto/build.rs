//! Compiles the `.proto` files with `protox` (pure Rust; no `protoc`), writes
//! the descriptor set to `OUT_DIR/file_descriptor_set.bin` for
//! `prost-reflect`, and generates messages, servers and clients with
//! `tonic-prost-build`.

use std::env;
use std::error::Error;
use std::fs;
use std::path::PathBuf;

use prost::Message as _;

fn main() -> Result<(), Box<dyn Error>> {
    // Paths relative to the package root; cargo watches directories recursively.
    println!("cargo:rerun-if-changed=inference");
    println!("cargo:rerun-if-changed=grpc");
    println!("cargo:rerun-if-changed=keda");

    // `inference/` is searched first so the Triton files keep their upstream
    // descriptor names, `grpc_service.proto` and `model_config.proto` (and
    // `import "model_config.proto"` resolves as it does upstream); the health
    // file is `grpc/health/v1/health.proto`, under the package root.
    let files = [
        "inference/grpc_service.proto",
        "inference/model_config.proto",
        "grpc/health/v1/health.proto",
        "keda/externalscaler.proto",
    ];
    let includes = ["inference", "."];

    let fds = protox::compile(files, includes)?;

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out_dir.join("file_descriptor_set.bin"), fds.encode_to_vec())?;

    // Tensor payloads as `bytes::Bytes`, so the server can hand slices of the
    // received message to the core without copying them.
    // Every message knows its protobuf name (`prost::Name`), so the codec
    // can look its schema up and bound its decoded size before decoding it
    // (src/codec.rs).
    // Services only with the `grpc` feature: without it the crate is the
    // messages alone, free of tonic.
    let services = env::var_os("CARGO_FEATURE_GRPC").is_some();
    let mut config = tonic_prost_build::Config::new();
    config.enable_type_names();
    tonic_prost_build::configure()
        .codec_path("crate::codec::BoundedCodec")
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .build_server(services)
        .build_client(services)
        .compile_fds_with_config(fds, config)?;

    Ok(())
}

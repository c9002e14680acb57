#![no_main]

include!("harness.rs");

fuzz_binary!(grpc_infer_request);

#![no_main]

include!("harness.rs");

fuzz_binary!(grpc_stream_messages);

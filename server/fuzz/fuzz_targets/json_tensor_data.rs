#![no_main]

include!("harness.rs");

fuzz_binary!(json_tensor_data);

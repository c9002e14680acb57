#![no_main]

include!("harness.rs");

fuzz_binary!(http_infer_body);

#![no_main]

include!("harness.rs");

fuzz_binary!(gateway_request);

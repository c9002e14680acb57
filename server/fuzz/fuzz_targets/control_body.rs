#![no_main]

include!("harness.rs");

fuzz_binary!(control_body);

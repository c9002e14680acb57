#![no_main]

include!("harness.rs");

fuzz_binary!(generate_body);

#![no_main]

include!("harness.rs");

fuzz_binary!(config_json);

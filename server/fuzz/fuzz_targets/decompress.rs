#![no_main]

include!("harness.rs");

fuzz_binary!(decompress);

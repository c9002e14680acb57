#![no_main]

#[path = "../../tests/fuzz_targets/mod.rs"]
mod targets;

#[global_allocator]
static ALLOCATOR: targets::CountingAllocator = targets::CountingAllocator;

libfuzzer_sys::fuzz_target!(
    init: { targets::warm_up() },
    |data: &[u8]| targets::run(targets::bytes_elements, data, targets::extra_allowance("bytes_elements"))
);

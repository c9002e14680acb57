// Included by every fuzz binary: cargo-fuzz wants one binary per target,
// and each is the same but for the target it runs.

/// A fuzz binary for `targets::$target`: the shared targets module, its
/// counting allocator (the memory property needs it), the one-time warm-up,
/// and the target's run under the properties.
macro_rules! fuzz_binary {
    ($target:ident) => {
        #[path = "../../tests/fuzz_targets/mod.rs"]
        mod targets;

        #[global_allocator]
        static ALLOCATOR: targets::CountingAllocator = targets::CountingAllocator;

        libfuzzer_sys::fuzz_target!(
            init: { targets::warm_up() },
            |data: &[u8]| targets::run(targets::$target, data, targets::extra_allowance(stringify!($target)))
        );
    };
}

//! The fuzz targets on every `cargo test`: the committed corpus seeds
//! (`fuzz/seeds`, starting points; `fuzz/regressions`, inputs that once found
//! a bug) replayed exactly, then a bounded random walk of mutations from
//! them. The coverage-guided runs are `server/fuzz` (docs/fuzzing.md).
//!
//! One test function, on purpose: the counting allocator's peak is global,
//! so inputs must run one at a time.

mod fuzz_targets;

use std::path::{Path, PathBuf};

use fuzz_targets::{CountingAllocator, TARGETS, extra_allowance, run, warm_up};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Mutated inputs tried per target on each run.
const WALK: usize = 3_000;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut inputs = Vec::new();
    for folder in ["seeds", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(folder).join(target)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let data = std::fs::read(&path).unwrap();
            inputs.push((path, data));
        }
    }
    inputs.sort();
    inputs
}

/// xorshift64*: a deterministic walk, the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One of libFuzzer's simple mutations: flip, insert, delete, copy a slice,
/// or write an interesting value.
fn mutate(rng: &mut Rng, input: &mut Vec<u8>) {
    const INTERESTING: [&[u8]; 8] = [
        b"-1",
        b"1e999",
        b"18446744073709551615",
        b"[[[[",
        b"\"\\u0000\"",
        b"null",
        &[0xff, 0xff, 0xff, 0x7f],
        &[0],
    ];
    match rng.below(5) {
        0 if !input.is_empty() => {
            let at = rng.below(input.len());
            input[at] ^= 1 << rng.below(8);
        }
        1 => {
            let at = rng.below(input.len() + 1);
            input.insert(at, rng.next() as u8);
        }
        2 if !input.is_empty() => {
            let at = rng.below(input.len());
            let len = rng.below(input.len() - at).min(16) + 1;
            input.drain(at..(at + len).min(input.len()));
        }
        3 if !input.is_empty() => {
            let from = rng.below(input.len());
            let len = rng.below(input.len() - from).min(64) + 1;
            let piece: Vec<u8> = input[from..(from + len).min(input.len())].to_vec();
            let at = rng.below(input.len() + 1);
            input.splice(at..at, piece);
        }
        _ => {
            let value = INTERESTING[rng.below(INTERESTING.len())];
            let at = rng.below(input.len() + 1);
            input.splice(at..at, value.iter().copied());
        }
    }
}

#[test]
fn every_decoder_keeps_its_properties_on_the_corpus_and_a_random_walk() {
    warm_up();
    for (name, target) in TARGETS {
        let seeds = corpus(name);
        assert!(!seeds.is_empty(), "no seeds for fuzz target '{name}'");
        let extra = extra_allowance(name);
        for (path, data) in &seeds {
            let outcome = std::panic::catch_unwind(|| run(target, data, extra));
            assert!(outcome.is_ok(), "{name}: {} broke a property", path.display());
        }
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ name.len() as u64);
        for step in 0..WALK {
            let mut input = seeds[step % seeds.len()].1.clone();
            for _ in 0..=rng.below(4) {
                mutate(&mut rng, &mut input);
            }
            let outcome = std::panic::catch_unwind(|| run(target, &input, extra));
            assert!(
                outcome.is_ok(),
                "{name}: a mutated input broke a property; add it to fuzz/regressions/{name}/: {input:?}"
            );
        }
    }
}

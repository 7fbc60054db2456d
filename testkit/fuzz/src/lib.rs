//! Hostile-input testing shared by Weft's crates (a dev-dependency only; not published):
//! a deterministic mutator and a loop that runs a fuzz target for a time budget
//! (`WEFT_FUZZ_SECS`, default 1 s; `ci/fuzz.sh` gives each target more) and prints how
//! many inputs it tried. It depends on nothing, so any crate's unit tests (the shared-memory
//! layer's under loom too) can use it.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

/// A small deterministic generator (xorshift64*): the same seed, the same inputs.
#[derive(Debug, Clone)]
pub struct Mutator {
    state: u64,
}

impl Mutator {
    /// A generator seeded with `seed` (any value).
    pub fn new(seed: u64) -> Mutator {
        Mutator {
            state: (seed ^ 0x9e37_79b9_7f4a_7c15) | 1,
        }
    }

    /// The next pseudo-random number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// A mutated copy of `input`: 1 to 4 of byte flips, interesting bytes, insertions,
    /// deletions, duplicated runs, truncation, and length-prefix rewrites.
    pub fn mutate(&mut self, input: &[u8]) -> Vec<u8> {
        const INTERESTING: [u8; 8] = [0, 1, 0x7f, 0x80, 0xfe, 0xff, 0x40, 0x20];
        let mut v = input.to_vec();
        for _ in 0..1 + self.below(4) {
            let at = self.below(v.len().max(1));
            match self.below(8) {
                0 if !v.is_empty() => v[at] ^= 1 << self.below(8),
                1 if !v.is_empty() => v[at] = INTERESTING[self.below(INTERESTING.len())],
                2 => v.insert(at.min(v.len()), self.next_u64() as u8),
                3 if !v.is_empty() => {
                    let n = 1 + self.below(8).min(v.len() - at - 1);
                    v.drain(at..at + n);
                }
                4 if !v.is_empty() => {
                    let n = 1 + self.below(16).min(v.len() - at - 1);
                    let run: Vec<u8> = v[at..at + n].to_vec();
                    let to = self.below(v.len());
                    v.splice(to..to, run);
                }
                5 => v.truncate(at),
                6 if v.len() >= 4 => {
                    // A length prefix that lies (or tells the truth about a new length).
                    let len = match self.below(3) {
                        0 => (v.len() - 4) as u32,
                        1 => self.next_u64() as u32,
                        _ => (v.len() as u32)
                            .wrapping_sub(4)
                            .wrapping_add(self.below(9) as u32)
                            .wrapping_sub(4),
                    };
                    v[..4].copy_from_slice(&len.to_le_bytes());
                }
                _ => {
                    let n = self.below(8);
                    for _ in 0..n {
                        v.push(self.next_u64() as u8);
                    }
                }
            }
        }
        v
    }
}

impl Mutator {
    /// Corrupts `bytes[..within]` (a mapped segment) in 1 to `most` places: a flipped bit,
    /// a random byte, or an aligned 8-byte word set to 0, 1, all ones, 2^32, a random
    /// value, or its old value plus 8 (an offset that points one record on).
    pub fn corrupt(&mut self, bytes: &mut [u8], within: usize, most: usize) {
        let within = within.min(bytes.len());
        if within < 8 {
            return;
        }
        for _ in 0..1 + self.below(most) {
            let at = self.below(within);
            match self.below(3) {
                0 => bytes[at] ^= 1 << self.below(8),
                1 => bytes[at] = self.next_u64() as u8,
                _ => {
                    let at = (at & !7).min(within - 8);
                    let old = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
                    let v = [
                        0,
                        1,
                        u64::MAX,
                        1 << 32,
                        self.next_u64(),
                        old.wrapping_add(8),
                    ][self.below(6)];
                    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

/// How long each fuzz target runs (`WEFT_FUZZ_SECS`, default 1 s).
pub fn budget() -> Duration {
    let secs = std::env::var("WEFT_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(secs.max(0.01))
}

/// Runs `one` on generated inputs until the budget is spent (at least 16 times), with the
/// seed `WEFT_FUZZ_SEED` or `seed`; prints and returns the number of executions.
pub fn run(target: &str, seed: u64, mut one: impl FnMut(&mut Mutator)) -> u64 {
    let seed = std::env::var("WEFT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seed);
    let mut m = Mutator::new(seed);
    let (t0, budget) = (Instant::now(), budget());
    let mut n = 0u64;
    while n < 16 || t0.elapsed() < budget {
        one(&mut m);
        n += 1;
    }
    println!(
        "fuzz {target}: {n} executions in {:.1} s (seed {seed})",
        t0.elapsed().as_secs_f64()
    );
    n
}

/// The saved inputs of a target: every file under `dir` (a crate's
/// `fuzz/corpus/<target>/`), replayed by each test run; none when it does not exist.
pub fn saved(dir: &std::path::Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut paths: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            if let Ok(b) = std::fs::read(&p) {
                out.push(b);
            }
        }
    }
    out
}

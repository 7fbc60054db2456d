//! Weft's benchmark programs, run as `weft bench NAME`.
//!
//! Each prints an OSU-style table, or one JSON object per line with `--json`.
//!
//! | name    | what it measures                                                        |
//! |---------|-------------------------------------------------------------------------|
//! | `fence` | put + commit + fence in Full, Sparse and SyncOnly modes; `get` latency  |

mod fence;
mod stats;

/// The benchmarks, with a one-line description each (for `weft bench --help`).
const BENCHES: &[(&str, &str)] = &[(
    "fence",
    "put + commit + fence (Full, Sparse, SyncOnly) and get latency",
)];

fn usage() -> String {
    let mut s = String::from(
        "usage: weft bench NAME [OPTIONS]   (weft bench NAME --help for the options)\n\nbenchmarks:\n",
    );
    for (name, what) in BENCHES {
        s.push_str(&format!("  {name:<8} {what}\n"));
    }
    s
}

/// Runs `weft bench ARGS...` and returns the exit status: `ARGS[0]` names the benchmark,
/// the rest are its options.
///
/// A benchmark started alone launches itself as a job of several processes by running
/// `std::env::current_exe()` with `bench NAME OPTIONS...` under Weft's launcher, so the
/// calling executable must be one that dispatches `bench` here (the `weft` command).
pub fn main(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        Some("fence") => fence::main(&args[1..]),
        None => {
            eprint!("{}", usage());
            2
        }
        Some("--help" | "-h" | "help") => {
            print!("{}", usage());
            0
        }
        Some(other) => {
            eprint!("weft bench: unknown benchmark {other:?}\n{}", usage());
            2
        }
    }
}

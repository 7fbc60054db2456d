//! `weft bench names`: the runtime's name service (`Client::publish`, `lookup`), timed
//! between the two processes of a job (issue 33's targets: a lookup of a name published
//! on the same node within 100 us, a waiting lookup answered within 1 ms of the publish).
//!
//! Started alone, the benchmark launches itself as a job of 2 processes (`--nodes 2`: one
//! per logical node, so rank 1's requests cross to the root server of node 0). Rank 0
//! publishes; rank 1 times:
//! - `lookup`: a lookup that does not wait, of a name published before (call to return);
//! - `publish`: rank 0's publish, call to return (timed by rank 0);
//! - `wait`: a lookup waiting for a name rank 0 publishes 2 ms later, from the publish
//!   call (its time, CLOCK_MONOTONIC, is the published value) to the lookup's return.

use std::time::{Duration, Instant};

use clap::Parser;
use weft_runtime::launcher;
use weft_wireup::{Client, FenceMode, LookupOptions, NameRange, NameValue, Persistence, Procs};

use crate::fence::{launch, Placement};
use crate::stats::{us, Summary};

/// Time the name service: lookups, publishes, and waiting lookups.
#[derive(Debug, Parser)]
#[command(name = "weft bench names")]
struct Args {
    /// Logical nodes (1: both processes on one node; 2: one on each).
    #[arg(long, value_name = "K", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=2))]
    nodes: u32,
    /// Timed operations of each kind.
    #[arg(long, value_name = "I", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Timed waiting lookups (each waits about 2 ms).
    #[arg(long, value_name = "W", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..))]
    waits: u32,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// How long rank 0 waits after the fence before it publishes a name rank 1 waits for
/// (long enough for the lookup to be waiting at the root first).
const PUBLISH_DELAY: Duration = Duration::from_millis(2);
/// A waiting lookup's limit (a lost publish fails the benchmark instead of hanging it).
const WAIT_LIMIT: Duration = Duration::from_secs(10);

/// Runs `weft bench names ARGS...`; returns the exit status.
pub(crate) fn main(args: &[String]) -> i32 {
    let argv = std::iter::once("weft bench names".to_owned()).chain(args.iter().cloned());
    let opts = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    if !weft_wireup::in_a_job() {
        return match launch("names", 2, opts.nodes, Placement::Node, args) {
            Ok(0) => 0,
            Ok(code) => {
                eprintln!("weft bench names: the benchmark job failed (exit status {code})");
                code
            }
            Err(e) => {
                eprintln!("weft bench names: {e}");
                launcher::EXIT_LAUNCH_FAILED
            }
        };
    }
    match run(&opts) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("weft bench names: {e}");
            1
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds (comparable between processes of one machine).
fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

fn fence(w: &Client) -> Result<(), String> {
    w.fence(Procs::All, FenceMode::SyncOnly, Some(WAIT_LIMIT))
        .map_err(|e| format!("fence: {e}"))
}

/// Publishes `key` = `value` for the session, until this process ends.
fn publish(w: &Client, key: &str, value: &[u8]) -> Result<(), String> {
    w.publish(&[(key, value)], NameRange::Session, Persistence::Proc)
        .map_err(|e| format!("publish {key}: {e}"))
}

fn run(opts: &Args) -> Result<(), String> {
    let w = Client::init().map_err(|e| format!("init: {e}"))?;
    if w.size() != 2 {
        return Err(format!("runs in a job of 2 processes, not {}", w.size()));
    }
    let me = w.rank();
    let tag = w.ns().0;
    // Lookups of a name published before, and publishes.
    let key = format!("bench-{tag}-fixed");
    if me == 0 {
        publish(&w, &key, b"v")?;
    }
    fence(&w)?;
    let mut lookups = Vec::new();
    let mut publishes = Vec::new();
    let at_once = LookupOptions::default();
    for i in 0..opts.iters + opts.iters / 10 {
        if me == 1 {
            let t0 = Instant::now();
            let got = w
                .lookup(&[&key], at_once)
                .map_err(|e| format!("lookup: {e}"))?;
            let t = t0.elapsed();
            if got.len() != 1 {
                return Err(format!("lookup of {key} gave {} names", got.len()));
            }
            if i >= opts.iters / 10 {
                lookups.push(us(t));
            }
        } else {
            let k = format!("bench-{tag}-p{i}");
            let t0 = Instant::now();
            publish(&w, &k, b"v")?;
            let t = t0.elapsed();
            if i >= opts.iters / 10 {
                publishes.push(us(t));
            }
        }
    }
    // Waiting lookups: rank 1 waits, rank 0 publishes a moment after the fence.
    let mut waits = Vec::new();
    let wait = LookupOptions {
        range: NameRange::Session,
        wait: Some(WAIT_LIMIT),
    };
    for i in 0..opts.waits + 2 {
        fence(&w)?;
        let k = format!("bench-{tag}-w{i}");
        if me == 0 {
            std::thread::sleep(PUBLISH_DELAY);
            publish(&w, &k, &now_ns().to_le_bytes())?;
        } else {
            let got = w
                .lookup(&[&k], wait)
                .map_err(|e| format!("lookup {k}: {e}"))?;
            let done = now_ns();
            let at = match got.first().map(|p| &p.value) {
                Some(NameValue::Bytes(b)) if b.len() == 8 => {
                    u64::from_le_bytes(b.as_slice().try_into().expect("8 bytes"))
                }
                other => return Err(format!("waiting lookup of {k} gave {other:?}")),
            };
            if i >= 2 {
                waits.push(done.saturating_sub(at) as f64 / 1e3);
            }
        }
    }
    // Rank 1 reports: it gets rank 0's publish times through a name.
    let times_key = format!("bench-{tag}-publish-times");
    if me == 0 {
        let bytes: Vec<u8> = publishes.iter().flat_map(|t| t.to_le_bytes()).collect();
        publish(&w, &times_key, &bytes)?;
    } else {
        let got = w
            .lookup(&[&times_key], wait)
            .map_err(|e| format!("lookup {times_key}: {e}"))?;
        if let Some(NameValue::Bytes(b)) = got.first().map(|p| &p.value) {
            publishes = b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
        }
        report(
            opts,
            &[("lookup", lookups), ("publish", publishes), ("wait", waits)],
        );
    }
    fence(&w)?;
    w.finalize().map_err(|e| format!("finalize: {e}"))
}

fn report(opts: &Args, rows: &[(&str, Vec<f64>)]) {
    let place = if opts.nodes == 1 {
        "same node"
    } else {
        "across nodes"
    };
    if !opts.json {
        println!("# OSU-style Weft Name Service Test");
        println!(
            "# 2 processes, {place}; {} lookups and publishes, {} waiting lookups",
            opts.iters, opts.waits
        );
        println!(
            "# {:<10} {:>12} {:>12} {:>12} {:>12}",
            "Operation", "Median(us)", "Min(us)", "P99(us)", "Max(us)"
        );
    }
    for (what, samples) in rows {
        let Some(s) = Summary::of_us(samples.clone()) else {
            continue;
        };
        if opts.json {
            println!(
                "{}",
                serde_json::json!({
                    "bench": "names", "impl": "weft", "what": what, "nodes": opts.nodes,
                    "median_us": s.median_us, "min_us": s.min_us, "p99_us": s.p99_us,
                    "max_us": s.max_us, "samples": s.samples,
                })
            );
        } else {
            println!(
                "{:<12} {:>12.1} {:>12.1} {:>12.1} {:>12.1}",
                what, s.median_us, s.min_us, s.p99_us, s.max_us
            );
        }
    }
}

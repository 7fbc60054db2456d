//! `weft bench coll`: OSU-style collective latency (osu_barrier, osu_bcast, osu_reduce,
//! osu_allreduce, osu_allgather, osu_alltoall): the average time per call over the
//! timed iterations, averaged over the ranks (with the slowest and fastest rank's).
//!
//! Started alone it launches itself as a job of two processes bound to two cores; under
//! `weft run -n N [--nodes M]` it measures that job. Sizes are bytes per rank's message
//! (allgather and alltoall: per block); reductions sum `f32`s, as OSU's do (sizes below
//! 4 bytes are skipped for them). JSON lines carry `bench` (the collective), `size`,
//! `procs`, `nodes`, `latency_us`, `min_us`, `max_us` and `iters`.

use std::time::Instant;

use clap::{CommandFactory, FromArgMatches, Parser};
use weft_collectives::{Collectives, Op};
use weft_fabric::{Communicator, Fabric};

use crate::limit::{self, Bind};
use crate::osu::{default_sizes, Metric, Report, Sweep, SweepArgs};

/// The collectives measured.
const ALL: &[&str] = &[
    "barrier",
    "bcast",
    "reduce",
    "allreduce",
    "allgather",
    "alltoall",
];

/// Options of `weft bench coll`.
#[derive(Debug, Parser)]
#[command(
    name = "weft bench coll",
    about = "OSU-style collective latency: barrier, bcast, reduce, allreduce, allgather, alltoall"
)]
struct Args {
    #[command(flatten)]
    sweep: SweepArgs,
    /// Collectives to measure, in order.
    #[arg(
        long = "bench",
        value_name = "NAME[,NAME...]",
        value_delimiter = ',',
        default_value = "barrier,bcast,reduce,allreduce,allgather,alltoall"
    )]
    benches: Vec<String>,
    /// Timed iterations per size [default: OSU's: 1000 up to 8 KiB, 100 above].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    iters: Option<u32>,
    /// Untimed iterations before them [default: OSU's: 200 up to 8 KiB, 10 above].
    #[arg(long, value_name = "N")]
    warmup: Option<u32>,
    /// Binding of the two processes when started alone (auto: core when the machine has
    /// two or more cores).
    #[arg(long, value_enum, default_value_t = Bind::Auto)]
    bind_to: Bind,
}

/// Runs `weft bench coll ARGS...`; returns the exit status.
pub(crate) fn main(args: &[String]) -> i32 {
    let argv = std::iter::once("coll".to_owned()).chain(args.iter().cloned());
    let opts = match Args::command()
        .try_get_matches_from(argv)
        .and_then(|m| Args::from_arg_matches(&m))
    {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    if let Some(bad) = opts.benches.iter().find(|b| !ALL.contains(&b.as_str())) {
        eprintln!("weft bench coll: unknown collective {bad:?} (expected some of {ALL:?})");
        return 2;
    }
    limit::run_or_launch("coll", opts.bind_to, args, || run_rank(&opts))
}

fn run_rank(opts: &Args) -> Result<(), String> {
    let fabric = Fabric::init().map_err(|e| e.to_string())?;
    let me = fabric.world().rank();
    let result = measure(opts, &fabric);
    let fin = fabric
        .finalize()
        .map_err(|e| format!("rank {me}: finalize: {e}"));
    result.map_err(|e| format!("rank {me}: {e}")).and(fin)
}

/// OSU's iteration counts for `size`.
fn reps(opts: &Args, size: usize) -> (u32, u32) {
    let large = size > 8192;
    (
        opts.iters.unwrap_or(if large { 100 } else { 1000 }),
        opts.warmup.unwrap_or(if large { 10 } else { 200 }),
    )
}

fn measure(opts: &Args, fabric: &Fabric) -> Result<(), String> {
    let world = fabric.world();
    let (me, n) = (world.rank(), world.size());
    let nodes = fabric.wire().job().num_nodes();
    for bench in &opts.benches {
        // A barrier has no size: one row, whatever --sizes says.
        let sweep = if bench == "barrier" {
            Sweep::new(&SweepArgs::default(), vec![0])
        } else {
            Sweep::new(&opts.sweep, default_sizes(1, 1 << 20))
        };
        let title = format!("{bench} latency (weft, {n} processes, {nodes} nodes)");
        let mut report = Report::new(&opts.sweep, &sweep, bench, &title, Metric::LATENCY)
            .field("procs", n)
            .field("nodes", nodes);
        if me != 0 {
            report = report.without_header();
        }
        for &size in sweep.sizes() {
            let reduction = matches!(bench.as_str(), "reduce" | "allreduce");
            if reduction && size < 4 {
                continue;
            }
            let (iters, warmup) = reps(opts, size);
            let per_call = time(bench, &world, size, iters, warmup)
                .map_err(|e| format!("{bench} {size}: {e}"))?;
            // Average, fastest and slowest rank (OSU prints the average).
            let mut sum = [per_call];
            world
                .allreduce_in_place(&mut sum, Op::Sum)
                .map_err(|e| e.to_string())?;
            let mut lo = [per_call];
            world
                .allreduce_in_place(&mut lo, Op::Min)
                .map_err(|e| e.to_string())?;
            let mut hi = [per_call];
            world
                .allreduce_in_place(&mut hi, Op::Max)
                .map_err(|e| e.to_string())?;
            if me == 0 {
                report
                    .row_with(
                        size,
                        sum[0] / f64::from(n),
                        &[
                            ("min_us", "Min (us)", lo[0]),
                            ("max_us", "Max (us)", hi[0]),
                            ("iters", "Iterations", f64::from(iters)),
                        ],
                    )
                    .map_err(|e| e.to_string())?;
            }
        }
        if me == 0 {
            report.finish().map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Average microseconds per call of `bench` at `size` bytes on this rank.
fn time(
    bench: &str,
    c: &Communicator,
    size: usize,
    iters: u32,
    warmup: u32,
) -> Result<f64, String> {
    let n = c.size() as usize;
    let e = |e: weft_collectives::CollError| e.to_string();
    let floats = size / 4;
    let mut a = vec![1u8; size.max(1) * n];
    let mut b = vec![0u8; size.max(1) * n];
    let fa = vec![1.0f32; floats];
    let mut fb = vec![0.0f32; floats];
    // Root 0, as OSU's bcast and reduce.
    let mut one = |c: &Communicator| -> Result<(), String> {
        match bench {
            "barrier" => c.barrier().map_err(e),
            "bcast" => c.bcast(&mut a[..size], 0).map_err(e),
            "reduce" => c.reduce(&fa, &mut fb, Op::Sum, 0).map_err(e),
            "allreduce" => c.allreduce(&fa, &mut fb, Op::Sum).map_err(e),
            "allgather" => c.allgather(&a[..size], &mut b[..size * n]).map_err(e),
            "alltoall" => c.alltoall(&a[..size * n], &mut b[..size * n]).map_err(e),
            other => Err(format!("unknown collective {other}")),
        }
    };
    for _ in 0..warmup {
        one(c)?;
    }
    c.barrier().map_err(e)?;
    let t = Instant::now();
    for _ in 0..iters {
        one(c)?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
    c.barrier().map_err(e)?;
    Ok(us)
}

//! `weft bench group`: the time of a group construct that assigns a PGCID, with and
//! without the members' data, and of creating a communicator from a session group
//! (`Communicator::create_from_group`, which runs such a construct), and the same from
//! the fabric (`comm_create_fabric`: `FabricGroup::create_comm`, the members agreeing
//! with one allreduce, no server).
//!
//! Started alone, the benchmark launches one job per (N, K) of `-n` and `--nodes`, each
//! of N processes on K logical nodes running `weft bench group --job` with the same
//! options; under `weft run` it measures the job it runs in and rank 0 prints the rows.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use clap::Parser;
use weft_collectives::FabricGroup;
use weft_fabric::{Communicator, ErrHandler, Info, Session};
use weft_runtime::launcher;
use weft_wireup::{Client, FenceMode, GroupDirectives, Procs, Scope};

use crate::fence::{check_layout, launch, Placement};
use crate::stats::{us, Summary};

/// Time limit of every collective (nothing hangs when a rank dies).
const TIMEOUT: Duration = Duration::from_secs(120);

/// Time group construct (with a PGCID) and communicator creation.
///
/// Each iteration aligns all ranks with an untimed SyncOnly fence, then rank 0 times the
/// operation; the group is destructed (or the communicator disconnected) untimed before
/// the next. Rows: `construct` (assign-context-id, no data), `construct+data`
/// (assign-context-id and every member's 64-byte card moved, as a Full fence would),
/// `comm_create` (Communicator::create_from_group over weft://world).
#[derive(Debug, Parser)]
#[command(name = "weft bench group")]
struct Args {
    /// Processes per job (one job per value and node count).
    #[arg(short = 'n', value_name = "N[,N...]", value_delimiter = ',',
          default_values_t = [2u32, 4, 8, 16, 32, 64])]
    procs: Vec<u32>,
    /// Logical nodes per job (one weft server each).
    #[arg(long, value_name = "K[,K...]", value_delimiter = ',', default_values_t = [1u32, 4])]
    nodes: Vec<u32>,
    /// Fill nodes in order (slot) or round robin (node).
    #[arg(long, value_enum, default_value_t = Placement::Slot)]
    map_by: Placement,
    /// Timed iterations per operation.
    #[arg(long, value_name = "I", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Untimed iterations before them.
    #[arg(long, value_name = "W", default_value_t = 5)]
    warmup: u32,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Measure the job this runs in (set when the benchmark launches itself).
    #[arg(long, hide = true)]
    job: bool,
}

/// Runs `weft bench group ARGS...`; returns the exit status.
pub(crate) fn main(args: &[String]) -> i32 {
    let argv = std::iter::once("weft bench group".to_owned()).chain(args.iter().cloned());
    let opts = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    if opts.job || weft_wireup::in_a_job() {
        return match run_rank(&opts) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("weft bench group: {e}");
                1
            }
        };
    }
    let mut jobs = Vec::new();
    for &k in &opts.nodes {
        for &n in &opts.procs {
            if n < 2 || k == 0 {
                eprintln!("weft bench group: -n {n} --nodes {k}: a group needs 2 or more processes on 1 or more nodes");
                return 2;
            }
            if check_layout(n, k, opts.map_by).is_ok() {
                jobs.push((n, k));
            }
        }
    }
    if jobs.is_empty() {
        eprintln!("weft bench group: no (N, K) of -n and --nodes puts a process on every node");
        return 2;
    }
    if !opts.json {
        println!("# weft bench group: rank 0's time per operation, µs (median of {} after {} warm-up; min, max)", opts.iters, opts.warmup);
        println!(
            "{:>6} {:>6}  {:<15} {:>10} {:>10} {:>10}",
            "procs", "nodes", "op", "median", "min", "max"
        );
    }
    for (n, k) in jobs {
        let mut child: Vec<String> = args.to_vec();
        child.push("--job".into());
        match launch("group", n, k, opts.map_by, &child) {
            Ok(0) => {}
            Ok(code) => {
                eprintln!(
                    "weft bench group: the job -n {n} --nodes {k} failed (exit status {code})"
                );
                return code;
            }
            Err(e) => {
                eprintln!("weft bench group: {e}");
                return launcher::EXIT_LAUNCH_FAILED;
            }
        }
    }
    0
}

/// One timed operation's rows.
struct Row {
    op: &'static str,
    time: Summary,
}

fn run_rank(opts: &Args) -> Result<(), String> {
    let session = Session::init(Info::new(), ErrHandler::Return).map_err(|e| e.to_string())?;
    let fabric = session.fabric().clone();
    let wire = fabric.wire();
    let me = wire.rank();
    let rows = measure(&session, opts).map_err(|e| format!("rank {me}: {e}"))?;
    session.finalize().map_err(|e| format!("rank {me}: {e}"))?;
    if me == 0 {
        print!("{}", report(wire, opts, &rows));
    }
    Ok(())
}

fn align(wire: &Client) -> Result<(), String> {
    wire.fence(Procs::All, FenceMode::SyncOnly, Some(TIMEOUT))
        .map_err(|e| format!("aligning fence: {e}"))
}

/// Times `op` on rank 0 over warm-up + iterations, running `undo` untimed after each.
fn time<T>(
    wire: &Client,
    opts: &Args,
    mut op: impl FnMut(u32) -> Result<T, String>,
    mut undo: impl FnMut(u32, T) -> Result<(), String>,
) -> Result<Summary, String> {
    let mut samples = Vec::new();
    for i in 0..opts.warmup + opts.iters {
        align(wire)?;
        let t = Instant::now();
        let made = op(i)?;
        let took = t.elapsed();
        if i >= opts.warmup {
            samples.push(us(took));
        }
        undo(i, made)?;
    }
    Summary::of_us(samples).ok_or_else(|| "no samples".into())
}

fn measure(session: &Session, opts: &Args) -> Result<Vec<Row>, String> {
    let wire = session.fabric().wire();
    let all: Vec<u32> = (0..wire.size()).collect();
    wire.put(Scope::Remote, "bench.group.card", vec![0x5au8; 64])
        .map_err(|e| e.to_string())?;
    wire.commit().map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    let ctx = GroupDirectives::default().assign_context_id();
    for (op, d) in [
        ("construct", ctx.clone().no_data()),
        ("construct+data", ctx),
    ] {
        let id = |i: u32| format!("bench.{op}.{i}");
        let t = time(
            wire,
            opts,
            |i| {
                wire.group_construct(&id(i), &all, &d, Some(TIMEOUT))
                    .map_err(|e| e.to_string())
            },
            |i, _| {
                wire.group_destruct(&id(i), Some(TIMEOUT))
                    .map_err(|e| e.to_string())
            },
        )?;
        rows.push(Row { op, time: t });
    }
    let world = session
        .group_from_pset("weft://world")
        .map_err(|e| e.to_string())?;
    let t = time(
        wire,
        opts,
        |_| {
            Communicator::create_from_group(&world, "bench.comm", ErrHandler::Return)
                .map_err(|e| e.to_string())
        },
        |_, c| c.disconnect().map_err(|e| e.to_string()),
    )?;
    rows.push(Row {
        op: "comm_create",
        time: t,
    });
    let t = time(
        wire,
        opts,
        |_| world.create_comm("bench.fabric").map_err(|e| e.to_string()),
        |_, c| c.disconnect().map_err(|e| e.to_string()),
    )?;
    rows.push(Row {
        op: "comm_create_fabric",
        time: t,
    });
    Ok(rows)
}

fn report(wire: &Client, opts: &Args, rows: &[Row]) -> String {
    let (n, k) = (wire.size(), wire.job().num_nodes());
    let mut out = String::new();
    for r in rows {
        if opts.json {
            let v = serde_json::json!({
                "bench": "group",
                "op": r.op,
                "procs": n,
                "nodes": k,
                "median_us": r.time.median_us,
                "min_us": r.time.min_us,
                "max_us": r.time.max_us,
                "samples": r.time.samples,
            });
            let _ = writeln!(out, "{v}");
        } else {
            let _ = writeln!(
                out,
                "{n:>6} {k:>6}  {:<15} {:>10.1} {:>10.1} {:>10.1}",
                r.op, r.time.median_us, r.time.min_us, r.time.max_us
            );
        }
    }
    out
}

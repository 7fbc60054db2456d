//! `weft bench spawn`: how long `Client::spawn` takes to start a job of N processes, and
//! how long until every process of it has initialized (connected to its server, job
//! information read).
//!
//! Started alone (no `WEFT_RANK`), the benchmark launches itself as a job of one process,
//! which spawns N copies of this executable (`weft bench spawn --child`) again and again;
//! each child writes a file named after its job and rank into a directory of the parent's
//! once its `Client::init` returned, and ends. The parent times each spawn from the call to
//! its return ("started": the processes were started, as `PMIx_Spawn` returns) and to the
//! last child's file ("initialized").

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use weft_runtime::launcher;
use weft_wireup::{Client, SpawnApp};

use crate::fence::{launch, Placement};
use crate::stats::{us, Summary};

/// The directory the children of one spawn write to (set by the parent).
const DIR_VAR: &str = "WEFT_BENCH_SPAWN_DIR";
/// How long the parent waits for a spawned job's processes to initialize.
const INIT_WAIT: Duration = Duration::from_secs(60);

/// Time `Client::spawn` of N processes: until it returns, and until every process of the
/// new job has initialized.
#[derive(Debug, Parser)]
#[command(name = "weft bench spawn")]
struct Args {
    /// Processes per spawn.
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    procs: u32,
    /// Timed spawns.
    #[arg(long, value_name = "I", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Untimed spawns before them.
    #[arg(long, value_name = "W", default_value_t = 2)]
    warmup: u32,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Run as a spawned process (internal).
    #[arg(long, hide = true)]
    child: bool,
}

/// Runs `weft bench spawn ARGS...`; returns the exit status.
pub(crate) fn main(args: &[String]) -> i32 {
    let argv = std::iter::once("weft bench spawn".to_owned()).chain(args.iter().cloned());
    let opts = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    let out = if opts.child {
        child()
    } else if weft_wireup::in_a_job() {
        parent(&opts)
    } else {
        return match launch("spawn", 1, 1, Placement::Slot, args) {
            Ok(0) => 0,
            Ok(code) => {
                eprintln!("weft bench spawn: the benchmark job failed (exit status {code})");
                code
            }
            Err(e) => {
                eprintln!("weft bench spawn: {e}");
                launcher::EXIT_LAUNCH_FAILED
            }
        };
    };
    match out {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("weft bench spawn: {e}");
            1
        }
    }
}

/// A spawned process: initializes, says so with a file, ends.
fn child() -> Result<(), String> {
    let w = Client::init().map_err(|e| format!("child init: {e}"))?;
    let dir = std::env::var(DIR_VAR).map_err(|_| format!("{DIR_VAR} is not set"))?;
    let mark = Path::new(&dir).join(format!("{}.{}", w.ns().0, w.rank()));
    std::fs::write(&mark, b"").map_err(|e| format!("{}: {e}", mark.display()))?;
    w.finalize().map_err(|e| format!("child finalize: {e}"))
}

/// One timed spawn: (until it returned, until every process initialized).
fn one_spawn(
    w: &Client,
    exe: &str,
    dir: &Path,
    procs: u32,
) -> Result<(Duration, Duration), String> {
    let app = SpawnApp {
        program: exe.to_owned(),
        args: vec!["bench".into(), "spawn".into(), "--child".into()],
        np: procs,
        env: vec![(DIR_VAR.into(), dir.display().to_string())],
        cwd: None,
    };
    let t0 = Instant::now();
    let job = w.spawn(&[app]).map_err(|e| e.to_string())?;
    let started = t0.elapsed();
    let prefix = format!("{}.", job.ns.0);
    let deadline = t0 + INIT_WAIT;
    loop {
        let n = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .count();
        if n == procs as usize {
            return Ok((started, t0.elapsed()));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} of {procs} processes of {} initialized within {INIT_WAIT:?}",
                n, job.nspace
            ));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// The parent: spawns, times, prints.
fn parent(opts: &Args) -> Result<(), String> {
    let w = Client::init().map_err(|e| format!("init: {e}"))?;
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot locate this executable: {e}"))?
        .display()
        .to_string();
    let dir = scratch_dir()?;
    let mut started = Vec::new();
    let mut inited = Vec::new();
    let result = (|| {
        for i in 0..opts.warmup + opts.iters {
            let (s, a) = one_spawn(&w, &exe, &dir, opts.procs)?;
            if i >= opts.warmup {
                started.push(us(s));
                inited.push(us(a));
            }
        }
        Ok::<(), String>(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    let rows = [
        ("started", Summary::of_us(started)),
        ("initialized", Summary::of_us(inited)),
    ];
    if opts.json {
        for (what, s) in rows {
            let s = s.expect("at least one sample");
            println!(
                "{}",
                serde_json::json!({
                    "bench": "spawn", "impl": "weft", "what": what, "procs": opts.procs,
                    "median_us": s.median_us, "min_us": s.min_us, "p99_us": s.p99_us,
                    "max_us": s.max_us, "samples": s.samples,
                })
            );
        }
    } else {
        println!("# OSU-style Weft Spawn Test");
        println!(
            "# Client::spawn of {} processes on this node, {} timed spawns after {} untimed",
            opts.procs, opts.iters, opts.warmup
        );
        println!(
            "# {:<12} {:>12} {:>12} {:>12} {:>12}",
            "Until", "Median(us)", "Min(us)", "P99(us)", "Max(us)"
        );
        for (what, s) in rows {
            let s = s.expect("at least one sample");
            println!(
                "{:<14} {:>12.1} {:>12.1} {:>12.1} {:>12.1}",
                what, s.median_us, s.min_us, s.p99_us, s.max_us
            );
        }
    }
    w.finalize().map_err(|e| format!("finalize: {e}"))
}

/// A fresh directory for the children's files.
fn scratch_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("weft-bench-spawn-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

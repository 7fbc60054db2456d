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
//!
//! With `--connect`, the parent's world spawns through `Communicator::spawn` (the children
//! call `Fabric::parent`): timed until the intercommunicator is there ("connected"), until a
//! round trip of 8 bytes with every child completed ("first round trip"), and until the
//! disconnect returned ("disconnected").
//!
//! It also reports what the runtime holds before the timed spawns (after the untimed ones)
//! and after them, once their processes are gone: the open descriptors and resident memory
//! of this node's server and of the launcher, and the runtime's shared-memory segments. A long
//! run (`--iters 500`) shows whether spawning leaks.

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
    /// Spawn through `Communicator::spawn` and time the intercommunicator too.
    #[arg(long)]
    connect: bool,
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
    let out = if opts.child && opts.connect {
        connect_child()
    } else if opts.child {
        child()
    } else if weft_wireup::in_a_job() && opts.connect {
        connect_parent(&opts)
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

/// What the runtime holds (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Held {
    server_fds: usize,
    server_rss_kib: u64,
    launcher_fds: usize,
    launcher_rss_kib: u64,
    segments: usize,
}

/// How long the runtime may take to release a finished spawn's processes and segments.
const SETTLE: Duration = Duration::from_secs(10);

fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn rss_kib_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The parent of process `pid` (the launcher, for a server of `weft run`).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state, then the parent's pid.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// What the runtime holds now, and how many processes this server still has as children
/// (the spawned ones not yet reaped).
fn held() -> Result<(Held, usize), String> {
    let server: u32 = std::env::var(weft_wireup::env::SERVER_PID)
        .ok()
        .and_then(|p| p.parse().ok())
        .ok_or("WEFT_SERVER_PID is not set")?;
    let launcher = parent_of(server).ok_or("the server's parent is unknown")?;
    // This runtime's segments: its jobs' names all start with the first job's namespace.
    let ns = std::env::var(weft_wireup::env::NSPACE).map_err(|_| "WEFT_NSPACE is not set")?;
    let segments = std::fs::read_dir("/dev/shm").map_or(0, |d| {
        d.flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&ns))
            .count()
    });
    let children = std::fs::read_dir("/proc").map_or(0, |d| {
        d.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&p| p != std::process::id() && parent_of(p) == Some(server))
            .count()
    });
    let h = Held {
        server_fds: fds_of(server),
        server_rss_kib: rss_kib_of(server),
        launcher_fds: fds_of(launcher),
        launcher_rss_kib: rss_kib_of(launcher),
        segments,
    };
    Ok((h, children))
}

/// What the runtime holds once the spawned processes are gone (waiting up to [`SETTLE`]
/// for them and for their segments to be released down to `before`'s).
fn settled(before: &Held) -> Result<Held, String> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let (h, children) = held()?;
        let quiet =
            children == 0 && h.segments <= before.segments && h.server_fds <= before.server_fds;
        if quiet || Instant::now() > deadline {
            return Ok(h);
        }
        std::thread::sleep(Duration::from_millis(20));
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
        for _ in 0..opts.warmup {
            one_spawn(&w, &exe, &dir, opts.procs)?;
        }
        let before = settled(&held()?.0)?;
        for _ in 0..opts.iters {
            let (s, a) = one_spawn(&w, &exe, &dir, opts.procs)?;
            started.push(us(s));
            inited.push(us(a));
        }
        Ok::<_, String>((before, settled(&before)?))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let (before, after) = result?;
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
        println!(
            "{}",
            serde_json::json!({
                "bench": "spawn", "impl": "weft", "what": "held", "procs": opts.procs,
                "spawns": opts.iters,
                "server_fds": [before.server_fds, after.server_fds],
                "server_rss_kib": [before.server_rss_kib, after.server_rss_kib],
                "launcher_fds": [before.launcher_fds, after.launcher_fds],
                "launcher_rss_kib": [before.launcher_rss_kib, after.launcher_rss_kib],
                "segments": [before.segments, after.segments],
            })
        );
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
        let pct = |a: u64, b: u64| (b as f64 - a as f64) * 100.0 / (a.max(1) as f64);
        println!(
            "# held before/after {} spawns: server {}/{} fds, {}/{} KiB ({:+.1}%); \
             launcher {}/{} fds, {}/{} KiB ({:+.1}%); segments {}/{}",
            opts.iters,
            before.server_fds,
            after.server_fds,
            before.server_rss_kib,
            after.server_rss_kib,
            pct(before.server_rss_kib, after.server_rss_kib),
            before.launcher_fds,
            after.launcher_fds,
            before.launcher_rss_kib,
            after.launcher_rss_kib,
            pct(before.launcher_rss_kib, after.launcher_rss_kib),
            before.segments,
            after.segments
        );
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

/// A process spawned with `--connect`: connects with its parents, answers parent 0's
/// 8 bytes, disconnects.
fn connect_child() -> Result<(), String> {
    use weft_fabric::{Fabric, Source, Tag};
    let f = Fabric::init().map_err(|e| format!("child init: {e}"))?;
    let ic = f
        .parent()
        .map_err(|e| format!("child parent: {e}"))?
        .ok_or("a --connect child without a parent")?;
    let mut x = [0u64];
    ic.recv(&mut x, Source::Rank(0), Tag(1))
        .map_err(|e| e.to_string())?;
    ic.send(&x, 0, Tag(2)).map_err(|e| e.to_string())?;
    ic.disconnect().map_err(|e| e.to_string())?;
    f.finalize().map_err(|e| format!("child finalize: {e}"))
}

/// One `Communicator::spawn` of `procs`: until connected, until the first round trip with
/// every child, until disconnected.
fn one_connect(
    world: &weft_fabric::Communicator,
    exe: &str,
    procs: u32,
) -> Result<[Duration; 3], String> {
    use weft_fabric::{Source, Tag};
    let app = SpawnApp {
        program: exe.to_owned(),
        args: vec![
            "bench".into(),
            "spawn".into(),
            "--child".into(),
            "--connect".into(),
        ],
        np: procs,
        env: Vec::new(),
        cwd: None,
    };
    let t0 = Instant::now();
    let ic = world.spawn(&[app], 0).map_err(|e| e.to_string())?;
    let connected = t0.elapsed();
    for c in 0..ic.remote_size() {
        ic.send(&[u64::from(c)], c, Tag(1))
            .map_err(|e| e.to_string())?;
    }
    for c in 0..ic.remote_size() {
        let mut x = [0u64];
        ic.recv(&mut x, Source::Rank(c), Tag(2))
            .map_err(|e| e.to_string())?;
        if x[0] != u64::from(c) {
            return Err(format!("child {c} answered {}", x[0]));
        }
    }
    let trip = t0.elapsed();
    ic.disconnect().map_err(|e| e.to_string())?;
    Ok([connected, trip, t0.elapsed()])
}

/// The parent with `--connect`: a job of one process whose world spawns and connects.
fn connect_parent(opts: &Args) -> Result<(), String> {
    let f = weft_fabric::Fabric::init().map_err(|e| format!("init: {e}"))?;
    let world = f.world();
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot locate this executable: {e}"))?
        .display()
        .to_string();
    for _ in 0..opts.warmup {
        one_connect(&world, &exe, opts.procs)?;
    }
    let mut times: [Vec<f64>; 3] = Default::default();
    for _ in 0..opts.iters {
        let t = one_connect(&world, &exe, opts.procs)?;
        for (v, d) in times.iter_mut().zip(t) {
            v.push(us(d));
        }
    }
    let [a, b, c] = times;
    let rows = [
        ("connected", Summary::of_us(a)),
        ("first round trip", Summary::of_us(b)),
        ("disconnected", Summary::of_us(c)),
    ];
    if !opts.json {
        println!("# OSU-style Weft Spawn Test (Communicator::spawn)");
        println!(
            "# {} processes on this node, {} timed spawns after {} untimed",
            opts.procs, opts.iters, opts.warmup
        );
        println!(
            "# {:<16} {:>12} {:>12} {:>12} {:>12}",
            "Until", "Median(us)", "Min(us)", "P99(us)", "Max(us)"
        );
    }
    for (what, s) in rows {
        let s = s.ok_or("no sample")?;
        if opts.json {
            println!(
                "{}",
                serde_json::json!({
                    "bench": "spawn", "impl": "weft-intercomm", "what": what,
                    "procs": opts.procs, "median_us": s.median_us, "min_us": s.min_us,
                    "p99_us": s.p99_us, "max_us": s.max_us, "samples": s.samples,
                })
            );
        } else {
            println!(
                "{:<18} {:>12.1} {:>12.1} {:>12.1} {:>12.1}",
                what, s.median_us, s.min_us, s.p99_us, s.max_us
            );
        }
    }
    f.finalize().map_err(|e| format!("finalize: {e}"))
}

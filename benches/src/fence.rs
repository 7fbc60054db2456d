//! `weft bench fence`: the cost of put + commit + fence in Full, Sparse and SyncOnly modes,
//! and of a `get` afterwards (on-node after a Full fence, a remote rank's card pulled after a
//! Sparse fence, the same card once cached).
//!
//! Started alone (no `WEFT_RANK` in the environment), the benchmark launches itself through
//! Weft's launcher: N processes on K logical nodes, each running `weft bench fence` with the
//! same options. Under `weft run` every rank takes part in the measurement and rank 0 prints
//! the results.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use weft_runtime::launcher::{self, AppContext, LaunchSpec, MapBy};
use weft_wireup::{Client, FenceMode, GetOpts, Procs, Rank, Scope};

use weft_collectives::Collectives;
use weft_fabric::{Communicator, Fabric};

use crate::stats::{us, Summary};

/// Key of the Remote card timed in the fences and pulled in the Sparse get test.
const CARD_KEY: &str = "bench.card";
/// Key of the Local card read in the on-node get test.
const LOCAL_KEY: &str = "bench.local";
/// Key of rank 0's Global card, which it reads itself when it is alone on its node.
const SELF_KEY: &str = "bench.self";
/// Time limit of every fence (nothing hangs when a rank dies).
const FENCE_TIMEOUT: Duration = Duration::from_secs(120);
/// Time limit of every get that may leave the node.
const GET_TIMEOUT: Duration = Duration::from_secs(30);
/// Timed batches of the on-node and cached get tests.
const BATCHES: usize = 1000;
/// Gets per timed batch.
const BATCH: usize = 100;
/// Samples of the remote (refresh) get test.
const REMOTE_SAMPLES: usize = 200;
/// Largest card `put` accepts.
const MAX_CARD: usize = 16 << 20;

/// Time put + commit + fence (Full, Sparse, SyncOnly) and get.
///
/// Started alone, launches itself as a job of N processes on K logical nodes; under
/// `weft run` it measures the job it runs in (then -n, --nodes and --map-by are ignored).
/// Each iteration aligns all ranks with an untimed SyncOnly fence, then times
/// put(Remote, key, C bytes that change every iteration) + commit + fence(all, MODE);
/// rank 0 reports the median, minimum and maximum of its times after the warmup. Then the
/// latency of a get: on-node after a Full fence, a remote rank's card after a Sparse fence
/// (pulled from the owning server every time with GetOpts::refresh()), and that card cached.
#[derive(Debug, Parser)]
#[command(name = "weft bench fence")]
struct Args {
    /// Processes to launch.
    #[arg(short = 'n', value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..))]
    procs: u32,
    /// Logical nodes (one weft server each).
    #[arg(long, value_name = "K", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    nodes: u32,
    /// Fill nodes in order (slot) or round robin (node).
    #[arg(long, value_enum, default_value_t = Placement::Slot)]
    map_by: Placement,
    /// Card sizes in bytes.
    #[arg(long, value_name = "BYTES[,BYTES...]", value_delimiter = ',',
          default_values_t = [64usize, 1024, 16384])]
    card: Vec<usize>,
    /// Fence modes to time.
    #[arg(long, value_enum, value_name = "MODE[,MODE...]", value_delimiter = ',',
          default_values_t = [Mode::Full, Mode::Sparse, Mode::Sync, Mode::Fabric])]
    modes: Vec<Mode>,
    /// Timed iterations per mode and card size.
    #[arg(long, value_name = "I", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Untimed iterations before them.
    #[arg(long, value_name = "W", default_value_t = 5)]
    warmup: u32,
    /// Print one JSON object per line instead of tables.
    #[arg(long)]
    json: bool,
}

/// The fence modes, as named on the command line and in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Every card reaches every node.
    Full,
    /// Synchronise only; cards are pulled on demand.
    Sparse,
    /// A barrier.
    Sync,
    /// The fabric's fence (`Collectives::fence` on the world): the cards committed since
    /// the last fence move with an allgather over shared memory and the network, not
    /// through the servers.
    Fabric,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Sparse => "sparse",
            Mode::Sync => "sync",
            Mode::Fabric => "fabric",
        }
    }
    /// The server fence's mode (`None`: the fabric's fence).
    fn fence_mode(self) -> Option<FenceMode> {
        match self {
            Mode::Full => Some(FenceMode::Full),
            Mode::Sparse => Some(FenceMode::Sparse),
            Mode::Sync => Some(FenceMode::SyncOnly),
            Mode::Fabric => None,
        }
    }
}

/// `--map-by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Placement {
    /// Fill a node before the next.
    Slot,
    /// Round robin over nodes.
    Node,
}

impl Placement {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Placement::Slot => "slot",
            Placement::Node => "node",
        }
    }
}

/// Runs `weft bench fence ARGS...` (the arguments after `fence`); returns the exit status.
pub(crate) fn main(args: &[String]) -> i32 {
    let argv = std::iter::once("weft bench fence".to_owned()).chain(args.iter().cloned());
    let opts = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    if let Err(e) = check_cards(&opts.card) {
        eprintln!("weft bench fence: {e}");
        return 2;
    }
    if weft_wireup::in_a_job() {
        return match run_rank(&opts) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("weft bench fence: {e}");
                1
            }
        };
    }
    if let Err(e) = check_layout(opts.procs, opts.nodes, opts.map_by) {
        eprintln!("weft bench fence: {e}");
        return 2;
    }
    match launch("fence", opts.procs, opts.nodes, opts.map_by, args) {
        Ok(0) => 0,
        Ok(code) => {
            eprintln!("weft bench fence: the benchmark job failed (exit status {code})");
            code
        }
        Err(e) => {
            eprintln!("weft bench fence: {e}");
            launcher::EXIT_LAUNCH_FAILED
        }
    }
}

fn check_cards(cards: &[usize]) -> Result<(), String> {
    if cards.is_empty() {
        return Err("--card names no size".into());
    }
    match cards.iter().find(|&&c| c == 0 || c > MAX_CARD) {
        Some(c) => Err(format!(
            "--card {c}: a card has 1 to {MAX_CARD} bytes (the largest value put accepts)"
        )),
        None => Ok(()),
    }
}

/// Nodes that receive at least one process (the launcher's placement).
fn nodes_used(procs: u32, nodes: u32, map_by: Placement) -> u32 {
    match map_by {
        Placement::Slot => procs.div_ceil(procs.div_ceil(nodes)),
        Placement::Node => procs.min(nodes),
    }
}

/// Refuses a layout that leaves a logical node without a process: it would time a
/// server that has nothing to contribute and report the job as K nodes.
pub(crate) fn check_layout(procs: u32, nodes: u32, map_by: Placement) -> Result<(), String> {
    let used = nodes_used(procs, nodes, map_by);
    if used < nodes {
        return Err(format!(
            "-n {procs} --nodes {nodes} --map-by {} leaves {} of the {nodes} logical nodes \
             without a process; use --nodes {used} or fewer",
            map_by.name(),
            nodes - used
        ));
    }
    Ok(())
}

/// Launches benchmark `bench` as a job of `procs` copies of this executable on `nodes`
/// logical nodes, each running `bench BENCH ARGS...`.
pub(crate) fn launch(
    bench: &str,
    procs: u32,
    nodes: u32,
    map_by: Placement,
    args: &[String],
) -> Result<i32, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot locate this executable to launch the job: {e}"))?;
    let mut child_args = vec!["bench".to_owned(), bench.to_owned()];
    child_args.extend(args.iter().cloned());
    let spec = LaunchSpec {
        apps: vec![AppContext {
            n: procs,
            pset: None,
            program: exe.display().to_string(),
            args: child_args,
        }],
        nodes,
        map_by: match map_by {
            Placement::Slot => MapBy::Slot,
            Placement::Node => MapBy::Node,
        },
        ..LaunchSpec::default()
    };
    launcher::run(spec).map_err(|e| e.to_string())
}

/// One row of the fence table.
#[derive(Debug)]
struct FenceRow {
    mode: Mode,
    card: usize,
    time: Summary,
}

/// The on-node get test of one card size.
#[derive(Debug)]
struct LocalGet {
    card: usize,
    target: Rank,
    time: Summary,
}

/// The first plain get of a remote card after a Sparse fence.
#[derive(Debug)]
struct FirstGet {
    us: f64,
    /// The node did not hold the owner's data before: the get pulled it.
    pulled: bool,
    /// The value is the one committed before the fence.
    fresh: bool,
    /// Length of the value returned.
    got_len: Option<usize>,
}

/// The remote get tests of one card size.
#[derive(Debug)]
struct RemoteGet {
    card: usize,
    target: Rank,
    target_node: u32,
    first: FirstGet,
    refresh: Summary,
    cached: Summary,
}

/// Everything rank 0 prints.
#[derive(Debug)]
struct Report {
    procs: u32,
    nodes: u32,
    per_node: Vec<usize>,
    iters: u32,
    warmup: u32,
    fences: Vec<FenceRow>,
    local: Vec<LocalGet>,
    remote: Vec<RemoteGet>,
}

/// A card of `len` bytes, different for every (rank, seq).
fn card(rank: Rank, seq: u64, len: usize) -> Vec<u8> {
    let mut v = vec![(seq as u8) ^ (rank as u8) ^ 0x5a; len];
    let mut head = [0u8; 12];
    head[..8].copy_from_slice(&seq.to_le_bytes());
    head[8..].copy_from_slice(&rank.to_le_bytes());
    let n = head.len().min(len);
    v[..n].copy_from_slice(&head[..n]);
    v
}

fn run_rank(opts: &Args) -> Result<(), String> {
    // The fabric (for its fence) only when asked: its start-up exchanges cards too.
    let report = if opts.modes.contains(&Mode::Fabric) {
        let fabric = Fabric::init().map_err(|e| format!("fabric init: {e}"))?;
        let me = fabric.wire().rank();
        let world = fabric.world();
        let report =
            measure(fabric.wire(), Some(&world), opts).map_err(|e| format!("rank {me}: {e}"))?;
        drop(world);
        fabric
            .finalize()
            .map_err(|e| format!("rank {me}: finalize: {e}"))?;
        report
    } else {
        let wire = Client::init().map_err(|e| format!("init: {e}"))?;
        let me = wire.rank();
        let report = measure(&wire, None, opts).map_err(|e| format!("rank {me}: {e}"))?;
        wire.finalize()
            .map_err(|e| format!("rank {me}: finalize: {e}"))?;
        report
    };
    if let Some(r) = report {
        let text = if opts.json {
            json_lines(&r)
        } else {
            tables(&r)
        };
        print!("{text}");
    }
    Ok(())
}

fn fence(wire: &Client, mode: FenceMode, what: impl FnOnce() -> String) -> Result<(), String> {
    wire.fence(Procs::All, mode, Some(FENCE_TIMEOUT))
        .map_err(|e| format!("{}: {e}", what()))
}

/// Runs every test (the fabric's fence on `world`); returns the report on rank 0.
fn measure(
    wire: &Client,
    world: Option<&Communicator>,
    opts: &Args,
) -> Result<Option<Report>, String> {
    let me = wire.rank();
    let job = wire.job();
    let nodes = job.num_nodes();
    let node0 = job.node_of(0).ok_or("the job has no rank 0")?;
    let remote: Vec<Rank> = (0..wire.size())
        .filter(|&r| job.node_of(r) != Some(node0))
        .collect();
    let mut report = Report {
        procs: wire.size(),
        nodes,
        per_node: (0..nodes).map(|n| job.ranks_on(n).len()).collect(),
        iters: opts.iters,
        warmup: opts.warmup,
        fences: Vec::new(),
        local: Vec::new(),
        remote: Vec::new(),
    };
    let mut seq = 0u64;

    // Remote gets first, before any Full fence has carried cards between nodes, so that
    // the first plain get of each target finds nothing on the node and pulls the card.
    if !remote.is_empty() {
        for (i, &c) in opts.card.iter().enumerate() {
            seq += 1;
            let what = || format!("remote get test ({c} B)");
            wire.put(Scope::Remote, CARD_KEY, card(me, seq, c))
                .map_err(|e| format!("{}: put: {e}", what()))?;
            wire.commit()
                .map_err(|e| format!("{}: commit: {e}", what()))?;
            fence(wire, FenceMode::Sparse, || {
                format!("{}: Sparse fence", what())
            })?;
            if me == 0 {
                let target = remote[i % remote.len()];
                let r =
                    remote_gets(wire, target, seq, c).map_err(|e| format!("{}: {e}", what()))?;
                report.remote.push(r);
            }
            fence(wire, FenceMode::SyncOnly, || {
                format!("{}: SyncOnly fence", what())
            })?;
        }
    }

    for &mode in &opts.modes {
        for &c in &opts.card {
            let mut samples = Vec::with_capacity(opts.iters as usize);
            for it in 0..opts.warmup + opts.iters {
                let what = || format!("{} fence, {c} B, iteration {it}", mode.name());
                fence(wire, FenceMode::SyncOnly, || {
                    format!("{}: aligning SyncOnly fence", what())
                })?;
                seq += 1;
                let value = card(me, seq, c);
                let t0 = Instant::now();
                wire.put(Scope::Remote, CARD_KEY, value)
                    .map_err(|e| format!("{}: put: {e}", what()))?;
                wire.commit()
                    .map_err(|e| format!("{}: commit: {e}", what()))?;
                match (mode.fence_mode(), world) {
                    (Some(m), _) => wire
                        .fence(Procs::All, m, Some(FENCE_TIMEOUT))
                        .map_err(|e| format!("{}: {e}", what()))?,
                    (None, Some(w)) => w.fence().map_err(|e| format!("{}: {e}", what()))?,
                    (None, None) => return Err(format!("{}: no fabric", what())),
                }
                let dt = t0.elapsed();
                if it >= opts.warmup {
                    samples.push(dt);
                }
            }
            if let Some(time) = Summary::of_durations(&samples, 1) {
                report.fences.push(FenceRow {
                    mode,
                    card: c,
                    time,
                });
            }
        }
    }

    // On-node gets after a Full fence: rank 0 reads the Local card of a peer on its node,
    // or its own Global card when it is alone there.
    let target = wire
        .local_peers()
        .iter()
        .copied()
        .find(|&r| r != me)
        .map(|r| (r, LOCAL_KEY))
        .unwrap_or((me, SELF_KEY));
    for &c in &opts.card {
        seq += 1;
        let what = || format!("local get test ({c} B)");
        wire.put(Scope::Local, LOCAL_KEY, card(me, seq, c))
            .map_err(|e| format!("{}: put: {e}", what()))?;
        if me == 0 && target.1 == SELF_KEY {
            wire.put(Scope::Global, SELF_KEY, card(me, seq, c))
                .map_err(|e| format!("{}: put: {e}", what()))?;
        }
        wire.commit()
            .map_err(|e| format!("{}: commit: {e}", what()))?;
        fence(wire, FenceMode::Full, || format!("{}: Full fence", what()))?;
        if me == 0 {
            let expect = card(target.0, seq, c);
            let time = batched_gets(wire, target.0, target.1, &expect)
                .map_err(|e| format!("{}: {e}", what()))?;
            report.local.push(LocalGet {
                card: c,
                target: target.0,
                time,
            });
        }
        fence(wire, FenceMode::SyncOnly, || {
            format!("{}: SyncOnly fence", what())
        })?;
    }
    Ok((me == 0).then_some(report))
}

/// Times `BATCHES` batches of `BATCH` plain gets of `key` of `rank` (after checking the
/// value once); returns the time per get.
fn batched_gets(wire: &Client, rank: Rank, key: &str, expect: &[u8]) -> Result<Summary, String> {
    let opts = GetOpts::default().timeout(GET_TIMEOUT);
    let v = wire
        .get(rank, key, opts)
        .map_err(|e| format!("get {key} of rank {rank}: {e}"))?;
    if v.as_bytes() != Some(expect) {
        return Err(format!(
            "get {key} of rank {rank} returned a wrong value ({} bytes, expected {})",
            v.as_bytes().map_or(0, <[u8]>::len),
            expect.len()
        ));
    }
    let mut samples = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let t0 = Instant::now();
        for _ in 0..BATCH {
            let v = wire
                .get(black_box(rank), black_box(key), opts)
                .map_err(|e| format!("get {key} of rank {rank}: {e}"))?;
            black_box(v);
        }
        samples.push(t0.elapsed());
    }
    Summary::of_durations(&samples, BATCH).ok_or_else(|| "no samples".into())
}

/// Rank 0's gets of `target`'s Remote card after a Sparse fence: the first plain get,
/// `REMOTE_SAMPLES` gets with refresh (each one pulled from the owning server), then
/// plain gets of the now cached card.
fn remote_gets(wire: &Client, target: Rank, seq: u64, c: usize) -> Result<RemoteGet, String> {
    let expect = card(target, seq, c);
    let target_node = wire.job().node_of(target).unwrap_or(u32::MAX);
    let opts = GetOpts::default().timeout(GET_TIMEOUT);
    let err = |e: weft_wireup::GetError| format!("get {CARD_KEY} of rank {target}: {e}");
    // What the node already holds of the target (no message to the server).
    let held = wire
        .get(target, CARD_KEY, GetOpts::default().local_only())
        .is_ok();
    let t0 = Instant::now();
    let v = wire.get(target, CARD_KEY, opts).map_err(err)?;
    let first_us = us(t0.elapsed());
    let got = v.as_bytes();
    let fresh = got == Some(expect.as_slice());
    if !fresh && !held {
        return Err(format!(
            "the first get of rank {target}'s card pulled a wrong value ({} bytes, expected {c})",
            got.map_or(0, <[u8]>::len)
        ));
    }
    let first = FirstGet {
        us: first_us,
        pulled: !held,
        fresh,
        got_len: got.map(<[u8]>::len),
    };
    let ropts = opts.refresh();
    let mut samples = Vec::with_capacity(REMOTE_SAMPLES);
    for _ in 0..REMOTE_SAMPLES {
        let t0 = Instant::now();
        let v = wire.get(black_box(target), CARD_KEY, ropts).map_err(err)?;
        samples.push(t0.elapsed());
        if v.as_bytes() != Some(expect.as_slice()) {
            return Err(format!(
                "a refreshed get of rank {target}'s card returned a wrong value"
            ));
        }
    }
    let refresh = Summary::of_durations(&samples, 1).ok_or("no samples")?;
    let cached = batched_gets(wire, target, CARD_KEY, &expect)?;
    Ok(RemoteGet {
        card: c,
        target,
        target_node,
        first,
        refresh,
        cached,
    })
}

fn per_node_text(per_node: &[usize]) -> String {
    match per_node.first() {
        Some(&f) if per_node.iter().all(|&n| n == f) => format!("{f} per node"),
        _ => {
            let v: Vec<String> = per_node.iter().map(usize::to_string).collect();
            format!("{} per node", v.join(","))
        }
    }
}

fn row(out: &mut String, label: &str, mode: &str, card: usize, t: &Summary) {
    let _ = writeln!(
        out,
        "{label:<14}{mode:<8}{card:>12}{:>14.3}{:>14.3}{:>14.3}",
        t.median_us, t.min_us, t.max_us
    );
}

/// The OSU-style tables.
fn tables(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# Weft fence benchmark");
    let _ = writeln!(
        o,
        "# procs {}, nodes {} ({}), iters {} after {} warmup",
        r.procs,
        r.nodes,
        per_node_text(&r.per_node),
        r.iters,
        r.warmup
    );
    let _ = writeln!(
        o,
        "# rank 0's time of put(Remote, card) + commit + fence(all, mode), \
         each after an untimed SyncOnly fence"
    );
    let _ = writeln!(
        o,
        "# {:<12}{:>12}{:>14}{:>14}{:>14}",
        "mode", "card_bytes", "median_us", "min_us", "max_us"
    );
    for f in &r.fences {
        let _ = writeln!(
            o,
            "{:<14}{:>12}{:>14.3}{:>14.3}{:>14.3}",
            f.mode.name(),
            f.card,
            f.time.median_us,
            f.time.min_us,
            f.time.max_us
        );
    }
    let _ = writeln!(o, "#");
    let _ = writeln!(o, "# Weft get latency (rank 0, per get)");
    if let Some(l) = r.local.first() {
        let whose = if l.target == 0 {
            "its own Global card (alone on its node)".to_owned()
        } else {
            format!("rank {}'s Local card (same node)", l.target)
        };
        let _ = writeln!(
            o,
            "# local: {whose} after a Full fence; {BATCHES} batches of {BATCH} gets"
        );
    }
    if r.remote.is_empty() {
        let _ = writeln!(
            o,
            "# remote_first, cached: not measured (one node, no remote rank)"
        );
    } else {
        let _ = writeln!(
            o,
            "# remote_first: a remote rank's card after a Sparse fence, with GetOpts::refresh() \
             so that every get pulls it from the owning node's server; {REMOTE_SAMPLES} gets"
        );
        let _ = writeln!(
            o,
            "# cached: plain gets of that card afterwards (node datastore); \
             {BATCHES} batches of {BATCH} gets"
        );
    }
    let _ = writeln!(
        o,
        "# {:<12}{:<8}{:>12}{:>14}{:>14}{:>14}",
        "kind", "mode", "card_bytes", "median_us", "min_us", "max_us"
    );
    for l in &r.local {
        row(&mut o, "local", "full", l.card, &l.time);
    }
    for g in &r.remote {
        row(&mut o, "remote_first", "sparse", g.card, &g.refresh);
    }
    for g in &r.remote {
        row(&mut o, "cached", "sparse", g.card, &g.cached);
    }
    if !r.remote.is_empty() {
        let _ = writeln!(o, "# first plain get after the Sparse fence (one sample):");
        for g in &r.remote {
            let how = match (g.first.pulled, g.first.fresh) {
                (true, _) => format!("pulled from node {}", g.target_node),
                (false, true) => "served from this node's datastore".to_owned(),
                (false, false) => format!(
                    "served from this node's datastore, STALE: it returned the earlier \
                     {}-byte card (the node already held this rank's data; only a refresh \
                     get sees the new commit)",
                    g.first.got_len.unwrap_or(0)
                ),
            };
            let _ = writeln!(
                o,
                "#   card_bytes {:>6}: {:>10.3} us, rank {}: {how}",
                g.card, g.first.us, g.target
            );
        }
    }
    o
}

fn json_get(
    o: &mut String,
    r: &Report,
    kind: &str,
    mode: &str,
    card: usize,
    t: &Summary,
    extra: &str,
) {
    let _ = writeln!(
        o,
        "{{\"bench\":\"get\",\"kind\":\"{kind}\",\"mode\":\"{mode}\",\"procs\":{},\"nodes\":{},\
         \"card_bytes\":{card},\"median_us\":{:.3},\"min_us\":{:.3},\"max_us\":{:.3},\
         \"samples\":{}{extra}}}",
        r.procs, r.nodes, t.median_us, t.min_us, t.max_us, t.samples
    );
}

/// One JSON object per line.
fn json_lines(r: &Report) -> String {
    let mut o = String::new();
    for f in &r.fences {
        let _ = writeln!(
            o,
            "{{\"bench\":\"fence\",\"mode\":\"{}\",\"procs\":{},\"nodes\":{},\"card_bytes\":{},\
             \"median_us\":{:.3},\"min_us\":{:.3},\"max_us\":{:.3},\"iters\":{}}}",
            f.mode.name(),
            r.procs,
            r.nodes,
            f.card,
            f.time.median_us,
            f.time.min_us,
            f.time.max_us,
            r.iters
        );
    }
    for l in &r.local {
        let extra = format!(",\"target_rank\":{},\"batch\":{BATCH}", l.target);
        json_get(&mut o, r, "local", "full", l.card, &l.time, &extra);
    }
    for g in &r.remote {
        let extra = format!(
            ",\"target_rank\":{},\"refresh\":true,\"first_plain_us\":{:.3},\
             \"first_plain_pulled\":{},\"first_plain_fresh\":{}",
            g.target, g.first.us, g.first.pulled, g.first.fresh
        );
        json_get(
            &mut o,
            r,
            "remote_first",
            "sparse",
            g.card,
            &g.refresh,
            &extra,
        );
    }
    for g in &r.remote {
        let extra = format!(",\"target_rank\":{},\"batch\":{BATCH}", g.target);
        json_get(&mut o, r, "cached", "sparse", g.card, &g.cached, &extra);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("weft bench fence").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_and_lists_parse() {
        let a = parse(&[]).unwrap();
        assert_eq!((a.procs, a.nodes, a.iters, a.warmup), (8, 1, 50, 5));
        assert_eq!(a.card, vec![64, 1024, 16384]);
        assert_eq!(
            a.modes,
            vec![Mode::Full, Mode::Sparse, Mode::Sync, Mode::Fabric]
        );
        assert_eq!(a.map_by, Placement::Slot);
        let a = parse(&[
            "-n",
            "64",
            "--nodes",
            "4",
            "--map-by",
            "node",
            "--card",
            "8,4096",
            "--modes",
            "sparse,sync",
            "--iters",
            "3",
            "--warmup",
            "0",
            "--json",
        ])
        .unwrap();
        assert_eq!((a.procs, a.nodes, a.map_by), (64, 4, Placement::Node));
        assert_eq!(a.card, vec![8, 4096]);
        assert_eq!(a.modes, vec![Mode::Sparse, Mode::Sync]);
        assert!(a.json && a.iters == 3 && a.warmup == 0);
        assert!(parse(&["--modes", "fast"]).is_err());
        assert!(parse(&["-n", "0"]).is_err());
        assert!(parse(&["--iters", "0"]).is_err());
        assert!(check_cards(&[0]).is_err() && check_cards(&[MAX_CARD + 1]).is_err());
        assert!(check_cards(&[1, MAX_CARD]).is_ok());
    }

    #[test]
    fn layouts_that_leave_a_node_empty_are_refused() {
        assert!(check_layout(2, 4, Placement::Slot).is_err());
        assert!(check_layout(6, 4, Placement::Slot).is_err()); // 2 per node: 3 nodes
        assert!(check_layout(6, 4, Placement::Node).is_ok());
        assert!(check_layout(8, 4, Placement::Slot).is_ok());
        assert!(check_layout(4, 4, Placement::Slot).is_ok());
        assert!(check_layout(3, 4, Placement::Node).is_err());
        assert_eq!(nodes_used(2, 4, Placement::Slot), 2);
    }

    #[test]
    fn cards_differ_per_iteration_and_rank() {
        assert_ne!(card(1, 1, 64), card(1, 2, 64));
        assert_ne!(card(1, 1, 64), card(2, 1, 64));
        assert_ne!(card(1, 1, 1), card(1, 2, 1));
        assert_eq!(card(3, 9, 16384).len(), 16384);
    }

    #[test]
    fn json_lines_parse_and_name_every_field() {
        let t = Summary::of_us(vec![1.0, 2.0, 3.0]).unwrap();
        let r = Report {
            procs: 8,
            nodes: 2,
            per_node: vec![4, 4],
            iters: 3,
            warmup: 1,
            fences: vec![FenceRow {
                mode: Mode::Full,
                card: 64,
                time: t,
            }],
            local: vec![LocalGet {
                card: 64,
                target: 1,
                time: t,
            }],
            remote: vec![RemoteGet {
                card: 64,
                target: 4,
                target_node: 1,
                first: FirstGet {
                    us: 12.5,
                    pulled: true,
                    fresh: true,
                    got_len: Some(64),
                },
                refresh: t,
                cached: t,
            }],
        };
        let text = json_lines(&r);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0]["bench"], "fence");
        assert_eq!(lines[0]["iters"], 3);
        assert_eq!(lines[0]["median_us"], 2.0);
        let kinds: Vec<&str> = lines[1..]
            .iter()
            .map(|l| l["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["local", "remote_first", "cached"]);
        for l in &lines[1..] {
            for k in [
                "mode",
                "procs",
                "nodes",
                "card_bytes",
                "median_us",
                "min_us",
                "max_us",
            ] {
                assert!(!l[k].is_null(), "{k} missing in {l}");
            }
        }
        let table = tables(&r);
        assert!(table.starts_with("# Weft fence benchmark\n"));
        assert!(table.contains("GetOpts::refresh()"));
    }
}

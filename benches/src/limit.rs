//! `weft bench limit`: the floor of this machine, which no shared-memory transport beats.
//!
//! - Cache-line ping-pong: ranks 0 and 1 bounce one 64-byte line of a shared-memory
//!   segment (rank 0 stores n and waits for n+1, rank 1 waits for n and stores n+1); half
//!   the round trip is the fastest one-way message two processes of this node can exchange
//!   (`cacheline_one_way_us`, median over several timed runs after a warm-up). The same
//!   again with [`BUSY_NS`] of work on each side between seeing the other's value and
//!   storing its own: that floor holds only for an answer given at once, and a fabric
//!   does some work (matching, completion) before it answers.
//! - Single-core memcpy in rank 0 for every size of the sweep (8 B to 4 MiB by default):
//!   the fastest a one-copy transfer can go (`memcpy_mbs`, 10^6 bytes per second).
//!
//! Started alone (no `WEFT_RANK`), it launches itself as a job of two processes through
//! Weft's launcher, bound to different cores when the machine has two or more. Under
//! `weft run` rank 0 creates the segment and publishes its name with put/commit/fence,
//! rank 1 maps it, and rank 0 unlinks it as soon as rank 1 has it mapped.
//!
//! The segment is made with `rustix` shm and `memmap2` directly rather than with
//! `weft_shm::segment`: its `ReadOnlySegment` maps the other side read-only, and here both
//! processes write the line. It is created `O_EXCL` with mode 0600, starts with a magic
//! number that the mapping side checks, and lives only while the benchmark runs.

use std::hint::black_box;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use memmap2::{MmapMut, MmapOptions};
use rustix::fs::Mode;
use rustix::shm;
use weft_runtime::launcher::{self, AppContext, BindTo, LaunchSpec};
use weft_runtime::topology;
use weft_wireup::{Client, FenceMode, GetOpts, Procs, Rank, Scope};

use crate::osu::{default_sizes, progress_env, Metric, Report, Sweep, SweepArgs, MAX_DEFAULT_SIZE};
use crate::stats::{us, Summary};

/// Key of rank 0's card: the segment name.
const SEGMENT_KEY: &str = "bench.limit.segment";
/// Key of rank 1's card: the CPUs it runs on.
const CPUS_KEY: &str = "bench.limit.cpus";
/// Bytes of the segment.
const SEGMENT_BYTES: usize = 4096;
/// First word of the segment: "WEFTLIM1".
const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"WEFTLIM1");
/// Offset of the ping-pong line: its own 128-byte block, so that no adjacent-line
/// prefetch pairs it with the magic.
const LINE_OFFSET: usize = 128;
const _: () = assert!(LINE_OFFSET % 128 == 0 && LINE_OFFSET + 128 <= SEGMENT_BYTES);
/// Time limit of every fence and get.
const WIRE_TIMEOUT: Duration = Duration::from_secs(120);
/// A ping-pong wait that sees no answer for this long fails.
const STALL: Duration = Duration::from_secs(30);
/// Spins between two looks at the clock (and yields of the CPU) while waiting.
const SPINS: u32 = 4096;
/// Minimum duration of one timed memcpy run.
const MEMCPY_RUN: Duration = Duration::from_millis(20);
/// Timed memcpy runs per size (the median is reported).
const MEMCPY_RUNS: usize = 7;
/// Work per turn of the busy cache-line ping-pong, in nanoseconds.
pub(crate) const BUSY_NS: f64 = 20.0;

/// `n` dependent multiply-xor steps: work that touches no memory and reads no clock
/// (a TSC read in the loop would hold back the store that follows it). Nothing at all
/// for 0, so the plain ping-pong runs exactly as without it.
#[inline(always)]
fn busy_work(seed: u64, n: u64) {
    let mut x = seed;
    for k in 0..n {
        x = black_box(x.wrapping_mul(3) ^ k);
    }
}

/// Steps of [`busy_work`] that take about `ns` nanoseconds on this core (0 for 0).
fn busy_steps(ns: f64) -> u64 {
    if ns <= 0.0 {
        return 0;
    }
    let (reps, n) = (100_000u64, 256u64);
    let t0 = Instant::now();
    for i in 0..reps {
        busy_work(i, n);
    }
    let per_step_ns = t0.elapsed().as_secs_f64() * 1e9 / (reps * n) as f64;
    (ns / per_step_ns.max(1e-3)).round().max(1.0) as u64
}

/// The floor of this machine: one-way latency of a cache line bounced between two
/// processes, and single-core memcpy bandwidth.
///
/// Started alone, launches itself as a job of 2 processes (bound to different cores when
/// there are two or more); under `weft run` it measures ranks 0 and 1 of its job (they
/// must share a node; other ranks only wait). Rank 0 prints the results.
#[derive(Debug, Parser)]
#[command(name = "weft bench limit")]
struct Args {
    #[command(flatten)]
    sweep: SweepArgs,
    /// Round trips per timed run of the cache-line ping-pong.
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    round_trips: u32,
    /// Timed runs of the ping-pong; the median is reported.
    #[arg(long, value_name = "R", default_value_t = 11,
          value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Untimed round trips before the timed runs.
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    warmup: u32,
    /// Disjoint slots of each memcpy buffer; copies cycle through them, so each buffer
    /// holds SLOTS times the size (2: every copy touches other bytes than the last).
    #[arg(long, value_name = "SLOTS", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    memcpy_slots: u32,
    /// Binding of the two processes when started alone (auto: core when the machine has
    /// two or more cores).
    #[arg(long, value_enum, default_value_t = Bind::Auto)]
    bind_to: Bind,
}

/// `--bind-to` of the benchmarks that launch themselves as two processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Bind {
    /// Core when there are two or more cores, else none.
    Auto,
    /// One core per process.
    Core,
    /// No binding.
    None,
}

/// Runs `weft bench limit ARGS...` (the arguments after `limit`); returns the exit status.
pub(crate) fn main(args: &[String]) -> i32 {
    let argv = std::iter::once("weft bench limit".to_owned()).chain(args.iter().cloned());
    let opts = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    run_or_launch("limit", opts.bind_to, args, || run_rank(&opts))
}

/// Runs a two-process benchmark: `run_rank` when this process is a rank of a job
/// (`WEFT_RANK` is set), else launches `weft bench NAME ARGS...` as a job of two
/// processes (see [`launch_job`]). Returns the exit status; errors are printed as
/// `weft bench NAME: ...`.
pub(crate) fn run_or_launch(
    name: &str,
    bind: Bind,
    args: &[String],
    run_rank: impl FnOnce() -> Result<(), String>,
) -> i32 {
    run_or_launch_n(name, bind, args, 2, run_rank)
}

/// [`run_or_launch`] with a job of `procs` processes when started alone.
pub(crate) fn run_or_launch_n(
    name: &str,
    bind: Bind,
    args: &[String],
    procs: u32,
    run_rank: impl FnOnce() -> Result<(), String>,
) -> i32 {
    if std::env::var_os(weft_wireup::env::RANK).is_some() {
        return match run_rank() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("weft bench {name}: {e}");
                1
            }
        };
    }
    match launch_job(name, bind, args, procs) {
        Ok(0) => 0,
        Ok(code) => {
            eprintln!("weft bench {name}: the benchmark job failed (exit status {code})");
            code
        }
        Err(e) => {
            eprintln!("weft bench {name}: {e}");
            launcher::EXIT_LAUNCH_FAILED
        }
    }
}

/// Launches `weft bench NAME ARGS...` as a job of `procs` copies of this executable, bound
/// as `bind` says ([`Bind::Auto`]: one core each when the machine has that many, and two
/// or more), with the progress-bar setting of [`progress_env`]; returns the job's exit
/// status.
pub(crate) fn launch_job(
    name: &str,
    bind: Bind,
    args: &[String],
    procs: u32,
) -> Result<i32, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot locate this executable to launch the job: {e}"))?;
    let bind_to = match bind {
        Bind::Core => BindTo::Core,
        Bind::None => BindTo::None,
        Bind::Auto => match topology::cores() {
            Ok(c) if c.len() >= procs.max(2) as usize => BindTo::Core,
            _ => BindTo::None,
        },
    };
    let mut child_args = vec!["bench".to_owned(), name.to_owned()];
    child_args.extend(args.iter().cloned());
    let spec = LaunchSpec {
        apps: vec![AppContext {
            n: procs,
            pset: None,
            program: exe.display().to_string(),
            args: child_args,
        }],
        bind_to,
        env: vec![progress_env()],
        ..LaunchSpec::default()
    };
    launcher::run(spec).map_err(|e| e.to_string())
}

/// The shared-memory segment of the ping-pong, mapped read-write.
struct PingSegment {
    /// Keeps the mapping alive; `base` points into it.
    _map: MmapMut,
    base: NonNull<u8>,
}

// SAFETY: the mapping is plain shared memory, not tied to the thread that made it, and
// `&PingSegment` only hands out atomics in it; `base` is only an address.
unsafe impl Send for PingSegment {}
// SAFETY: as for Send: every access through `&PingSegment` is atomic.
unsafe impl Sync for PingSegment {}

impl std::fmt::Debug for PingSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PingSegment").finish_non_exhaustive()
    }
}

impl PingSegment {
    /// Maps `SEGMENT_BYTES` of the open shm object `fd` read-write.
    fn map(name: &str, fd: rustix::fd::OwnedFd) -> Result<PingSegment, String> {
        let file = std::fs::File::from(fd);
        let len = file
            .metadata()
            .map_err(|e| format!("cannot stat segment {name}: {e}"))?
            .len();
        if len < SEGMENT_BYTES as u64 {
            return Err(format!(
                "segment {name} is {len} bytes, expected {SEGMENT_BYTES}"
            ));
        }
        // SAFETY: the object is this job's own (created O_EXCL, mode 0600, by rank 0),
        // it is never truncated while mapped (it has its final size before its name is
        // published), and the mapping is only accessed through atomics.
        let mut map = unsafe { MmapOptions::new().len(SEGMENT_BYTES).map_mut(&file) }
            .map_err(|e| format!("cannot map segment {name}: {e}"))?;
        let base = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| format!("mapping segment {name} returned a null address"))?;
        Ok(PingSegment { _map: map, base })
    }

    /// The 8-byte word at `offset` (a multiple of 8 inside the segment).
    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset % 8 == 0 && offset + 8 <= SEGMENT_BYTES);
        // SAFETY: the offset is inside the page-aligned mapping and 8-byte aligned
        // (checked above); the mapping lives as long as `self`; the word is only ever
        // accessed atomically, by this and the peer process.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// The word the two processes bounce.
    fn line(&self) -> &AtomicU64 {
        self.word(LINE_OFFSET)
    }
}

/// Creates the segment `name` (rank 0) and writes the magic.
fn create_segment(name: &str) -> Result<PingSegment, String> {
    let fd = shm::open(
        name,
        shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
        Mode::RUSR | Mode::WUSR,
    )
    .map_err(|e| format!("cannot create segment {name}: {}", io::Error::from(e)))?;
    let seg = rustix::fs::ftruncate(&fd, SEGMENT_BYTES as u64)
        .map_err(|e| format!("cannot size segment {name}: {}", io::Error::from(e)))
        .and_then(|()| PingSegment::map(name, fd));
    let seg = match seg {
        Ok(s) => s,
        Err(e) => {
            let _ = shm::unlink(name);
            return Err(e);
        }
    };
    // SYNC: pairs with the Acquire load of the magic in `open_segment` (the fence through
    // the wire-up server orders them too).
    seg.word(0).store(SEGMENT_MAGIC, Ordering::Release);
    Ok(seg)
}

/// Opens rank 0's segment `name` (rank 1) and checks the magic.
fn open_segment(name: &str) -> Result<PingSegment, String> {
    let fd = shm::open(name, shm::OFlags::RDWR, Mode::empty())
        .map_err(|e| format!("cannot open segment {name}: {}", io::Error::from(e)))?;
    let seg = PingSegment::map(name, fd)?;
    // SYNC: pairs with the Release store of the magic in `create_segment`.
    let magic = seg.word(0).load(Ordering::Acquire);
    if magic != SEGMENT_MAGIC {
        return Err(format!(
            "segment {name} is not a limit-benchmark segment (magic {magic:#018x})"
        ));
    }
    Ok(seg)
}

/// Spins until `line` holds `want`; fails after `STALL` without it.
fn wait_for(line: &AtomicU64, want: u64, peer: Rank) -> Result<(), String> {
    let mut spins = 0u32;
    let mut since: Option<Instant> = None;
    // SYNC: pairs with the peer's Release store in `ping_pong`.
    while line.load(Ordering::Acquire) != want {
        spins = spins.wrapping_add(1);
        if spins % SPINS == 0 {
            // The peer is slow or shares our CPU: let it run, and give up eventually.
            std::thread::yield_now();
            let t0 = since.get_or_insert_with(Instant::now);
            if t0.elapsed() > STALL {
                return Err(format!(
                    "rank {peer} did not answer the cache-line ping-pong within {}s \
                     (waiting for value {want}, line holds {})",
                    STALL.as_secs(),
                    line.load(Ordering::Relaxed)
                ));
            }
        }
    }
    Ok(())
}

/// Bounces the line `trips` times starting at round trip `first`; rank 0 (`pinger`)
/// stores odd values and waits for even ones, rank 1 the other way round. Each side does
/// `steps` of [`busy_work`] between seeing the other's value and storing its own.
fn ping_pong(
    line: &AtomicU64,
    pinger: bool,
    first: u64,
    trips: u64,
    steps: u64,
) -> Result<(), String> {
    let peer = if pinger { 1 } else { 0 };
    for k in first..first + trips {
        let ping = 2 * k + 1;
        if pinger {
            // SYNC: pairs with the peer's Acquire load in `wait_for`.
            line.store(ping, Ordering::Release);
            wait_for(line, ping + 1, peer)?;
            busy_work(k, steps);
        } else {
            wait_for(line, ping, peer)?;
            busy_work(k, steps);
            // SYNC: pairs with the peer's Acquire load in `wait_for`.
            line.store(ping + 1, Ordering::Release);
        }
    }
    Ok(())
}

fn run_rank(opts: &Args) -> Result<(), String> {
    let sweep = Sweep::new(&opts.sweep, default_sizes(8, MAX_DEFAULT_SIZE));
    let wire = Client::init().map_err(|e| format!("init: {e}"))?;
    let me = wire.rank();
    let result = measure(&wire, opts, &sweep).map_err(|e| format!("rank {me}: {e}"));
    let fin = wire
        .finalize()
        .map_err(|e| format!("rank {me}: finalize: {e}"));
    result.and(fin)
}

fn fence(wire: &Client, what: &str) -> Result<(), String> {
    wire.fence(Procs::All, FenceMode::SyncOnly, Some(WIRE_TIMEOUT))
        .map_err(|e| format!("{what}: {e}"))
}

/// The CPUs this process may run on, in cpu-list form (`?` when unknown).
pub(crate) fn cpus_of_this_process() -> String {
    topology::current_binding().map_or_else(|_| "?".to_owned(), |c| c.to_string())
}

/// Runs the ping-pong (ranks 0 and 1) and, on rank 0, the memcpy sweep and the report.
fn measure(wire: &Client, opts: &Args, sweep: &Sweep) -> Result<(), String> {
    let pp = PingPong {
        warmup: opts.warmup,
        round_trips: opts.round_trips,
        runs: opts.runs,
        busy: true,
    };
    let cache_line = cacheline_one_way(wire, pp)?;
    if wire.rank() == 0 {
        report(opts, sweep, cache_line.as_ref()).map_err(|e| format!("writing the report: {e}"))?;
    }
    // No time limit: rank 0 may sweep for long; a rank that dies still ends the fence.
    wire.fence(Procs::All, FenceMode::SyncOnly, None)
        .map_err(|e| format!("final fence: {e}"))
}

/// How long the cache-line ping-pong of [`cacheline_one_way`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PingPong {
    /// Untimed round trips first.
    pub(crate) warmup: u32,
    /// Round trips per timed run.
    pub(crate) round_trips: u32,
    /// Timed runs.
    pub(crate) runs: u32,
    /// Also time as many runs with [`BUSY_NS`] of work per turn.
    pub(crate) busy: bool,
}

impl Default for PingPong {
    fn default() -> Self {
        PingPong {
            warmup: 20_000,
            round_trips: 100_000,
            runs: 11,
            busy: true,
        }
    }
}

/// Result of the cache-line ping-pong.
#[derive(Debug, Clone)]
pub(crate) struct CacheLine {
    /// One-way time (half the round trip) of each timed run, in µs.
    pub(crate) one_way: Summary,
    /// The same with [`BUSY_NS`] of work per turn on each side.
    pub(crate) busy: Option<Summary>,
    /// CPUs of ranks 0 and 1 (their bindings, in cpu-list form).
    pub(crate) cpus: (String, String),
}

/// Calls of [`cacheline_one_way`] in this process, to name each segment apart.
static PING_SEGMENTS: AtomicU64 = AtomicU64::new(0);

/// The cache-line ping-pong between ranks 0 and 1 of the job, as a collective: every rank
/// of the job calls it (ranks other than 0 and 1 only take part in its fences). Rank 0
/// creates the segment and publishes its name (put/commit/Full fence), rank 1 maps it,
/// rank 0 unlinks it once both have it mapped, then they bounce the line. Returns the
/// result on rank 0, `None` elsewhere and when the job has a single process.
///
/// Placement matters: on a virtual machine the one-way time changes with where the host
/// runs the two virtual CPUs (here 0.03, 0.05 or 0.22 µs from one run to the next), so a
/// transport's latency is best compared with a ping-pong measured in the same job.
pub(crate) fn cacheline_one_way(wire: &Client, pp: PingPong) -> Result<Option<CacheLine>, String> {
    let me = wire.rank();
    let job = wire.job();
    let pair = wire.size() >= 2;
    if pair && job.node_of(0) != job.node_of(1) {
        return Err(
            "ranks 0 and 1 are on different nodes; the cache-line ping-pong runs between two \
             processes of one node"
                .to_owned(),
        );
    }
    // Relaxed: a counter that only makes names unique within this process.
    let call = PING_SEGMENTS.fetch_add(1, Ordering::Relaxed);
    let name = format!("/{}-bench-limit-{call}", wire.nspace());
    let seg = if pair && me == 0 {
        let seg = create_segment(&name)?;
        wire.put(Scope::Local, SEGMENT_KEY, name.as_str())
            .map_err(|e| format!("put: {e}"))?;
        Some(seg)
    } else {
        None
    };
    if pair && me == 1 {
        wire.put(Scope::Local, CPUS_KEY, cpus_of_this_process())
            .map_err(|e| format!("put: {e}"))?;
    }
    wire.commit().map_err(|e| format!("commit: {e}"))?;
    wire.fence(Procs::All, FenceMode::Full, Some(WIRE_TIMEOUT))
        .map_err(|e| format!("fence publishing the segment: {e}"))?;
    let seg = if pair && me == 1 {
        let v = wire
            .get(0, SEGMENT_KEY, GetOpts::default().timeout(WIRE_TIMEOUT))
            .map_err(|e| format!("get {SEGMENT_KEY} of rank 0: {e}"))?;
        let n = v
            .as_str()
            .ok_or_else(|| format!("{SEGMENT_KEY} of rank 0 is not a string: {v:?}"))?;
        Some(open_segment(n)?)
    } else {
        seg
    };
    // Both sides have it mapped: the name is no longer needed.
    let mapped = fence(wire, "fence after mapping the segment");
    if me == 0 && pair {
        let _ = shm::unlink(name.as_str());
    }
    mapped?;

    let warm = u64::from(pp.warmup);
    let trips = u64::from(pp.round_trips.max(1));
    let mut runs = Vec::with_capacity(pp.runs as usize);
    let mut busy = Vec::with_capacity(pp.runs as usize);
    if let Some(seg) = &seg {
        let line = seg.line();
        let pinger = me == 0;
        let steps = if pp.busy { busy_steps(BUSY_NS) } else { 0 };
        ping_pong(line, pinger, 0, warm, 0)?;
        let mut next = warm;
        let busy_runs = if pp.busy { pp.runs } else { 0 };
        for (out, steps, n) in [(&mut runs, 0, pp.runs), (&mut busy, steps, busy_runs)] {
            for _ in 0..n {
                let t0 = Instant::now();
                ping_pong(line, pinger, next, trips, steps)?;
                out.push(us(t0.elapsed()) / trips as f64 / 2.0);
                next += trips;
            }
        }
    }
    drop(seg);
    fence(wire, "fence after the ping-pong")?;
    if me != 0 {
        return Ok(None);
    }
    Ok(Summary::of_us(runs).map(|one_way| {
        let peer = wire
            .get(1, CPUS_KEY, GetOpts::default().timeout(WIRE_TIMEOUT))
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| "?".to_owned());
        CacheLine {
            one_way,
            busy: Summary::of_us(busy),
            cpus: (cpus_of_this_process(), peer),
        }
    }))
}

/// The cache-line row's metric.
const CACHE_LINE: Metric = Metric {
    key: "cacheline_one_way_us",
    column: "One-way (us)",
    decimals: 3,
    log_y: true,
};

/// The memcpy rows' metric.
const MEMCPY: Metric = Metric {
    key: "memcpy_mbs",
    column: "Bandwidth (MB/s)",
    decimals: 2,
    log_y: false,
};

/// Measures memcpy over the sweep and prints everything (rank 0).
fn report(opts: &Args, sweep: &Sweep, line: Option<&CacheLine>) -> io::Result<()> {
    const TITLE: &str = "Weft Limit Test";
    let one = Sweep::new(&Default::default(), vec![64]);
    let mut r = Report::new(&opts.sweep, &one, "limit", TITLE, CACHE_LINE).without_plot();
    match line {
        Some(l) => {
            r.comment(&format!(
                "cache-line ping-pong: ranks 0 and 1 (CPUs {} and {}) bounce one 64-byte line;\n\
                 one-way = half the round trip, median of {} runs of {} round trips after {} \
                 warm-up (min {:.3} us, max {:.3} us)",
                l.cpus.0,
                l.cpus.1,
                opts.runs,
                opts.round_trips,
                opts.warmup,
                l.one_way.min_us,
                l.one_way.max_us
            ))?;
            r.row(64, l.one_way.median_us)?;
            if let Some(b) = &l.busy {
                r.comment(&format!(
                    "the same with {BUSY_NS:.0} ns of work per turn on each side (between \
                     seeing the other's value and storing its own): {:.3} us one way \
                     (min {:.3}, max {:.3}); the floor above holds only for an answer given \
                     at once",
                    b.median_us, b.min_us, b.max_us
                ))?;
            }
        }
        None => r.comment("cache-line ping-pong: not measured (the job has one process)")?,
    }
    r.finish()?;

    let mut r = Report::new(&opts.sweep, sweep, "limit", TITLE, MEMCPY)
        .without_header()
        .label("single-core memcpy");
    r.comment(&format!(
        "\nsingle-core memcpy in rank 0 (CPUs {}): each buffer holds {} disjoint slots of the \
         size, copies cycle through them;\nmedian of {MEMCPY_RUNS} runs of at least {} ms",
        cpus_of_this_process(),
        opts.memcpy_slots,
        MEMCPY_RUN.as_millis()
    ))?;
    for &size in sweep.sizes() {
        if size == 0 {
            continue;
        }
        r.row(size, memcpy_mbs(size, opts.memcpy_slots as usize))?;
    }
    r.finish()?;
    Ok(())
}

/// Single-core memcpy bandwidth at `size` bytes, in MB/s (10^6 bytes per second).
///
/// Copies `size` bytes between two buffers of `slots` disjoint 64-byte-aligned slots each,
/// slot after slot, so consecutive copies touch other bytes (with `slots` ≥ 2); reports the
/// median of `MEMCPY_RUNS` runs, each long enough to be stable. Size 0 gives 0.
pub(crate) fn memcpy_mbs(size: usize, slots: usize) -> f64 {
    if size == 0 {
        return 0.0;
    }
    let slots = slots.max(1);
    let stride = size.next_multiple_of(64);
    let span = stride * slots;
    // Filled (not zeroed), so that every page is really there before the timing.
    let src = vec![0x5au8; span];
    let mut dst = vec![0xa5u8; span];
    let mut copy = |n: usize| {
        let t0 = Instant::now();
        for i in 0..n {
            let o = (i % slots) * stride;
            dst[o..o + size].copy_from_slice(black_box(&src[o..o + size]));
            black_box(&mut dst);
        }
        t0.elapsed()
    };
    let mut n = 1usize;
    while copy(n) < MEMCPY_RUN / 2 && n < 1 << 40 {
        n *= 2;
    }
    let n = n * 2;
    let mbs = (0..MEMCPY_RUNS)
        .map(|_| (size * n) as f64 / copy(n).as_secs_f64() / 1e6)
        .collect::<Vec<_>>();
    Summary::of_us(mbs).map_or(0.0, |s| s.median_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("weft bench limit").chain(args.iter().copied()))
    }

    #[test]
    fn options_parse() {
        let a = parse(&[]).unwrap();
        assert_eq!((a.round_trips, a.runs, a.memcpy_slots), (100_000, 11, 2));
        assert_eq!(a.bind_to, Bind::Auto);
        let pp = PingPong::default();
        assert_eq!(
            (a.warmup, a.round_trips, a.runs),
            (pp.warmup, pp.round_trips, pp.runs)
        );
        let s = Sweep::new(&a.sweep, default_sizes(8, MAX_DEFAULT_SIZE));
        assert_eq!(s.sizes().first(), Some(&8));
        assert_eq!(s.sizes().last(), Some(&(4 << 20)));
        let a = parse(&["--sizes", "8,4194304", "--json", "--runs", "3"]).unwrap();
        assert_eq!(Sweep::new(&a.sweep, vec![]).sizes(), &[8, 4 << 20]);
        assert!(a.sweep.json);
        assert!(parse(&["--runs", "0"]).is_err());
        assert!(parse(&["--memcpy-slots", "0"]).is_err());
        assert!(parse(&["--sizes", "8,big"]).is_err());
    }

    #[test]
    fn ping_pong_between_two_threads_over_a_segment() {
        let name = format!("/weft-test-{}-bench-limit", std::process::id());
        let a = create_segment(&name).unwrap();
        let b = open_segment(&name).unwrap();
        shm::unlink(name.as_str()).unwrap();
        std::thread::scope(|s| {
            let t = s.spawn(|| ping_pong(b.line(), false, 0, 1000, 0));
            ping_pong(a.line(), true, 0, 1000, 0).unwrap();
            t.join().unwrap().unwrap();
        });
        assert_eq!(a.line().load(Ordering::Relaxed), 2000);
        // The other side was not mapped from a benchmark segment.
        assert!(open_segment(&name).is_err());
    }

    /// With work per turn both sides still alternate (every value is seen once), and the
    /// calibration gives no work for 0 ns and some for 20 ns.
    #[test]
    fn busy_ping_pong_between_two_threads() {
        assert_eq!(busy_steps(0.0), 0);
        let steps = busy_steps(BUSY_NS);
        assert!(steps >= 1);
        let name = format!("/weft-test-{}-bench-limit-busy", std::process::id());
        let a = create_segment(&name).unwrap();
        let b = open_segment(&name).unwrap();
        shm::unlink(name.as_str()).unwrap();
        std::thread::scope(|s| {
            let t = s.spawn(|| ping_pong(b.line(), false, 0, 500, steps));
            ping_pong(a.line(), true, 0, 500, steps).unwrap();
            t.join().unwrap().unwrap();
        });
        assert_eq!(a.line().load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn open_refuses_a_foreign_segment() {
        let name = format!("/weft-test-{}-bench-limit-foreign", std::process::id());
        let fd = shm::open(
            name.as_str(),
            shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
            Mode::RUSR | Mode::WUSR,
        )
        .unwrap();
        rustix::fs::ftruncate(&fd, SEGMENT_BYTES as u64).unwrap();
        let e = open_segment(&name).unwrap_err();
        shm::unlink(name.as_str()).unwrap();
        assert!(e.contains("not a limit-benchmark segment"), "{e}");
    }

    #[test]
    fn memcpy_reports_a_positive_rate() {
        assert_eq!(memcpy_mbs(0, 2), 0.0);
        assert!(memcpy_mbs(4096, 2) > 0.0);
    }
}

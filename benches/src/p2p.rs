//! `weft bench latency | bw | bibw | mr`: point-to-point benchmarks over Weft's fabric with
//! the semantics of the OSU micro-benchmarks (`osu_latency`, `osu_bw`, `osu_bibw`, and
//! `osu_mbw_mr` with one pair), between the two processes of a job.
//!
//! - `latency`: blocking `send`/`recv` ping-pong; the one-way latency is half the round
//!   trip, averaged over the timed iterations (10000 after 100 warm-up up to 8 KiB, 1000
//!   after 10 above, as OSU).
//! - `bw`: rank 0 starts a window of 64 `isend`s and `wait_all`s them, then receives a
//!   1-byte ack that rank 1 sends once it has received the whole window; bytes over rank
//!   0's time in MB/s (10^6 bytes per second). 100 windows after 10 up to 8 KiB, 20 after 2
//!   above (as OSU).
//! - `bibw`: both ranks post a window of `irecv`s and one of `isend`s, then wait for all;
//!   the bytes of both directions over rank 0's time.
//! - `mr`: the `bw` exchange, reported as messages per second.
//!
//! `bw` and `bibw` start at 1 byte (size 0 carries no bandwidth); `latency` and `mr` at 0.
//!
//! **Receive buffers.** OSU posts every receive of a window into one buffer; a Rust
//! receive borrows its buffer mutably, so here each outstanding receive has its own
//! 64-byte-aligned slot. To keep the receiver's cache footprint near OSU's, one window's
//! receives are posted in groups whose slots span at most [`RECV_SPAN`] (1 MiB; at least
//! one message): all 64 at once up to 16 KiB, which covers every eager size of the default
//! threshold, fewer above (one at a time from 1 MiB), where a message that arrives before
//! its receive is posted waits as a rendezvous request without being copied.
//!
//! **Same-job reference.** On a virtual machine the floor moves between jobs (the
//! cache-line one-way time by up to 5x, with where the host runs the virtual CPUs), so
//! only ratios measured in one job mean anything. Before the sweep, unless `--no-limit`:
//! (and when the two ranks talk over verbs, where these shared-memory floors mean nothing)
//! `latency` runs `weft bench limit`'s cache-line ping-pong between the same two
//! processes, and `bw` the single-core memcpy in rank 0 at every size. They are printed
//! as a second series (`"impl": "limit"` in JSON, `"impl": "weft"` for the fabric's rows),
//! and the table ends with the ratio weft/limit at 8 bytes (latency) or weft/memcpy at 4 MiB
//! (bw; else at the sweep's first or last size).
//!
//! **Data check.** In `bw` and `mr`, rank 0 writes a pattern into the first and last byte
//! of its send buffer before every window; after the last window of each size, rank 1
//! checks them, and the size, in the last message it received. The answer travels in the
//! final ack, so that a mismatch fails both ranks (exit status 1) with the size named.
//!
//! Started alone (no `WEFT_RANK`), each benchmark launches itself as a job of two
//! processes, bound to different cores when the machine has two or more; under
//! `weft run -n 2` it measures the job it runs in. Rank 0 prints.

use std::hint::black_box;
use std::io;
use std::time::{Duration, Instant};

use clap::{CommandFactory, FromArgMatches, Parser};
use weft_fabric::{wait_all, Communicator, Fabric, P2pError, Request, RequestScope, Source, Tag};

use crate::limit::{self, Bind, CacheLine, PingPong};
use crate::osu::{default_sizes, Metric, Report, Sweep, SweepArgs, MAX_DEFAULT_SIZE};
use crate::stats::Summary;

mod pairs;
mod reference;
#[cfg(test)]
mod tests;

use reference::{ratio_comment, reference_after, reference_before, write_reference, Reference};

/// Tag of the measured messages.
const TAG_DATA: Tag = Tag(1);
/// Tag of `bw`'s and `mr`'s acks.
const TAG_ACK: Tag = Tag(2);
/// Tag of the handshake that aligns the two ranks before each size.
const TAG_SYNC: Tag = Tag(3);
/// Tag of rank 1's CPU list, sent to rank 0 at the start.
const TAG_INFO: Tag = Tag(4);
/// Rank 0 tells rank 1 the iterations of the next size (when a time budget caps them).
const TAG_REPS: Tag = Tag(5);
/// Sizes above this are "large" and get OSU's smaller iteration counts.
const LARGE: usize = 8192;
/// Most bytes of receive slots one group of a window's receives spans.
pub(crate) const RECV_SPAN: usize = 1 << 20;
/// Alignment of the send buffer and of each receive slot.
const SLOT_ALIGN: usize = 64;
/// Slots of each memcpy buffer in the bw reference (as `weft bench limit`).
const MEMCPY_SLOTS: usize = 2;
/// Ack byte: the window arrived (and, after the last one, its data checked out).
const ACK_OK: u8 = 1;
/// Ack byte: the data check of the last window failed.
const ACK_BAD: u8 = 0;
/// Fill byte of the send buffer.
const SEND_FILL: u8 = b'a';
/// Fill byte of the receive buffers before the sweep.
const RECV_FILL: u8 = 0xee;
/// How often a rank that waits for the other's reference measurement looks for it.
const IDLE_POLL: Duration = Duration::from_micros(200);

/// The four point-to-point benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bench {
    /// `weft bench latency` (osu_latency).
    Latency,
    /// `weft bench bw` (osu_bw).
    Bw,
    /// `weft bench bibw` (osu_bibw).
    Bibw,
    /// `weft bench mr` (osu_mbw_mr with one pair).
    Mr,
}

/// Timed and warm-up iterations of one size (round trips or windows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reps {
    iters: u32,
    warmup: u32,
}

impl Reps {
    fn total(self) -> u32 {
        self.warmup.saturating_add(self.iters)
    }
}

impl Bench {
    /// The name after `weft bench`, and the JSON `bench` value.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Bench::Latency => "latency",
            Bench::Bw => "bw",
            Bench::Bibw => "bibw",
            Bench::Mr => "mr",
        }
    }

    fn command_name(self) -> &'static str {
        match self {
            Bench::Latency => "weft bench latency",
            Bench::Bw => "weft bench bw",
            Bench::Bibw => "weft bench bibw",
            Bench::Mr => "weft bench mr",
        }
    }

    /// One line for `weft bench --help`.
    pub(crate) const fn about(self) -> &'static str {
        match self {
            Bench::Latency => "one-way latency of blocking send/recv (osu_latency)",
            Bench::Bw => "bandwidth of windows of 64 isends, each acked (osu_bw)",
            Bench::Bibw => "bandwidth of windows of 64 isends both ways at once (osu_bibw)",
            Bench::Mr => "message rate of windows of 64 isends (osu_mbw_mr, one pair)",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Bench::Latency => "Weft Latency Test",
            Bench::Bw => "Weft Bandwidth Test",
            Bench::Bibw => "Weft Bi-Directional Bandwidth Test",
            Bench::Mr => "Weft Message Rate Test",
        }
    }

    fn metric(self) -> Metric {
        match self {
            Bench::Latency => Metric::LATENCY,
            Bench::Bw | Bench::Bibw => Metric::BANDWIDTH,
            Bench::Mr => Metric::MSG_RATE,
        }
    }

    /// Whether the benchmark exchanges windows of non-blocking messages.
    fn windowed(self) -> bool {
        self != Bench::Latency
    }

    /// The default sweep: 0 (latency, mr) or 1 (bw, bibw) byte to 4 MiB.
    fn default_sizes(self) -> Vec<usize> {
        match self {
            Bench::Latency | Bench::Mr => default_sizes(0, MAX_DEFAULT_SIZE),
            Bench::Bw | Bench::Bibw => default_sizes(1, MAX_DEFAULT_SIZE),
        }
    }

    /// Whether `size` is measured (bw and bibw skip size 0, as OSU).
    fn measures(self, size: usize) -> bool {
        size > 0 || matches!(self, Bench::Latency | Bench::Mr)
    }

    /// OSU's iteration counts at `size`, unless `--iters` / `--warmup` override them.
    fn reps(self, size: usize, iters: Option<u32>, warmup: Option<u32>) -> Reps {
        let large = size > LARGE;
        let (i, w) = match (self, large) {
            (Bench::Latency, false) => (10_000, 100),
            (Bench::Latency, true) => (1_000, 10),
            (_, false) => (100, 10),
            (_, true) => (20, 2),
        };
        Reps {
            iters: iters.unwrap_or(i),
            warmup: warmup.unwrap_or(w),
        }
    }
}

/// Options of `weft bench latency | bw | bibw | mr`.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    sweep: SweepArgs,
    /// Timed iterations (round trips, or windows) at every size [default: OSU's: latency
    /// 10000 up to 8 KiB and 1000 above; bw, bibw and mr 100 up to 8 KiB and 20 above].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    iters: Option<u32>,
    /// Untimed iterations before them at every size [default: OSU's: latency 100 up to
    /// 8 KiB and 10 above; bw, bibw and mr 10 up to 8 KiB and 2 above].
    #[arg(long, value_name = "N")]
    warmup: Option<u32>,
    /// Messages per window (bw, bibw, mr; latency ignores it).
    #[arg(long, value_name = "W", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    window: u32,
    /// Skip the same-job reference (latency: cache-line ping-pong; bw: single-core memcpy).
    #[arg(long)]
    no_limit: bool,
    /// Seconds of timed iterations per size, at most: when the previous size predicts that
    /// OSU's count would take longer (a slow link, an emulated device), fewer iterations
    /// run (at least 10; rank 0 decides and tells rank 1). 0 always runs OSU's count; an
    /// explicit --iters is never capped.
    #[arg(long, value_name = "S", default_value_t = 2.0)]
    size_budget: f64,
    /// Binding of the two processes when started alone (auto: core when the machine has
    /// two or more cores).
    #[arg(long, value_enum, default_value_t = Bind::Auto)]
    bind_to: Bind,
    /// Latency only: also time every round trip (rank 0, with the CPU's cycle counter) and
    /// print the minimum, median and 99th percentile of the one-way time next to the mean,
    /// like perftest's t_min, t_typical and 99% percentile. Off by default: the reading
    /// per round trip costs a few nanoseconds, which shows at shared-memory latencies.
    #[arg(long)]
    percentiles: bool,
    /// mr only: pairs sending at once, as osu_mbw_mr: ranks 0 to N-1 each send windows to
    /// rank i+N, and the aggregate message rate (the sum of the senders' rates) is
    /// printed. Needs a job of 2N processes (started alone, it launches one).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pairs: u32,
}

/// Parses the options of `bench` (the arguments after its name).
fn parse(bench: Bench, args: &[String]) -> Result<Args, clap::Error> {
    let argv = std::iter::once(bench.command_name().to_owned()).chain(args.iter().cloned());
    let matches = Args::command()
        .name(bench.command_name())
        .bin_name(bench.command_name())
        .about(bench.about())
        .long_about(None)
        .try_get_matches_from(argv)?;
    let args = Args::from_arg_matches(&matches)?;
    if args.pairs > 1 && bench != Bench::Mr {
        return Err(Args::command().bin_name(bench.command_name()).error(
            clap::error::ErrorKind::ArgumentConflict,
            format!(
                "--pairs is for `weft bench mr` (osu_mbw_mr), not `{}`",
                bench.command_name()
            ),
        ));
    }
    if args.percentiles && bench != Bench::Latency {
        return Err(Args::command().bin_name(bench.command_name()).error(
            clap::error::ErrorKind::ArgumentConflict,
            format!(
                "--percentiles is for `weft bench latency` (it times single round trips), not `{}`",
                bench.command_name()
            ),
        ));
    }
    Ok(args)
}

/// Runs `weft bench NAME ARGS...` for `bench` (`ARGS` are the arguments after the name);
/// returns the exit status.
pub(crate) fn main(bench: Bench, args: &[String]) -> i32 {
    let opts = match parse(bench, args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    let procs = 2 * opts.pairs;
    limit::run_or_launch_n(bench.name(), opts.bind_to, args, procs, || {
        run_rank(bench, &opts)
    })
}

/// One rank of the job: joins the fabric, measures, finalizes.
fn run_rank(bench: Bench, opts: &Args) -> Result<(), String> {
    let sweep = Sweep::new(&opts.sweep, bench.default_sizes());
    let fabric = Fabric::init().map_err(|e| e.to_string())?;
    let me = fabric.world().rank();
    let result = measure(bench, opts, &sweep, &fabric);
    let fin = fabric
        .finalize()
        .map_err(|e| format!("rank {me}: finalize: {e}"));
    result.map_err(|e| format!("rank {me}: {e}")).and(fin)
}

/// A buffer of `len` bytes that starts on a `SLOT_ALIGN` boundary.
#[derive(Debug)]
struct AlignedBuf {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` bytes, all `fill` (written, so every page is there before the timing).
    fn filled(len: usize, fill: u8) -> AlignedBuf {
        let bytes = vec![fill; len + SLOT_ALIGN];
        let start = bytes.as_ptr().align_offset(SLOT_ALIGN).min(SLOT_ALIGN);
        AlignedBuf { bytes, start, len }
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

/// Distance between two receive slots of `size`-byte messages.
fn slot_stride(size: usize) -> usize {
    size.max(1).next_multiple_of(SLOT_ALIGN)
}

/// Receive slots for `size`-byte messages with windows of `window`: as many as fit in
/// `RECV_SPAN`, at least one, at most a window.
pub(crate) fn recv_slots(size: usize, window: u32) -> usize {
    (RECV_SPAN / slot_stride(size)).clamp(1, window.max(1) as usize)
}

/// The group sizes one window's receives are posted in: `slots` at a time, the rest last.
fn groups(window: u32, slots: usize) -> impl Iterator<Item = usize> {
    let window = window as usize;
    let slots = slots.max(1);
    (0..window.div_ceil(slots)).map(move |g| slots.min(window - g * slots))
}

/// The receive side of a window: `slots` disjoint slots of one message each.
#[derive(Debug)]
struct RecvSlots {
    buf: AlignedBuf,
    size: usize,
    stride: usize,
    slots: usize,
}

impl RecvSlots {
    fn new(size: usize, window: u32) -> RecvSlots {
        let stride = slot_stride(size);
        let slots = recv_slots(size, window);
        RecvSlots {
            buf: AlignedBuf::filled(stride * slots, RECV_FILL),
            size,
            stride,
            slots,
        }
    }

    /// Posts `n` (at most `slots`) receives from `peer`, into slots 0 to n-1.
    fn post<'s>(
        &'s mut self,
        scope: &'s RequestScope<'s, '_>,
        peer: u32,
        n: usize,
    ) -> Result<Vec<Request<'s>>, P2pError> {
        let size = self.size;
        // Sized up front, as OSU's request arrays are: no reallocation in the timed loop.
        let mut reqs = Vec::with_capacity(n);
        for slot in self.buf.as_mut_slice().chunks_mut(self.stride).take(n) {
            reqs.push(scope.irecv(&mut slot[..size], Source::Rank(peer), TAG_DATA)?);
        }
        Ok(reqs)
    }

    /// Receives one window of `window` messages from `peer`, in groups of `slots`;
    /// returns the status of the last message (`None` for an empty window).
    fn receive_window(
        &mut self,
        world: &Communicator,
        peer: u32,
        window: u32,
    ) -> Result<Option<weft_fabric::Status>, P2pError> {
        let mut last = None;
        for n in groups(window, self.slots) {
            last = world.scope(|s| -> Result<_, P2pError> {
                Ok(wait_all(self.post(s, peer, n)?)?.pop())
            })?;
        }
        Ok(last)
    }

    /// The slot of message `j` of a window (posted in groups from slot 0).
    fn slot_of(&self, j: usize) -> &[u8] {
        let o = (j % self.slots) * self.stride;
        &self.buf.as_slice()[o..o + self.size]
    }
}

/// The bytes rank 0 writes at the first and the last position of its send buffer before
/// window `w`: they change from one window to the next and never equal the fill bytes.
fn stamp_bytes(w: u32) -> (u8, u8) {
    let k = (w % 64) as u8;
    (0x10 + k, 0x80 + k)
}

/// Writes window `w`'s stamp into `buf` (first byte, then last byte).
fn stamp(buf: &mut [u8], w: u32) {
    let (first, last) = stamp_bytes(w);
    if let Some(b) = buf.first_mut() {
        *b = first;
    }
    if let Some(b) = buf.last_mut() {
        *b = last;
    }
}

/// Checks that `got` (a received message of `count` bytes) holds window `w`'s stamp of a
/// `size`-byte message.
fn check_stamp(got: &[u8], count: usize, size: usize, w: u32) -> Result<(), String> {
    if count != size {
        return Err(format!(
            "the last message of the window holds {count} bytes, {size} were sent"
        ));
    }
    if size == 0 {
        return Ok(());
    }
    let (first, last) = stamp_bytes(w);
    let want_first = if size == 1 { last } else { first };
    let (g0, g1) = (got[0], got[size - 1]);
    if (g0, g1) != (want_first, last) {
        return Err(format!(
            "the last message of window {w} holds {g0:#04x} .. {g1:#04x} at its first and \
             last byte, rank 0 wrote {want_first:#04x} .. {last:#04x}"
        ));
    }
    Ok(())
}

/// Aligns the two ranks (as OSU's barrier before each size): rank 0 sends an empty
/// message and waits for rank 1's answer.
fn sync(world: &Communicator) -> Result<(), P2pError> {
    sync_with(world, 1 - world.rank(), world.rank() == 0)
}

/// [`sync`] of this rank and `peer`: the one that is `first` sends first.
fn sync_with(world: &Communicator, peer: u32, first: bool) -> Result<(), P2pError> {
    let mut none: [u8; 0] = [];
    if first {
        world.send(&none, peer, TAG_SYNC)?;
        world.recv(&mut none, Source::Rank(peer), TAG_SYNC)?;
    } else {
        world.recv(&mut none, Source::Rank(peer), TAG_SYNC)?;
        world.send(&none, peer, TAG_SYNC)?;
    }
    Ok(())
}

/// Waits without spinning until the other rank's sync message has arrived (while it
/// measures its reference alone), leaving it for the [`sync`] that follows.
fn idle_until_sync(world: &Communicator) -> Result<(), P2pError> {
    let peer = 1 - world.rank();
    while world.iprobe(Source::Rank(peer), TAG_SYNC)?.is_none() {
        std::thread::sleep(IDLE_POLL);
    }
    Ok(())
}

/// One-way latency at `size`: half the mean round trip of `reps.iters` blocking
/// ping-pongs after `reps.warmup` untimed ones; with `timed`, rank 0 also times every round
/// trip ([`OneWay::dist`]).
fn latency(
    world: &Communicator,
    size: usize,
    reps: Reps,
    timed: bool,
    sbuf: &[u8],
    rbuf: &mut [u8],
) -> Result<OneWay, P2pError> {
    let peer = 1 - world.rank();
    let (sbuf, rbuf) = (&sbuf[..size], &mut rbuf[..size]);
    let first = world.rank() == 0;
    // Cycle-counter readings at the start of the timed round trips and after the last:
    // written in place (the pages touched now, not during the loop).
    let mut marks = vec![
        0u64;
        if timed && first {
            reps.iters as usize + 1
        } else {
            0
        }
    ];
    sync(world)?;
    let mut t0 = Instant::now();
    for i in 0..reps.total() {
        if i == reps.warmup {
            t0 = Instant::now();
            if let Some(m) = marks.first_mut() {
                *m = cycles();
            }
        }
        if first {
            world.send(sbuf, peer, TAG_DATA)?;
            world.recv(rbuf, Source::Rank(peer), TAG_DATA)?;
            if i >= reps.warmup {
                if let Some(m) = marks.get_mut((i - reps.warmup + 1) as usize) {
                    *m = cycles();
                }
            }
        } else {
            world.recv(rbuf, Source::Rank(peer), TAG_DATA)?;
            world.send(sbuf, peer, TAG_DATA)?;
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    black_box(&rbuf);
    Ok(OneWay {
        mean_us: elapsed * 1e6 / (2.0 * f64::from(reps.iters)),
        dist: one_way_of_marks(&marks, elapsed),
    })
}

/// The one-way latency of a size: the mean (OSU's figure), and with `--percentiles` the
/// distribution over single round trips (rank 0).
#[derive(Debug, Clone, Copy)]
struct OneWay {
    mean_us: f64,
    dist: Option<Summary>,
}

/// The one-way times of consecutive round trips from cycle-counter `marks` around them,
/// which took `elapsed` seconds in all (that gives the counter's rate); `None` without a
/// round trip.
fn one_way_of_marks(marks: &[u64], elapsed: f64) -> Option<Summary> {
    let (&start, &end) = (marks.first()?, marks.last()?);
    if marks.len() < 2 || end <= start || elapsed <= 0.0 {
        return None;
    }
    let us_per_cycle = elapsed * 1e6 / (end - start) as f64;
    Summary::of_us(
        marks
            .windows(2)
            .map(|w| w[1].wrapping_sub(w[0]) as f64 * us_per_cycle / 2.0)
            .collect(),
    )
}

/// A reading of a cheap, steady cycle counter for timing single round trips: RDTSC on
/// x86_64 (an instruction, where reading the clock may be a system call: inside the
/// soft-RoCE VM the kernel's clocksource is the HPET), the monotonic clock in nanoseconds
/// elsewhere. Only differences matter; [`one_way_of_marks`] converts them.
#[inline(always)]
fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no preconditions (it reads a counter; user mode may run it
        // unless the kernel disabled it, which Linux does not).
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// The two ends of a [`unidirectional`] exchange: this rank's peer, and whether this rank
/// sends.
#[derive(Debug, Clone, Copy)]
struct Pair {
    peer: u32,
    sender: bool,
}

impl Pair {
    /// Rank 0 sends to rank 1.
    fn of_two(world: &Communicator) -> Pair {
        Pair {
            peer: 1 - world.rank(),
            sender: world.rank() == 0,
        }
    }
}

/// `bw` and `mr`: windows of `window` messages from the sender to its peer (rank 0 to rank
/// 1, or a pair of `mr --pairs`), each followed by a 1-byte ack; the last window's data is
/// checked. Returns this rank's time of the timed windows.
fn unidirectional(
    world: &Communicator,
    pair: Pair,
    size: usize,
    window: u32,
    reps: Reps,
    sbuf: &mut [u8],
    slots: &mut RecvSlots,
) -> Result<Duration, String> {
    let p2p = |e: P2pError| format!("size {size}: {e}");
    let Pair { peer, sender } = pair;
    let last = reps.total() - 1;
    let mut ack = [ACK_OK];
    sync_with(world, peer, sender).map_err(p2p)?;
    let mut t0 = Instant::now();
    for w in 0..reps.total() {
        if w == reps.warmup {
            t0 = Instant::now();
        }
        if sender {
            stamp(&mut sbuf[..size], w);
            let data = &sbuf[..size];
            world
                .scope(|s| {
                    let mut reqs = Vec::with_capacity(window as usize);
                    for _ in 0..window {
                        reqs.push(s.isend(data, peer, TAG_DATA)?);
                    }
                    wait_all(reqs)
                })
                .map_err(p2p)?;
            world
                .recv(&mut ack, Source::Rank(peer), TAG_ACK)
                .map_err(p2p)?;
        } else {
            let status = slots.receive_window(world, peer, window).map_err(p2p)?;
            let mut verdict = Ok(());
            if w == last {
                let count = status.map_or(size, |s| s.count);
                verdict = check_stamp(slots.slot_of(window as usize - 1), count, size, w);
            }
            ack[0] = if verdict.is_ok() { ACK_OK } else { ACK_BAD };
            world.send(&ack, peer, TAG_ACK).map_err(p2p)?;
            verdict.map_err(|e| format!("size {size}: data check failed: {e}"))?;
        }
    }
    let t = t0.elapsed();
    if sender && ack[0] != ACK_OK {
        return Err(format!(
            "size {size}: rank {peer} found the data of the last window corrupted (it says how)"
        ));
    }
    Ok(t)
}

/// `bibw`: each rank posts a window of receives (in groups of its slots) and a window of
/// sends to the other, then waits for all. Returns this rank's time of the timed windows.
fn bidirectional(
    world: &Communicator,
    size: usize,
    window: u32,
    reps: Reps,
    sbuf: &[u8],
    slots: &mut RecvSlots,
) -> Result<Duration, P2pError> {
    let peer = 1 - world.rank();
    let data = &sbuf[..size];
    sync(world)?;
    let mut t0 = Instant::now();
    for w in 0..reps.total() {
        if w == reps.warmup {
            t0 = Instant::now();
        }
        let mut groups = groups(window, slots.slots);
        let first = groups.next().unwrap_or(0);
        world.scope(|s| -> Result<(), P2pError> {
            let mut sends = Vec::with_capacity(window as usize);
            for _ in 0..window {
                sends.push(s.isend(data, peer, TAG_DATA)?);
            }
            world.scope(|r| -> Result<(), P2pError> {
                wait_all(slots.post(r, peer, first)?)?;
                Ok(())
            })?;
            for n in groups {
                world.scope(|r| -> Result<(), P2pError> {
                    wait_all(slots.post(r, peer, n)?)?;
                    Ok(())
                })?;
            }
            wait_all(sends)?;
            Ok(())
        })?;
    }
    Ok(t0.elapsed())
}

/// The iterations of one size under a time budget: rank 0 fits OSU's count into
/// `budget` seconds by its `estimate` of one iteration (at least 10 timed iterations,
/// warm-up shrunk alike) and tells rank 1, so both run the same count.
fn budgeted(
    world: &Communicator,
    base: Reps,
    estimate: Option<f64>,
    budget: f64,
) -> Result<Reps, P2pError> {
    let mut agreed = [base.iters, base.warmup];
    if world.rank() == 0 {
        if let Some(per) = estimate.filter(|&p| p > 0.0) {
            let fit = (budget / per).floor().min(f64::from(base.iters)) as u32;
            let iters = fit.max(10.min(base.iters));
            if iters < base.iters {
                let warmup = base.warmup.min((iters / 5).max(1));
                agreed = [iters, warmup];
            }
        }
        world.send(&agreed, 1, TAG_REPS)?;
    } else {
        world.recv(&mut agreed, Source::Rank(0), TAG_REPS)?;
    }
    Ok(Reps {
        iters: agreed[0],
        warmup: agreed[1],
    })
}

/// Rank 1 sends its CPU list to rank 0 (which also connects the two); rank 0 returns it.
fn peer_cpus(world: &Communicator) -> Result<Option<String>, P2pError> {
    if world.rank() == 1 {
        world.send(limit::cpus_of_this_process().as_bytes(), 0, TAG_INFO)?;
        return Ok(None);
    }
    let st = world.probe(Source::Rank(1), TAG_INFO)?;
    let mut buf = vec![0u8; st.count];
    world.recv(&mut buf, Source::Rank(1), TAG_INFO)?;
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

/// The fabric's tunables as this job sees them (`VAR=value`, marked when defaulted).
fn tunables() -> String {
    weft_fabric::TUNABLES
        .iter()
        .map(|t| match std::env::var(t.name) {
            Ok(v) => format!("{}={v}", t.name),
            Err(_) => format!("{}={} (default)", t.name, t.default),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The header comment of the fabric's series.
fn describe(bench: Bench, opts: &Args, cpus: (&str, &str)) -> String {
    let small = bench.reps(LARGE, opts.iters, opts.warmup);
    let large = bench.reps(LARGE + 1, opts.iters, opts.warmup);
    let counts = format!(
        "{} after {} warm-up up to 8 KiB, {} after {} above",
        small.iters, small.warmup, large.iters, large.warmup
    );
    let what = match bench {
        Bench::Latency => format!(
            "blocking send/recv ping-pong, one way = half the round trip;\nround trips: {counts}{}",
            if opts.percentiles {
                ";\nMin, Median and P99 (--percentiles): of half of each round trip, timed by rank 0 \
                 with the CPU's cycle counter"
            } else {
                ""
            }
        ),
        Bench::Bw | Bench::Mr => format!(
            "windows of {w} isend + wait_all, then a 1-byte ack; windows: {counts};\n\
             rank 1 receives into slots spanning at most {span} KiB per group of a window \
             (all {w} up to {all} B);\n\
             data checked: first and last byte of the last message of each size",
            w = opts.window,
            span = RECV_SPAN >> 10,
            all = RECV_SPAN / opts.window.max(1) as usize,
        ),
        Bench::Bibw => format!(
            "both ranks post a window of {w} irecv and {w} isend, then wait for all;\nwindows: \
             {counts}; receives into slots spanning at most {span} KiB per group (all {w} up \
             to {all} B); bandwidth = both directions' bytes / rank 0's time",
            w = opts.window,
            span = RECV_SPAN >> 10,
            all = RECV_SPAN / opts.window.max(1) as usize,
        ),
    };
    format!(
        "2 processes: rank 0 on CPUs {}, rank 1 on CPUs {}\n{what}\n{}",
        cpus.0,
        cpus.1,
        tunables()
    )
}

/// Everything both ranks do; rank 0 prints.
fn measure(bench: Bench, opts: &Args, sweep: &Sweep, fabric: &Fabric) -> Result<(), String> {
    let world = fabric.world();
    if opts.pairs > 1 {
        return pairs::measure(opts, sweep, &world);
    }
    if world.size() != 2 {
        return Err(format!(
            "needs a job of exactly 2 processes (weft run -n 2; mr --pairs N takes 2N), this \
             one has {}",
            world.size()
        ));
    }
    let me = world.rank();
    let io_err = |e: io::Error| format!("writing the report: {e}");
    let peer_cpus = peer_cpus(&world).map_err(|e| format!("connecting: {e}"))?;
    let sizes: Vec<usize> = sweep
        .sizes()
        .iter()
        .copied()
        .filter(|&s| bench.measures(s))
        .collect();
    let mut reference = reference_before(bench, opts, &sizes, fabric, &world)?;

    let mut report = if me == 0 {
        let mut r = Report::new(
            &opts.sweep,
            sweep,
            bench.name(),
            bench.title(),
            bench.metric(),
        )
        .label("weft")
        .field("impl", "weft");
        let mine = limit::cpus_of_this_process();
        let theirs = peer_cpus.as_deref().unwrap_or("?");
        r.comment(&describe(bench, opts, (&mine, theirs)))
            .map_err(io_err)?;
        Some(r)
    } else {
        None
    };

    let max = sizes.iter().copied().max().unwrap_or(0);
    let mut sbuf = AlignedBuf::filled(max, SEND_FILL);
    let mut rbuf = AlignedBuf::filled(if bench.windowed() { 0 } else { max }, RECV_FILL);
    let mut rows = Vec::with_capacity(sizes.len());
    // Rank 0's (size, seconds per iteration) of the last size measured.
    let mut prev: Option<(usize, f64)> = None;
    let mut capped_said = false;
    for (k, &size) in sizes.iter().enumerate() {
        if k == 0 && matches!(reference, Reference::Memcpy { .. }) && me == 1 {
            // Rank 0 measured memcpy alone; wait for it without taking a core's share.
            idle_until_sync(&world).map_err(|e| format!("waiting for rank 0's memcpy: {e}"))?;
        }
        let base = bench.reps(size, opts.iters, opts.warmup);
        let reps = if opts.iters.is_some() || opts.size_budget <= 0.0 {
            base
        } else {
            // The previous size's time per iteration, scaled up by the size ratio.
            let estimate = prev.map(|(s, per): (usize, f64)| {
                per * (size.max(1) as f64 / s.max(1) as f64).max(1.0)
            });
            budgeted(&world, base, estimate, opts.size_budget)
                .map_err(|e| format!("size {size}: agreeing on iterations: {e}"))?
        };
        if reps != base && !capped_said {
            capped_said = true;
            if let Some(r) = &mut report {
                r.comment(&format!(
                    "from {size} B up, fewer iterations than OSU's so that each size takes about {} s (--size-budget)",
                    opts.size_budget
                ))
                .map_err(io_err)?;
            }
        }
        let per_window = f64::from(opts.window) * f64::from(reps.iters);
        let mut dist = None;
        let value = match bench {
            Bench::Latency => {
                let l = latency(
                    &world,
                    size,
                    reps,
                    opts.percentiles,
                    sbuf.as_slice(),
                    rbuf.as_mut_slice(),
                )
                .map_err(|e| format!("size {size}: {e}"))?;
                dist = l.dist;
                l.mean_us
            }
            Bench::Bw | Bench::Mr => {
                let mut slots = RecvSlots::new(if me == 1 { size } else { 0 }, opts.window);
                let t = unidirectional(
                    &world,
                    Pair::of_two(&world),
                    size,
                    opts.window,
                    reps,
                    sbuf.as_mut_slice(),
                    &mut slots,
                )?
                .as_secs_f64();
                if bench == Bench::Bw {
                    size as f64 * per_window / t / 1e6
                } else {
                    per_window / t
                }
            }
            Bench::Bibw => {
                let mut slots = RecvSlots::new(size, opts.window);
                let t = bidirectional(&world, size, opts.window, reps, sbuf.as_slice(), &mut slots)
                    .map_err(|e| format!("size {size}: {e}"))?
                    .as_secs_f64();
                2.0 * size as f64 * per_window / t / 1e6
            }
        };
        rows.push((size, value));
        if let Some(r) = &mut report {
            match dist {
                Some(d) => r.row_with(
                    size,
                    value,
                    &[
                        ("min_us", "Min (us)", d.min_us),
                        ("median_us", "Median (us)", d.median_us),
                        ("p99_us", "P99 (us)", d.p99_us),
                    ],
                ),
                None => r.row(size, value),
            }
            .map_err(io_err)?;
        }
        // Seconds per iteration (a round trip, or a window) at this size.
        let per = match bench {
            Bench::Latency => 2.0 * value / 1e6,
            Bench::Bw | Bench::Bibw => {
                let bytes = if bench == Bench::Bibw { 2.0 } else { 1.0 } * size as f64;
                bytes * f64::from(opts.window) / (value * 1e6).max(1.0)
            }
            Bench::Mr => f64::from(opts.window) / value.max(1.0),
        };
        prev = Some((size, per));
    }

    reference_after(&mut reference, &sizes, fabric, &world)?;
    if let Some(mut r) = report {
        write_reference(&mut r, &reference).map_err(io_err)?;
        if let Some(c) = ratio_comment(&rows, &reference) {
            r.comment(&c).map_err(io_err)?;
        }
        r.finish().map_err(io_err)?;
    }
    // Rank 1 stays until rank 0 has measured alone and printed (the output and the plot).
    if me == 1 && matches!(reference, Reference::Memcpy { .. }) {
        idle_until_sync(&world).map_err(|e| format!("waiting for rank 0's memcpy: {e}"))?;
    }
    sync(&world).map_err(|e| format!("final sync: {e}"))
}

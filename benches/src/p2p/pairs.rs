//! `weft bench mr --pairs N` (osu_mbw_mr): several pairs sending at once, the aggregate
//! message rate.

use std::io;

use weft_collectives::{Collectives, Op};
use weft_fabric::Communicator;

use super::{tunables, unidirectional, AlignedBuf, Args, Bench, Pair, RecvSlots, LARGE, SEND_FILL};
use crate::osu::{Report, Sweep};

/// `mr --pairs N` (osu_mbw_mr): ranks 0 to N-1 each send windows to rank i+N, all pairs at
/// once after a barrier; each size's figure is the sum of the senders' message rates.
/// Neither the same-job reference nor the time budget applies (OSU's counts, or --iters).
pub(super) fn measure(opts: &Args, sweep: &Sweep, world: &Communicator) -> Result<(), String> {
    let pairs = opts.pairs;
    if world.size() != 2 * pairs {
        return Err(format!(
            "--pairs {pairs} needs a job of {} processes (weft run -n {}), this one has {}",
            2 * pairs,
            2 * pairs,
            world.size()
        ));
    }
    let me = world.rank();
    let pair = Pair {
        peer: (me + pairs) % (2 * pairs),
        sender: me < pairs,
    };
    let io_err = |e: io::Error| format!("writing the report: {e}");
    let coll = |e: weft_collectives::CollError| e.to_string();
    let sizes = sweep.sizes().to_vec();
    let mut report = if me == 0 {
        let mut r = Report::new(
            &opts.sweep,
            sweep,
            Bench::Mr.name(),
            Bench::Mr.title(),
            Bench::Mr.metric(),
        )
        .label("weft")
        .field("impl", "weft")
        .field("pairs", pairs);
        let counts = (
            Bench::Mr.reps(LARGE, opts.iters, opts.warmup),
            Bench::Mr.reps(LARGE + 1, opts.iters, opts.warmup),
        );
        r.comment(&format!(
            "{pairs} pairs at once: rank i sends to rank i+{pairs} (i < {pairs}), as osu_mbw_mr;\n\
             windows of {w} isend + wait_all, then a 1-byte ack; windows: {} after {} warm-up \
             up to 8 KiB, {} after {} above;\n\
             messages/s = the sum of the senders' rates; data checked as for one pair\n{}",
            counts.0.iters,
            counts.0.warmup,
            counts.1.iters,
            counts.1.warmup,
            tunables(),
            w = opts.window,
        ))
        .map_err(io_err)?;
        Some(r)
    } else {
        None
    };
    let max = sizes.iter().copied().max().unwrap_or(0);
    let mut sbuf = AlignedBuf::filled(if pair.sender { max } else { 0 }, SEND_FILL);
    for &size in &sizes {
        let reps = Bench::Mr.reps(size, opts.iters, opts.warmup);
        let mut slots = RecvSlots::new(if pair.sender { 0 } else { size }, opts.window);
        world.barrier().map_err(coll)?;
        let t = unidirectional(
            world,
            pair,
            size,
            opts.window,
            reps,
            sbuf.as_mut_slice(),
            &mut slots,
        )?
        .as_secs_f64();
        let rate = if pair.sender {
            f64::from(opts.window) * f64::from(reps.iters) / t
        } else {
            0.0
        };
        let mut total = [0f64];
        world
            .allreduce(&[rate], &mut total, Op::Sum)
            .map_err(coll)?;
        if let Some(r) = &mut report {
            r.row(size, total[0]).map_err(io_err)?;
        }
    }
    if let Some(r) = report {
        r.finish().map_err(io_err)?;
    }
    world.barrier().map_err(coll)
}

//! The same-job reference a benchmark is compared with: the cache-line ping-pong
//! (latency) or single-core memcpy (bw), measured before and after the sweep, and the
//! ratio printed under the table.

use std::io;

use super::*;

/// The same-job reference of a benchmark: measured before its sweep, and again after it
/// to show whether the floor moved meanwhile.
#[derive(Debug)]
// One per run: boxing the cache-line results would save nothing worth the indirection.
#[allow(clippy::large_enum_variant)]
pub(super) enum Reference {
    /// None (`--no-limit`, or bibw and mr).
    None,
    /// Latency: the cache-line ping-pong (rank 0's results; `None` elsewhere).
    CacheLine {
        /// Before the sweep.
        before: Option<CacheLine>,
        /// After the sweep.
        after: Option<CacheLine>,
    },
    /// Bw: single-core memcpy in rank 0 (empty on rank 1).
    Memcpy {
        /// MB/s at each size of the sweep, before it.
        before: Vec<(usize, f64)>,
        /// MB/s at the size of the ratio, after the sweep.
        after: Option<(usize, f64)>,
    },
}

/// A floor that moves by more than this factor between before and after the sweep is
/// reported with a warning.
const DRIFT: f64 = 1.2;

/// The size the latency ratio is taken at: 8 bytes, else the first non-zero size.
pub(super) fn latency_ratio_size(sizes: &[usize]) -> Option<usize> {
    sizes
        .iter()
        .copied()
        .find(|&s| s == 8)
        .or_else(|| sizes.iter().copied().find(|&s| s > 0))
        .or(sizes.first().copied())
}

/// The size the bandwidth ratio is taken at: 4 MiB, else the largest size.
pub(super) fn bw_ratio_size(sizes: &[usize]) -> Option<usize> {
    if sizes.contains(&MAX_DEFAULT_SIZE) {
        Some(MAX_DEFAULT_SIZE)
    } else {
        sizes.iter().copied().filter(|&s| s > 0).max()
    }
}

/// Measures the reference before the sweep (`sizes`: the sizes the sweep measures).
pub(super) fn reference_before(
    bench: Bench,
    opts: &Args,
    sizes: &[usize],
    fabric: &Fabric,
    world: &Communicator,
) -> Result<Reference, String> {
    if opts.no_limit {
        return Ok(Reference::None);
    }
    let peer = 1 - world.rank();
    if !fabric.reaches_by_shm(world.job_rank(peer)) {
        // The floors are shared-memory ones: no reference for a pair talking over verbs.
        if world.rank() == 0 {
            eprintln!(
                "weft bench: the two ranks talk over verbs; no shared-memory floor is measured"
            );
        }
        return Ok(Reference::None);
    }
    match bench {
        Bench::Latency => Ok(Reference::CacheLine {
            before: cache_line(fabric, true)?,
            after: None,
        }),
        Bench::Bw => Ok(Reference::Memcpy {
            before: if world.rank() == 0 {
                sizes
                    .iter()
                    .map(|&s| (s, limit::memcpy_mbs(s, MEMCPY_SLOTS)))
                    .collect()
            } else {
                Vec::new()
            },
            after: None,
        }),
        Bench::Bibw | Bench::Mr => Ok(Reference::None),
    }
}

/// Measures the reference again after the sweep: the cache line (both ranks), or rank 0's
/// memcpy at the size of the ratio (rank 1 does nothing).
pub(super) fn reference_after(
    reference: &mut Reference,
    sizes: &[usize],
    fabric: &Fabric,
    world: &Communicator,
) -> Result<(), String> {
    match reference {
        // The busy line only before the sweep (the report shows that one).
        Reference::CacheLine { after, .. } => *after = cache_line(fabric, false)?,
        Reference::Memcpy { after, .. } if world.rank() == 0 => {
            *after = bw_ratio_size(sizes).map(|s| (s, limit::memcpy_mbs(s, MEMCPY_SLOTS)));
        }
        Reference::Memcpy { .. } | Reference::None => {}
    }
    Ok(())
}

/// `weft bench limit`'s cache-line ping-pong between the two ranks (rank 0's result),
/// with or without the busy runs.
fn cache_line(fabric: &Fabric, busy: bool) -> Result<Option<CacheLine>, String> {
    let pp = PingPong {
        busy,
        ..PingPong::default()
    };
    limit::cacheline_one_way(fabric.wire(), pp)
        .map_err(|e| format!("cache-line reference (--no-limit skips it): {e}"))
}

/// The value of the row of `size`, if measured.
fn value_at(rows: &[(usize, f64)], size: usize) -> Option<f64> {
    rows.iter().find(|r| r.0 == size).map(|r| r.1)
}

/// A warning when `a` and `b` (the floor before and after the sweep) differ by more than
/// `DRIFT`.
fn drift_warning(what: &str, a: f64, b: f64, unit: &str) -> String {
    if a.min(b) > 0.0 && a.max(b) / a.min(b) > DRIFT {
        format!(
            "\nwarning: the {what} moved from {a:.3} {unit} before the sweep to {b:.3} {unit} \
             after it (the host moved the virtual CPUs?): compare with care"
        )
    } else {
        String::new()
    }
}

/// The floor of the latency reference: the lower cache-line median of before and after.
fn cache_line_floor(before: &CacheLine, after: Option<&CacheLine>) -> f64 {
    let b = before.one_way.median_us;
    after.map_or(b, |a| b.min(a.one_way.median_us))
}

/// The table's closing comment: the ratio of the fabric to its same-job reference.
pub(super) fn ratio_comment(weft: &[(usize, f64)], reference: &Reference) -> Option<String> {
    let sizes: Vec<usize> = weft.iter().map(|r| r.0).collect();
    match reference {
        Reference::CacheLine {
            before: Some(b),
            after,
        } => {
            let floor = cache_line_floor(b, after.as_ref());
            let size = latency_ratio_size(&sizes)?;
            let lat = value_at(weft, size)?;
            let (bm, am) = (
                b.one_way.median_us,
                after.as_ref().map(|a| a.one_way.median_us),
            );
            let both = am.map_or(String::new(), |am| {
                format!(", the lower of {bm:.3} before the sweep and {am:.3} after")
            });
            let warn = am.map_or(String::new(), |am| {
                drift_warning("cache-line one-way time", bm, am, "us")
            });
            let busy = b.busy.as_ref().map_or(String::new(), |busy| {
                format!(
                    "\n(the cache line with {:.0} ns of work per turn on each side: {:.3} us one way)",
                    limit::BUSY_NS,
                    busy.median_us
                )
            });
            Some(format!(
                "weft/limit at {size} B: {:.2} (weft {lat:.3} us one way, cache line {floor:.3} us{both}; same job){warn}{busy}",
                lat / floor
            ))
        }
        Reference::Memcpy { before, after } => {
            let size = bw_ratio_size(&sizes)?;
            let bw = value_at(weft, size)?;
            let mb = value_at(before, size)?;
            let ma = after.filter(|a| a.0 == size).map(|a| a.1);
            let mc = ma.map_or(mb, |ma| mb.max(ma));
            let both = ma.map_or(String::new(), |ma| {
                format!(", the higher of {mb:.1} before the sweep and {ma:.1} after")
            });
            let warn = ma.map_or(String::new(), |ma| {
                drift_warning("memcpy bandwidth", mb, ma, "MB/s")
            });
            Some(format!(
                "weft/memcpy at {size} B: {:.2} (weft {bw:.1} MB/s, single-core memcpy {mc:.1} MB/s{both}; same job){warn}",
                bw / mc
            ))
        }
        Reference::CacheLine { before: None, .. } | Reference::None => None,
    }
}

/// `us` rounded to 4 decimals, as the JSON rows carry their values.
fn json_us(us: f64) -> f64 {
    (us * 1e4).round() / 1e4
}

/// Prints the reference series after the fabric's (rank 0). In JSON, the cache-line row
/// also carries `before_us` and `after_us`, and `busy_before_us`: the line with
/// [`limit::BUSY_NS`] of work per turn on each side, before the sweep.
pub(super) fn write_reference(r: &mut Report, reference: &Reference) -> io::Result<()> {
    match reference {
        Reference::CacheLine {
            before: Some(b),
            after,
        } => {
            r.series("limit: cache-line ping-pong")?;
            r.set_field("impl", "limit");
            let pp = PingPong::default();
            let run = |when: &str, l: &CacheLine| {
                format!(
                    "{when} {:.3} us (min {:.3}, max {:.3})",
                    l.one_way.median_us, l.one_way.min_us, l.one_way.max_us
                )
            };
            let mut text = format!(
                "ranks 0 and 1 (CPUs {} and {}) bounce one 64-byte line; one way, median of {} \
                 runs of {} round trips:\n{}",
                b.cpus.0,
                b.cpus.1,
                pp.runs,
                pp.round_trips,
                run("before the sweep", b)
            );
            r.set_field("before_us", json_us(b.one_way.median_us));
            if let Some(busy) = &b.busy {
                r.set_field("busy_before_us", json_us(busy.median_us));
            }
            if let Some(a) = after {
                text.push_str(&format!(", {}; the row is the lower", run("after", a)));
                r.set_field("after_us", json_us(a.one_way.median_us));
            }
            r.comment(&text)?;
            r.row(64, cache_line_floor(b, after.as_ref()))
        }
        Reference::Memcpy { before, after } => {
            r.series("limit: single-core memcpy")?;
            r.set_field("impl", "limit");
            let mut text = format!(
                "rank 0 alone before the sweep, buffers of {MEMCPY_SLOTS} slots (as weft bench limit)"
            );
            if let Some((s, v)) = after {
                text.push_str(&format!(
                    ";\nagain at {s} B after the sweep: {v:.1} MB/s (the row of {s} B is the higher)"
                ));
            }
            r.comment(&text)?;
            before.iter().try_for_each(|&(s, v)| {
                let v = match after {
                    Some((a, av)) if *a == s => v.max(*av),
                    _ => v,
                };
                r.row(s, v)
            })
        }
        Reference::CacheLine { before: None, .. } | Reference::None => Ok(()),
    }
}

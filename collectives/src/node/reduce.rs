//! Reductions through the node segment: small ones through the members' lines and cells
//! (every member takes every payload as it arrives and reduces in rank order), large ones
//! with single-copy reads (two members: each reads the other's whole input up to
//! `PAIR_MAX`; otherwise reduce-scatter in `CHUNK`s, then every member reads the others'
//! reduced segments).

use super::*;

impl NodeColl {
    /// Reduce (to `root`, or to everyone when `root` is `None`) of `count` elements from
    /// `mine` (this member's input: the send buffer, or `recv` itself in place) into
    /// `recv`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn reduce<T: Element>(
        &self,
        op_name: &'static str,
        comm: &Communicator,
        mine: Input<'_, T>,
        recv: &mut [T],
        count: usize,
        op: &Op<T>,
        root: Option<u32>,
        small: bool,
    ) -> Result<(), CollError> {
        let mut run = self.begin(op_name, comm)?;
        let bytes = count * std::mem::size_of::<T>();
        let kind = if root.is_some() {
            Kind::Reduce
        } else {
            Kind::Allreduce
        };
        let w = word(run.base, kind, root, bytes);
        run.wait_all(run.base)?;
        if small {
            self.reduce_small(&mut run, w, mine, recv, count, op, root)
        } else {
            self.reduce_large(&mut run, w, mine, recv, count, op, root)
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce_small<T: Element>(
        &self,
        run: &mut Run<'_>,
        w: u64,
        mine: Input<'_, T>,
        recv: &mut [T],
        count: usize,
        op: &Op<T>,
        root: Option<u32>,
    ) -> Result<(), CollError> {
        let n = self.seg.members();
        let bytes = count * std::mem::size_of::<T>();
        match mine {
            Some(m) => self.seg.put(run.slot(), as_bytes(m)),
            None => self.seg.put(run.slot(), as_bytes(&recv[..count])),
        }
        run.publish(w, run.fin());
        if root.is_some_and(|r| r != run.comm.rank()) {
            return Ok(());
        }
        // Every member's payload, in the communicator's scratch (kept between operations:
        // no allocation here once it has grown).
        let mut scratch = std::mem::take(&mut run.st.scratch);
        if scratch.len() * 16 < n * bytes {
            scratch.resize((n * bytes).div_ceil(16), 0);
        }
        let res = (|| {
            let all = &mut as_bytes_mut(&mut scratch[..])[..n * bytes];
            run.wait_all_taking(run.fin(), w, all)?;
            // x0 op (x1 op (... op x(n-1))), from the right, the same bits everywhere.
            let out = &mut recv[..count];
            as_bytes_mut(out).copy_from_slice(&all[(n - 1) * bytes..]);
            for r in (0..n - 1).rev() {
                let input = cast_slice::<T>(&all[r * bytes..(r + 1) * bytes])
                    .ok_or_else(|| misaligned(run.op))?;
                apply(op, input, out);
            }
            Ok(())
        })();
        run.st.scratch = scratch;
        res
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce_large<T: Element>(
        &self,
        run: &mut Run<'_>,
        w: u64,
        mine: Input<'_, T>,
        recv: &mut [T],
        count: usize,
        op: &Op<T>,
        root: Option<u32>,
    ) -> Result<(), CollError> {
        let n = self.seg.members();
        let me = run.comm.rank() as usize;
        let es = std::mem::size_of::<T>();
        let bytes = count * es;
        let seg_of = |r: usize| (count * r / n, count * (r + 1) / n);
        let (lo, hi) = seg_of(me);
        // This member's reduced segment goes to its receive buffer when it gets the
        // result, else to scratch (where the root reads it).
        let in_recv = root.is_none_or(|r| r as usize == me);
        let chunk = (CHUNK / es).max(1);
        let partial = if in_recv { 0 } else { (hi - lo) * es };
        let scratch_bytes = 2 * chunk * es + partial;
        let st = &mut run.st;
        if st.scratch.len() * 16 < scratch_bytes {
            st.scratch.resize(scratch_bytes.div_ceil(16), 0);
        }
        let mut scratch = std::mem::take(&mut st.scratch);
        let res = (|| {
            let part = &as_bytes(&scratch[..])[2 * chunk * es..][..partial];
            let input_addr = mine.map_or(recv.as_ptr() as usize, |m| m.as_ptr() as usize);
            let out_addr = if in_recv {
                recv[lo..].as_ptr() as usize
            } else {
                part.as_ptr() as usize
            };
            run.put_desc(input_addr, out_addr);
            run.publish(w, run.slot());
            run.wait_all(run.slot())?;
            run.check_all(w)?;
            Ok(())
        })();
        if let Err(e) = res {
            // Everyone saw the same words: they all stop here too.
            run.st.scratch = scratch;
            run.enter(run.fin());
            return Err(e);
        }
        // (Not for an allreduce in place: each would overwrite what the other reads.)
        let overwrites = mine.is_none() && root.is_none();
        if n == 2 && op.commutative() && bytes <= PAIR_MAX && !overwrites {
            let res = cast_slice_mut::<T>(&mut as_bytes_mut(&mut scratch[..])[..chunk * es])
                .ok_or_else(|| misaligned(run.op))
                .and_then(|tmp| reduce_pair(run, tmp, mine, recv, count, op, root));
            run.st.scratch = scratch;
            return res.map_err(|e| run.fail(e));
        }
        let res = (|| {
            let (tmps, part) = as_bytes_mut(&mut scratch[..]).split_at_mut(2 * chunk * es);
            let part = &mut part[..partial];
            let (tmp, save) = tmps.split_at_mut(chunk * es);
            let tmp = cast_slice_mut::<T>(tmp).ok_or_else(|| misaligned(run.op))?;
            let save = cast_slice_mut::<T>(save).ok_or_else(|| misaligned(run.op))?;
            let descs: Vec<[u64; 2]> = (0..n).map(|r| run.desc(r)).collect();
            // The order of the contributions: commutative ones start from another
            // member's input read straight into the output (or from this member's own
            // when it is already there, in place); the others go right to left.
            let out_is_input = mine.is_none() && in_recv;
            let order: Vec<usize> = if op.commutative() {
                if out_is_input {
                    std::iter::once(me)
                        .chain((1..n).map(|k| (me + k) % n))
                        .collect()
                } else {
                    let first = (me + 1) % n;
                    std::iter::once(first)
                        .chain(std::iter::once(me))
                        .chain((2..n).map(|k| (me + k) % n))
                        .collect()
                }
            } else {
                (0..n).rev().collect()
            };
            let (out_all, input): (&mut [T], Option<&[T]>) = if in_recv {
                (&mut recv[lo..hi], mine)
            } else {
                let p = cast_slice_mut::<T>(part).ok_or_else(|| misaligned(run.op))?;
                let inp = match mine {
                    Some(m) => m,
                    None => &recv[..count],
                };
                (p, Some(inp))
            };
            let mut a = lo;
            while a < hi {
                let b = (a + chunk).min(hi);
                let out = &mut out_all[a - lo..b - lo];
                let saved = &mut save[..b - a];
                if out_is_input && order[0] != me {
                    saved.copy_from_slice(out);
                }
                for (i, &c) in order.iter().enumerate() {
                    let at = descs[c][0] + (a * es) as u64;
                    if i == 0 {
                        if c != me {
                            run.read(c, at, as_bytes_mut(out))?;
                        } else if let Some(inp) = input {
                            out.copy_from_slice(&inp[a..b]);
                        }
                        continue;
                    }
                    if c == me {
                        match input {
                            Some(inp) => apply(op, &inp[a..b], out),
                            None => apply(op, saved, out),
                        }
                    } else {
                        let t = &mut tmp[..b - a];
                        run.read(c, at, as_bytes_mut(t))?;
                        apply(op, t, out);
                    }
                }
                a = b;
            }
            run.enter(run.base + 2);
            run.wait_all(run.base + 2)?;
            // The reduced segments.
            if in_recv {
                for k in 1..n {
                    let r = (me + k) % n;
                    let (l, h) = seg_of(r);
                    run.read(r, descs[r][1], as_bytes_mut(&mut recv[l..h]))?;
                }
            }
            run.enter(run.fin());
            if root.is_none() {
                // The others read this member's segment until they enter the last stage.
                run.wait_all(run.fin())?;
            }
            Ok(())
        })();
        run.st.scratch = scratch;
        res.map_err(|e| run.fail(e))
    }
}

/// A single-copy reduction of two members with a commutative operation: whoever gets
/// the result reads the other's whole input (clean in its cache, where reduced segments
/// would be dirty in the other core's) and reduces it into its own, `mine op theirs`
/// (the same bits at both: two operands commute exactly).
#[allow(clippy::too_many_arguments)]
fn reduce_pair<T: Element>(
    run: &mut Run<'_>,
    tmp: &mut [T],
    mine: Input<'_, T>,
    recv: &mut [T],
    count: usize,
    op: &Op<T>,
    root: Option<u32>,
) -> Result<(), CollError> {
    let me = run.comm.rank() as usize;
    let peer = 1 - me;
    let es = std::mem::size_of::<T>();
    if root.is_some_and(|r| r as usize != me) {
        // The root reads this member's input until it enters its last stage.
        run.enter(run.fin());
        return run.wait_member(peer, run.fin());
    }
    let at = run.desc(peer)[0];
    let mut a = 0;
    while a < count {
        let b = (a + tmp.len()).min(count);
        let addr = at + (a * es) as u64;
        let out = &mut recv[a..b];
        match mine {
            Some(m) => {
                run.read(peer, addr, as_bytes_mut(out))?;
                apply(op, &m[a..b], out);
            }
            None => {
                let t = &mut tmp[..b - a];
                run.read(peer, addr, as_bytes_mut(t))?;
                apply(op, t, out);
            }
        }
        a = b;
    }
    run.enter(run.fin());
    if root.is_none() {
        // The other reads this member's input until it enters its last stage.
        run.wait_all(run.fin())?;
    }
    Ok(())
}

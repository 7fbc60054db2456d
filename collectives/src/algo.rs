//! The algorithms, each a [`Schedule`] builder over bytes. Ranks are the
//! communicator's; `tag` is the operation's (every message of one operation carries
//! it: matching is by sender and order, both sides posting in the same order).
//!
//! Every builder is correct for any size (1, 2, 3, non-powers of two), any root and any
//! count including 0; the conformance suite runs each against a reference.

use weft_fabric::sched::{Buf, Schedule, Slice};

use crate::op::ByteOp;

/// Where the operation runs: this member's rank, the communicator's size, the tag.
#[derive(Debug, Clone, Copy)]
pub(crate) struct At {
    pub(crate) rank: u32,
    pub(crate) size: u32,
    pub(crate) tag: u32,
}

/// Adds `inout = input op inout` as a local step.
fn reduce_step(s: &mut Schedule, op: &ByteOp, input: Slice, inout: Slice) {
    let op = op.clone();
    s.local(move |b| {
        let (i, o) = b.pair(input, inout);
        op(i, o);
    });
}

/// Adds `acc = acc op other` (the accumulator on the left) as local steps: for a
/// commutative op one reduction, else through `other` and a copy back.
fn reduce_right(s: &mut Schedule, op: &ByteOp, commutative: bool, acc: Slice, other: Slice) {
    if commutative {
        reduce_step(s, op, other, acc);
    } else {
        reduce_step(s, op, acc, other);
        s.copy(other, acc);
    }
}

fn copy_if(s: &mut Schedule, from: Slice, to: Slice) {
    if from != to && to.len > 0 {
        s.copy(from, to);
    }
}

/// Dissemination barrier: ceil(log2 n) rounds of empty messages.
pub(crate) fn barrier(at: At) -> Schedule {
    let (n, r) = (at.size, at.rank);
    let mut s = Schedule::new();
    let none = Buf::Recv.at(0, 0);
    let mut k = 1;
    while k < n {
        s.send(none, (r + k) % n, at.tag);
        s.recv(none, (r + n - k) % n, at.tag);
        s.round();
        k <<= 1;
    }
    s
}

/// Binomial broadcast of the `bytes` of the receive buffer from `root`.
pub(crate) fn bcast_binomial(at: At, root: u32, bytes: usize) -> Schedule {
    let (n, r) = (at.size, at.rank);
    let vr = (r + n - root) % n;
    let real = |v: u32| (v + root) % n;
    let all = Buf::Recv.at(0, bytes);
    let mut s = Schedule::new();
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            s.recv(all, real(vr - mask), at.tag);
            s.round();
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            s.send(all, real(vr + mask), at.tag);
        }
        mask >>= 1;
    }
    s
}

/// The byte range of chunks `[a, b)` of a buffer of `bytes` cut into chunks of `cs`.
fn chunks(buf: Buf, bytes: usize, cs: usize, a: u32, b: u32) -> Slice {
    let lo = (a as usize * cs).min(bytes);
    let hi = (b as usize * cs).min(bytes);
    buf.at(lo, hi - lo)
}

/// Broadcast by a binomial scatter of n chunks and a ring allgather (van de Geijn):
/// every link carries about the message once, for large messages.
pub(crate) fn bcast_scatter_allgather(at: At, root: u32, bytes: usize, es: usize) -> Schedule {
    let (n, r) = (at.size, at.rank);
    let vr = (r + n - root) % n;
    let real = |v: u32| (v + root) % n;
    // Chunks of whole elements.
    let elems = bytes / es.max(1);
    let cs = elems.div_ceil(n as usize) * es;
    let ch = |a: u32, b: u32| chunks(Buf::Recv, bytes, cs, a, b.min(n));
    let mut s = Schedule::new();
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            s.recv(ch(vr, vr + mask), real(vr - mask), at.tag);
            s.round();
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            s.send(ch(vr + mask, vr + 2 * mask), real(vr + mask), at.tag);
        }
        mask >>= 1;
    }
    s.round();
    let (right, left) = (real((vr + 1) % n), real((vr + n - 1) % n));
    for step in 0..n - 1 {
        let sc = (vr + n - step) % n;
        let rc = (vr + 2 * n - step - 1) % n;
        s.send(ch(sc, sc + 1), right, at.tag);
        s.recv(ch(rc, rc + 1), left, at.tag);
        s.round();
    }
    s
}

/// Binomial reduce to `root` of `bytes` (the input in `mine`: the send buffer, or the
/// receive buffer in place at the root); the result in the root's receive buffer. A
/// non-commutative op reduces in rank order toward rank 0, which then sends to the root.
pub(crate) fn reduce(
    at: At,
    root: u32,
    bytes: usize,
    op: &ByteOp,
    commutative: bool,
    mine: Slice,
) -> Schedule {
    let (n, r) = (at.size, at.rank);
    let tree_root = if commutative { root } else { 0 };
    let vr = (r + n - tree_root) % n;
    let real = |v: u32| (v + tree_root) % n;
    let mut children = Vec::new();
    let mut parent = None;
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            parent = Some(real(vr & !mask));
            break;
        }
        if vr | mask < n {
            children.push(real(vr | mask));
        }
        mask <<= 1;
    }
    let mut s = Schedule::new();
    // A leaf sends its input as it is; an inner node reduces into an accumulator (the
    // result buffer at the root).
    let acc = if r == root && r == tree_root {
        Buf::Recv.at(0, bytes)
    } else if children.is_empty() {
        mine
    } else {
        s.scratch(bytes).at(0, bytes)
    };
    copy_if(&mut s, mine, acc);
    if !children.is_empty() {
        let tmp = s.scratch(bytes).at(0, bytes);
        for c in children {
            s.recv(tmp, c, at.tag);
            reduce_right(&mut s, op, commutative, acc, tmp);
        }
    }
    if let Some(p) = parent {
        s.send(acc, p, at.tag);
        s.round();
    }
    if tree_root != root {
        if r == tree_root {
            s.send(acc, root, at.tag);
        } else if r == root {
            s.recv(Buf::Recv.at(0, bytes), tree_root, at.tag);
        }
    }
    s
}

/// Recursive-doubling allreduce (with the usual fold of the ranks past the largest power
/// of two): log2 n exchanges of the whole vector, for small vectors. Input in `mine`,
/// result in the receive buffer.
pub(crate) fn allreduce_rd(
    at: At,
    bytes: usize,
    op: &ByteOp,
    commutative: bool,
    mine: Slice,
) -> Schedule {
    let (n, r) = (at.size, at.rank);
    let mut s = Schedule::new();
    let acc = Buf::Recv.at(0, bytes);
    copy_if(&mut s, mine, acc);
    if n == 1 {
        return s;
    }
    let tmp = s.scratch(bytes).at(0, bytes);
    let (pof2, rem, newrank) = fold_in(&mut s, at, op, acc, tmp);
    if let Some(nr) = newrank {
        let mut mask = 1;
        while mask < pof2 {
            let pn = nr ^ mask;
            let partner = if pn < rem { pn * 2 + 1 } else { pn + rem };
            s.send(acc, partner, at.tag);
            s.recv(tmp, partner, at.tag);
            if partner < r {
                reduce_step(&mut s, op, tmp, acc);
            } else {
                reduce_right(&mut s, op, commutative, acc, tmp);
            }
            mask <<= 1;
        }
        s.round();
    }
    fold_out(&mut s, at, rem, acc);
    s
}

/// The fold of recursive doubling and Rabenseifner's algorithm onto the largest power of
/// two of members: of the first `2 rem` members, each even one hands its vector `acc`
/// to the odd one after it (which reduces it into its own through `tmp`, lower rank on
/// the left) and sits out. Returns the power of two, `rem`, and this member's rank among
/// the ones that go on (`None` for one that sits out).
fn fold_in(
    s: &mut Schedule,
    at: At,
    op: &ByteOp,
    acc: Slice,
    tmp: Slice,
) -> (u32, u32, Option<u32>) {
    let (n, r) = (at.size, at.rank);
    let pof2 = 1u32 << (31 - n.leading_zeros());
    let rem = n - pof2;
    let newrank = if r < 2 * rem {
        if r % 2 == 0 {
            s.send(acc, r + 1, at.tag);
            s.round();
            None
        } else {
            let t = tmp;
            s.recv(t, r - 1, at.tag);
            reduce_step(s, op, t, acc);
            Some(r / 2)
        }
    } else {
        Some(r - rem)
    };
    (pof2, rem, newrank)
}

/// The end of [`fold_in`]: the odd members hand the result back to the even ones.
fn fold_out(s: &mut Schedule, at: At, rem: u32, acc: Slice) {
    let r = at.rank;
    if r < 2 * rem {
        if r % 2 == 1 {
            s.send(acc, r - 1, at.tag);
        } else {
            s.recv(acc, r + 1, at.tag);
        }
    }
}

/// Element range of chunk `i` of `count` elements cut into `n` near-equal chunks.
fn chunk_range(count: usize, n: u32, i: u32) -> (usize, usize) {
    let (base, extra) = (count / n as usize, count % n as usize);
    let i = i as usize;
    let start = i * base + i.min(extra);
    (start, base + usize::from(i < extra))
}

/// Ring reduce-scatter over `n` chunks of `acc` (commutative op): afterwards rank r
/// holds the reduced chunk r. `tmp` holds the largest chunk.
#[allow(clippy::too_many_arguments)]
fn ring_reduce_scatter(
    s: &mut Schedule,
    at: At,
    acc: Buf,
    acc_off: usize,
    count: usize,
    es: usize,
    op: &ByteOp,
    tmp: Buf,
) {
    let (n, r) = (at.size, at.rank);
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let chunk = |i: u32| {
        let (st, len) = chunk_range(count, n, i);
        acc.at(acc_off + st * es, len * es)
    };
    for step in 0..n - 1 {
        let sc = (r + 2 * n - 1 - step) % n;
        let rc = (r + 2 * n - 2 - step) % n;
        let into = tmp.at(0, chunk(rc).len);
        s.send(chunk(sc), right, at.tag);
        s.recv(into, left, at.tag);
        reduce_step(s, op, into, chunk(rc));
    }
    s.round();
}

/// Ring allreduce (commutative ops): a ring reduce-scatter then a ring allgather, each
/// moving (n-1)/n of the vector per rank, for large vectors.
pub(crate) fn allreduce_ring(
    at: At,
    count: usize,
    es: usize,
    op: &ByteOp,
    mine: Slice,
) -> Schedule {
    let (n, r) = (at.size, at.rank);
    let bytes = count * es;
    let mut s = Schedule::new();
    copy_if(&mut s, mine, Buf::Recv.at(0, bytes));
    if n == 1 {
        return s;
    }
    let tmp = s.scratch(chunk_range(count, n, 0).1 * es);
    ring_reduce_scatter(&mut s, at, Buf::Recv, 0, count, es, op, tmp);
    let chunk = |i: u32| {
        let (st, len) = chunk_range(count, n, i);
        Buf::Recv.at(st * es, len * es)
    };
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    for step in 0..n - 1 {
        s.send(chunk((r + n - step) % n), right, at.tag);
        s.recv(chunk((r + 2 * n - step - 1) % n), left, at.tag);
        s.round();
    }
    s
}

/// Rabenseifner's allreduce (commutative ops): a recursive-halving reduce-scatter, then a
/// recursive-doubling allgather, among the largest power of two of members (the others
/// fold into a neighbour first and get the result from it last, as in recursive
/// doubling): 2 log2 n steps moving about twice the vector, for vectors between the
/// recursive doubling's and the ring's.
pub(crate) fn allreduce_rabenseifner(
    at: At,
    count: usize,
    es: usize,
    op: &ByteOp,
    mine: Slice,
) -> Schedule {
    let n = at.size;
    let bytes = count * es;
    let mut s = Schedule::new();
    let acc = Buf::Recv.at(0, bytes);
    copy_if(&mut s, mine, acc);
    if n == 1 {
        return s;
    }
    let tmp = s.scratch(bytes);
    let (pof2, rem, newrank) = fold_in(&mut s, at, op, acc, tmp.at(0, bytes));
    let real = |nr: u32| if nr < rem { nr * 2 + 1 } else { nr + rem };
    // Chunks [a, b) of the vector cut into pof2.
    let chunks = |a: u32, b: u32| {
        let start = chunk_range(count, pof2, a).0;
        let end = if b >= pof2 {
            count
        } else {
            chunk_range(count, pof2, b).0
        };
        Buf::Recv.at(start * es, (end - start) * es)
    };
    if let Some(nr) = newrank {
        let (mut lo, mut hi) = (0u32, pof2);
        let mut mask = pof2 >> 1;
        while mask > 0 {
            let partner = real(nr ^ mask);
            let mid = lo + mask;
            let (keep, give) = if nr & mask == 0 {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            let k = chunks(keep.0, keep.1);
            let into = tmp.at(0, k.len);
            s.send(chunks(give.0, give.1), partner, at.tag);
            s.recv(into, partner, at.tag);
            reduce_step(&mut s, op, into, k);
            (lo, hi) = keep;
            mask >>= 1;
        }
        s.round();
        let mut mask = 1;
        while mask < pof2 {
            let partner = real(nr ^ mask);
            let (plo, phi) = if nr & mask == 0 {
                (hi, hi + mask)
            } else {
                (lo - mask, lo)
            };
            s.send(chunks(lo, hi), partner, at.tag);
            s.recv(chunks(plo, phi), partner, at.tag);
            s.round();
            (lo, hi) = (lo.min(plo), hi.max(phi));
            mask <<= 1;
        }
    }
    fold_out(&mut s, at, rem, acc);
    s
}

/// Linear gatherv: the root receives every block straight into place.
/// `blocks[i]` = (offset, length) in bytes of rank i's block in the root's buffer.
pub(crate) fn gatherv(at: At, root: u32, mine: Slice, blocks: &[(usize, usize)]) -> Schedule {
    let mut s = Schedule::new();
    if at.rank == root {
        let (o, l) = blocks[root as usize];
        copy_if(&mut s, mine, Buf::Recv.at(o, l));
        for (i, &(o, l)) in blocks.iter().enumerate() {
            if i as u32 != root {
                s.recv(Buf::Recv.at(o, l), i as u32, at.tag);
            }
        }
    } else {
        s.send(mine, root, at.tag);
    }
    s
}

/// Linear scatterv: the root sends every block from place. `blocks[i]` = (offset,
/// length) in bytes of rank i's block in the root's send buffer; `into` is this rank's
/// receive slice (`None` in place at the root).
pub(crate) fn scatterv(
    at: At,
    root: u32,
    blocks: &[(usize, usize)],
    into: Option<Slice>,
) -> Schedule {
    let mut s = Schedule::new();
    if at.rank == root {
        let (o, l) = blocks[root as usize];
        if let Some(into) = into {
            copy_if(&mut s, Buf::Send.at(o, l), into);
        }
        for (i, &(o, l)) in blocks.iter().enumerate() {
            if i as u32 != root {
                s.send(Buf::Send.at(o, l), i as u32, at.tag);
            }
        }
    } else if let Some(into) = into {
        s.recv(into, root, at.tag);
    }
    s
}

/// Ring allgatherv: n-1 steps, each passing one block to the right. `blocks[i]` =
/// (offset, length) in bytes of rank i's block in the receive buffer.
pub(crate) fn allgatherv_ring(at: At, mine: Slice, blocks: &[(usize, usize)]) -> Schedule {
    let (n, r) = (at.size, at.rank);
    let blk = |i: u32| Buf::Recv.at(blocks[i as usize].0, blocks[i as usize].1);
    let mut s = Schedule::new();
    copy_if(&mut s, mine, blk(r));
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    for step in 0..n.saturating_sub(1) {
        s.send(blk((r + n - step) % n), right, at.tag);
        s.recv(blk((r + 2 * n - step - 1) % n), left, at.tag);
        s.round();
    }
    s
}

/// Bruck allgather of equal blocks of `block` bytes: ceil(log2 n) steps, for small
/// blocks; the blocks gather in rotated order in a scratch buffer, then move in place.
pub(crate) fn allgather_bruck(at: At, mine: Slice, block: usize) -> Schedule {
    let (n, r) = (at.size, at.rank);
    let mut s = Schedule::new();
    let tmp = s.scratch(block * n as usize);
    copy_if(&mut s, mine, tmp.at(0, block));
    let mut k = 1;
    while k < n {
        let cnt = k.min(n - k) as usize;
        s.send(tmp.at(0, cnt * block), (r + n - k) % n, at.tag);
        s.recv(tmp.at(k as usize * block, cnt * block), (r + k) % n, at.tag);
        s.round();
        k <<= 1;
    }
    // tmp[i] is rank (r + i)'s block.
    for i in 0..n {
        let dst = ((r + i) % n) as usize;
        s.copy(
            tmp.at(i as usize * block, block),
            Buf::Recv.at(dst * block, block),
        );
    }
    s
}

/// Pairwise alltoallv: n-1 rounds, in round k sending to rank r+k and receiving from
/// r-k. `sends[i]`/`recvs[i]` = (offset, length) in bytes of the block for / from rank i.
///
/// `in_place`: the blocks to send are `recvs` of the receive buffer, copied first to a
/// scratch buffer (`sends` must then equal `recvs`).
pub(crate) fn alltoallv_pairwise(
    at: At,
    sends: &[(usize, usize)],
    recvs: &[(usize, usize)],
    in_place: bool,
) -> Schedule {
    let (n, r) = (at.size, at.rank);
    let mut s = Schedule::new();
    let src = if in_place {
        let end = recvs.iter().map(|&(o, l)| o + l).max().unwrap_or(0);
        let copy = s.scratch(end);
        s.copy(Buf::Recv.at(0, end), copy.at(0, end));
        copy
    } else {
        Buf::Send
    };
    let (so, sl) = sends[r as usize];
    let (ro, rl) = recvs[r as usize];
    if sl == rl {
        copy_if(&mut s, src.at(so, sl), Buf::Recv.at(ro, rl));
    }
    for k in 1..n {
        let (to, from) = ((r + k) % n, (r + n - k) % n);
        let (so, sl) = sends[to as usize];
        let (ro, rl) = recvs[from as usize];
        s.send(src.at(so, sl), to, at.tag);
        s.recv(Buf::Recv.at(ro, rl), from, at.tag);
        s.round();
    }
    s
}

/// Reduce-scatter of equal blocks (`count` elements each) for a commutative op: a ring
/// reduce-scatter over a copy of the input, then this rank's block into place.
pub(crate) fn reduce_scatter_block_ring(
    at: At,
    count: usize,
    es: usize,
    op: &ByteOp,
    input: Slice,
) -> Schedule {
    let (n, r) = (at.size, at.rank);
    let block = count * es;
    let mut s = Schedule::new();
    let acc = s.scratch(block * n as usize);
    s.copy(input, acc.at(0, input.len));
    let tmp = s.scratch(block);
    // n chunks of exactly `count` elements: the ring's chunk i is block i.
    ring_reduce_scatter(&mut s, at, acc, 0, count * n as usize, es, op, tmp);
    s.copy(acc.at(r as usize * block, block), Buf::Recv.at(0, block));
    s
}

/// Reduce-scatter of equal blocks in rank order (any op): every rank receives its block
/// from every other and reduces them in rank order.
pub(crate) fn reduce_scatter_block_ordered(
    at: At,
    count: usize,
    es: usize,
    op: &ByteOp,
    input: Slice,
) -> Schedule {
    let (n, r) = (at.size, at.rank);
    let block = count * es;
    let mut s = Schedule::new();
    let parts = s.scratch(block * n as usize);
    let part = |i: u32| parts.at(i as usize * block, block);
    s.copy(input.buf.at(input.off + r as usize * block, block), part(r));
    for i in 0..n {
        if i != r {
            s.send(
                input.buf.at(input.off + i as usize * block, block),
                i,
                at.tag,
            );
            s.recv(part(i), i, at.tag);
        }
    }
    s.round();
    // x0 op (x1 op (... op x(n-1))): accumulate from the right.
    let acc = Buf::Recv.at(0, block);
    s.copy(part(n - 1), acc);
    for i in (0..n - 1).rev() {
        reduce_step(&mut s, op, part(i), acc);
    }
    s
}

/// Recursive-doubling scan (inclusive, or exclusive: rank 0's receive buffer is left as
/// it was). Input in `mine`, result in the receive buffer.
pub(crate) fn scan(
    at: At,
    bytes: usize,
    op: &ByteOp,
    commutative: bool,
    exclusive: bool,
    mine: Slice,
) -> Schedule {
    let (n, r) = (at.size, at.rank);
    let mut s = Schedule::new();
    let result = Buf::Recv.at(0, bytes);
    let partial = s.scratch(bytes).at(0, bytes);
    let tmp = s.scratch(bytes).at(0, bytes);
    s.copy(mine, partial);
    if !exclusive {
        copy_if(&mut s, mine, result);
    }
    let mut first = true;
    let mut mask = 1;
    while mask < n {
        let dst = r ^ mask;
        if dst < n {
            s.send(partial, dst, at.tag);
            s.recv(tmp, dst, at.tag);
            if dst < r {
                if exclusive && first {
                    s.copy(tmp, result);
                } else {
                    reduce_step(&mut s, op, tmp, result);
                }
                first = false;
                reduce_step(&mut s, op, tmp, partial);
            } else {
                reduce_right(&mut s, op, commutative, partial, tmp);
            }
        }
        mask <<= 1;
    }
    s
}

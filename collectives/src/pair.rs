//! Two-member communicators whose members do not share a segment (two nodes, or the
//! node-local path off): barrier and allreduce up to `WEFT_COLL_ALLREDUCE_LARGE` as one
//! exchange on the collective plane (`Communicator::coll_exchange`), without a
//! schedule. Both members compute `x0 op x1`, so non-commutative operations are right and
//! both get the same bits.

use weft_fabric::sched::{as_bytes, as_bytes_mut, cast_slice, cast_slice_mut};
use weft_fabric::Communicator;

use crate::op::{apply, misaligned, Scratch};
use crate::{at, CollError, Element, Op};

pub(crate) fn barrier(comm: &Communicator) -> Result<(), CollError> {
    let tag = at(comm).tag;
    comm.coll_exchange(1 - comm.rank(), tag, &[], &mut [])
        .map_err(|e| CollError::of("barrier", e))
}

/// Allreduce of `recv.len()` elements from `send` (or `recv` in place).
pub(crate) fn allreduce<T: Element>(
    comm: &Communicator,
    send: Option<&[T]>,
    recv: &mut [T],
    op: &Op<T>,
) -> Result<(), CollError> {
    const OP: &str = "allreduce";
    let tag = at(comm).tag;
    let peer = 1 - comm.rank();
    let x = |e| CollError::of(OP, e);
    match (comm.rank(), send) {
        // x0 op x1 with x1 received straight into the output.
        (0, Some(mine)) => {
            comm.coll_exchange(peer, tag, as_bytes(mine), as_bytes_mut(recv))
                .map_err(x)?;
            apply(op, mine, recv);
        }
        (me, _) => {
            let mut scratch = Scratch::default();
            let theirs = scratch.bytes(std::mem::size_of_val(recv));
            let mine: &[T] = match send {
                Some(m) => m,
                None => recv,
            };
            comm.coll_exchange(peer, tag, as_bytes(mine), theirs)
                .map_err(x)?;
            if me == 0 {
                // In place: x0 is in `recv`; x0 op x1 into the scratch, then back.
                let t = cast_slice_mut::<T>(theirs).ok_or_else(|| misaligned(OP))?;
                apply(op, recv, t);
                recv.copy_from_slice(t);
            } else {
                if let Some(m) = send {
                    recv.copy_from_slice(m);
                }
                let t = cast_slice::<T>(theirs).ok_or_else(|| misaligned(OP))?;
                apply(op, t, recv);
            }
        }
    }
    Ok(())
}

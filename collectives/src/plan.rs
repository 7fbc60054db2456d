//! Planning an operation: checking a call's arguments and choosing its algorithm, giving
//! the schedule and the byte views of the buffers it runs over ([`Plan`]), which the
//! blocking forms run at once and the non-blocking ones start in a request scope.

use weft_fabric::sched::{as_bytes, as_bytes_mut, Buf, Schedule, Slice};
use weft_fabric::{Communicator, Pod};

use crate::op::{self, Element, Op};
use crate::tunables::{Allgather, Allreduce, Bcast, Config};
use crate::{algo, at, CollError};

/// A planned operation: its schedule and the byte views of its buffers.
pub(crate) struct Plan<'a> {
    pub(crate) op: &'static str,
    pub(crate) sched: Schedule,
    pub(crate) send: &'a [u8],
    pub(crate) recv: &'a mut [u8],
}

impl Plan<'_> {
    pub(crate) fn run(self, comm: &Communicator) -> Result<(), CollError> {
        let op = self.op;
        comm.run_schedule(self.sched, self.send, self.recv)
            .map_err(|e| CollError::of(op, e))
    }
}

/// Where a reduction's input of `bytes` is: the send buffer, or the receive buffer when
/// there is none (in place).
fn input<T>(send: Option<&[T]>, bytes: usize) -> Slice {
    match send {
        Some(_) => Buf::Send.at(0, bytes),
        None => Buf::Recv.at(0, bytes),
    }
}

pub(crate) fn check_root(
    op: &'static str,
    comm: &Communicator,
    root: u32,
) -> Result<(), CollError> {
    if root >= comm.size() {
        return Err(CollError::InvalidRoot {
            op,
            root,
            size: comm.size(),
        });
    }
    Ok(())
}

pub(crate) fn check_op<T: Element>(op: &'static str, red: &Op<T>) -> Result<(), CollError> {
    if !T::supports(red) {
        return Err(CollError::UnsupportedOp {
            op,
            reduction: red.name(),
            ty: T::NAME,
        });
    }
    Ok(())
}

pub(crate) fn invalid(op: &'static str, what: String) -> CollError {
    CollError::InvalidArgs { op, what }
}

/// Byte (offset, length) blocks from element counts and displacements.
pub(crate) fn blocks<T>(
    op: &'static str,
    n: u32,
    counts: &[usize],
    displs: &[usize],
    buf_len: usize,
    which: &str,
) -> Result<Vec<(usize, usize)>, CollError> {
    let es = std::mem::size_of::<T>();
    if counts.len() != n as usize || displs.len() != n as usize {
        return Err(invalid(
            op,
            format!(
                "{} {which} counts and {} displacements for a communicator of {n}",
                counts.len(),
                displs.len()
            ),
        ));
    }
    counts
        .iter()
        .zip(displs)
        .enumerate()
        .map(|(i, (&c, &d))| {
            if d.checked_add(c).is_none_or(|end| end > buf_len) {
                return Err(invalid(
                    op,
                    format!("rank {i}'s {which} block ({c} at {d}) lies outside the buffer of {buf_len}"),
                ));
            }
            Ok((d * es, c * es))
        })
        .collect()
}

pub(crate) fn plan_barrier<'a>(comm: &Communicator) -> Plan<'a> {
    Plan {
        op: "barrier",
        sched: algo::barrier(at(comm)),
        send: &[],
        recv: &mut [],
    }
}

pub(crate) fn plan_bcast<'a, T: Pod>(
    comm: &Communicator,
    buf: &'a mut [T],
    root: u32,
) -> Result<Plan<'a>, CollError> {
    check_root("bcast", comm, root)?;
    let at = at(comm);
    let bytes = std::mem::size_of_val(buf);
    let es = std::mem::size_of::<T>();
    let cfg = Config::get();
    let large = match cfg.bcast {
        Bcast::Binomial => false,
        Bcast::ScatterAllgather => true,
        Bcast::Auto => bytes >= cfg.bcast_large && at.size > 2,
    };
    let sched = if large && at.size > 1 {
        algo::bcast_scatter_allgather(at, root, bytes, es)
    } else {
        algo::bcast_binomial(at, root, bytes)
    };
    Ok(Plan {
        op: "bcast",
        sched,
        send: &[],
        recv: as_bytes_mut(buf),
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_reduce<'a, T: Element>(
    op: &'static str,
    comm: &Communicator,
    send: Option<&'a [T]>,
    recv: &'a mut [T],
    red: &Op<T>,
    root: u32,
) -> Result<Plan<'a>, CollError> {
    check_root(op, comm, root)?;
    check_op(op, red)?;
    let count = send.map_or(recv.len(), <[T]>::len);
    if comm.rank() == root && recv.len() < count {
        return Err(invalid(
            op,
            format!(
                "the root's receive buffer holds {} elements, the operation has {count}",
                recv.len()
            ),
        ));
    }
    let bytes = count * std::mem::size_of::<T>();
    let mine = input(send, bytes);
    // Off the root, the receive buffer is not used (unless in place: the input).
    let recv = if comm.rank() == root || send.is_none() {
        as_bytes_mut(recv)
    } else {
        &mut []
    };
    let sched = algo::reduce(
        at(comm),
        root,
        bytes,
        &op::byte_op(red),
        red.commutative(),
        mine,
    );
    Ok(Plan {
        op,
        sched,
        send: send.map_or(&[][..], as_bytes),
        recv,
    })
}

pub(crate) fn plan_allreduce<'a, T: Element>(
    comm: &Communicator,
    send: Option<&'a [T]>,
    recv: &'a mut [T],
    red: &Op<T>,
) -> Result<Plan<'a>, CollError> {
    const OP: &str = "allreduce";
    check_op(OP, red)?;
    let count = send.map_or(recv.len(), <[T]>::len);
    if recv.len() != count {
        return Err(invalid(
            OP,
            format!(
                "the send buffer holds {count} elements, the receive buffer {}",
                recv.len()
            ),
        ));
    }
    let es = std::mem::size_of::<T>();
    let bytes = count * es;
    let mine = input(send, bytes);
    let at = at(comm);
    let bop = op::byte_op(red);
    let cfg = Config::get();
    let ring_ok = red.commutative() && count >= at.size as usize;
    // Rabenseifner's from the middle size on (as few steps as recursive doubling, as few
    // bytes as the ring), except that a size that is not a power of two makes it send
    // the whole vector once more (its fold): the ring takes the large vectors there.
    let raben = at.size > 2 && (at.size.is_power_of_two() || bytes < cfg.allreduce_large);
    let algo = match cfg.allreduce {
        Allreduce::Auto if ring_ok && bytes >= cfg.allreduce_mid && raben => {
            Allreduce::Rabenseifner
        }
        Allreduce::Auto if ring_ok && bytes >= cfg.allreduce_large && at.size > 1 => {
            Allreduce::Ring
        }
        Allreduce::Auto => Allreduce::RecursiveDoubling,
        Allreduce::Ring | Allreduce::Rabenseifner if !ring_ok => Allreduce::RecursiveDoubling,
        a => a,
    };
    let sched = match algo {
        Allreduce::Ring => algo::allreduce_ring(at, count, es, &bop, mine),
        Allreduce::Rabenseifner => algo::allreduce_rabenseifner(at, count, es, &bop, mine),
        Allreduce::ReduceBcast => {
            // A reduce to rank 0, then a binomial broadcast, in one schedule: the same
            // tag serves both (their messages go opposite ways in order).
            let mut s = algo::reduce(at, 0, bytes, &bop, red.commutative(), mine);
            s.round();
            s.append(algo::bcast_binomial(at, 0, bytes));
            s
        }
        _ => algo::allreduce_rd(at, bytes, &bop, red.commutative(), mine),
    };
    Ok(Plan {
        op: OP,
        sched,
        send: send.map_or(&[][..], as_bytes),
        recv: as_bytes_mut(recv),
    })
}

pub(crate) fn plan_gatherv<'a, T: Pod>(
    op: &'static str,
    comm: &Communicator,
    send: Option<&'a [T]>,
    recv: &'a mut [T],
    counts: &[usize],
    displs: &[usize],
    root: u32,
) -> Result<Plan<'a>, CollError> {
    check_root(op, comm, root)?;
    let me = comm.rank();
    let es = std::mem::size_of::<T>();
    let (blks, mine) = if me == root {
        let b = blocks::<T>(op, comm.size(), counts, displs, recv.len(), "receive")?;
        let (o, l) = b[me as usize];
        let mine = match send {
            Some(s) if std::mem::size_of_val(s) != l => {
                return Err(invalid(
                    op,
                    format!(
                        "the root sends {} elements, its own count is {}",
                        s.len(),
                        l / es
                    ),
                ))
            }
            Some(_) => Buf::Send.at(0, l),
            None => Buf::Recv.at(o, l),
        };
        (b, mine)
    } else {
        let s = send.map_or(0, <[T]>::len);
        (Vec::new(), Buf::Send.at(0, s * es))
    };
    let sched = algo::gatherv(at(comm), root, mine, &blks);
    Ok(Plan {
        op,
        sched,
        send: send.map_or(&[][..], as_bytes),
        recv: if me == root {
            as_bytes_mut(recv)
        } else {
            &mut []
        },
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_scatterv<'a, T: Pod>(
    op: &'static str,
    comm: &Communicator,
    send: &'a [T],
    counts: &[usize],
    displs: &[usize],
    recv: Option<&'a mut [T]>,
    root: u32,
) -> Result<Plan<'a>, CollError> {
    check_root(op, comm, root)?;
    let me = comm.rank();
    let es = std::mem::size_of::<T>();
    let blks = if me == root {
        blocks::<T>(op, comm.size(), counts, displs, send.len(), "send")?
    } else {
        Vec::new()
    };
    let into = match &recv {
        Some(r) => {
            let len = if me == root {
                blks[me as usize].1
            } else {
                std::mem::size_of_val(*r)
            };
            if len > std::mem::size_of_val(*r) {
                return Err(invalid(
                    op,
                    format!(
                        "the root's own block has {} elements, its receive buffer {}",
                        len / es,
                        r.len()
                    ),
                ));
            }
            Some(Buf::Recv.at(0, len))
        }
        None => None,
    };
    let sched = algo::scatterv(at(comm), root, &blks, into);
    Ok(Plan {
        op,
        sched,
        send: if me == root { as_bytes(send) } else { &[] },
        recv: recv.map_or(&mut [][..], as_bytes_mut),
    })
}

pub(crate) fn plan_allgatherv<'a, T: Pod>(
    op: &'static str,
    comm: &Communicator,
    send: Option<&'a [T]>,
    recv: &'a mut [T],
    counts: &[usize],
    displs: &[usize],
    equal: bool,
) -> Result<Plan<'a>, CollError> {
    let (n, me) = (comm.size(), comm.rank());
    let es = std::mem::size_of::<T>();
    let blks = blocks::<T>(op, n, counts, displs, recv.len(), "receive")?;
    let (o, l) = blks[me as usize];
    let mine = match send {
        Some(s) if std::mem::size_of_val(s) != l => {
            return Err(invalid(
                op,
                format!(
                    "this rank sends {} elements, its count is {}",
                    s.len(),
                    l / es
                ),
            ))
        }
        Some(_) => Buf::Send.at(0, l),
        None => Buf::Recv.at(o, l),
    };
    let at = at(comm);
    let cfg = Config::get();
    let bruck = equal
        && match cfg.allgather {
            Allgather::Bruck => true,
            Allgather::Ring => false,
            Allgather::Auto => l < cfg.allgather_large,
        };
    let sched = if bruck {
        algo::allgather_bruck(at, mine, l)
    } else {
        algo::allgatherv_ring(at, mine, &blks)
    };
    Ok(Plan {
        op,
        sched,
        send: send.map_or(&[][..], as_bytes),
        recv: as_bytes_mut(recv),
    })
}

/// An all-to-all with per-member blocks; `send` `None` is in place (MPI_IN_PLACE): the
/// receive blocks are sent, and the send counts are not read.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_alltoallv<'a, T: Pod>(
    op: &'static str,
    comm: &Communicator,
    send: Option<&'a [T]>,
    scounts: &[usize],
    sdispls: &[usize],
    recv: &'a mut [T],
    rcounts: &[usize],
    rdispls: &[usize],
) -> Result<Plan<'a>, CollError> {
    let n = comm.size();
    let r = blocks::<T>(op, n, rcounts, rdispls, recv.len(), "receive")?;
    let s = match send {
        Some(send) => blocks::<T>(op, n, scounts, sdispls, send.len(), "send")?,
        None => r.clone(),
    };
    let me = comm.rank() as usize;
    if s[me].1 != r[me].1 {
        return Err(invalid(
            op,
            format!(
                "this rank sends itself {} elements and expects {}",
                scounts[me], rcounts[me]
            ),
        ));
    }
    Ok(Plan {
        op,
        sched: algo::alltoallv_pairwise(at(comm), &s, &r, send.is_none()),
        send: send.map_or(&[][..], as_bytes),
        recv: as_bytes_mut(recv),
    })
}

/// An all-to-all of equal blocks (`send` `None`: in place).
pub(crate) fn plan_alltoall<'a, T: Pod>(
    comm: &Communicator,
    send: Option<&'a [T]>,
    recv: &'a mut [T],
) -> Result<Plan<'a>, CollError> {
    const OP: &str = "alltoall";
    let total = send.map_or(recv.len(), <[T]>::len);
    let b = block_len(OP, comm, total)?;
    let (c, d) = counts_of(comm.size(), b);
    plan_alltoallv(OP, comm, send, &c, &d, recv, &c, &d)
}

/// A gather of equal blocks; `send` `None` is in place at the root (its block already
/// in `recv`), an error elsewhere.
pub(crate) fn plan_gather<'a, T: Pod>(
    comm: &Communicator,
    send: Option<&'a [T]>,
    recv: &'a mut [T],
    root: u32,
) -> Result<Plan<'a>, CollError> {
    const OP: &str = "gather";
    let b = match send {
        Some(s) => s.len(),
        None => {
            in_place_at_root(OP, comm, root)?;
            block_len(OP, comm, recv.len())?
        }
    };
    let (c, d) = counts_of(comm.size(), b);
    plan_gatherv(OP, comm, send, recv, &c, &d, root)
}

/// A scatter of equal blocks; `recv` `None` is in place at the root (its block stays in
/// `send`), an error elsewhere.
pub(crate) fn plan_scatter<'a, T: Pod>(
    comm: &Communicator,
    send: &'a [T],
    recv: Option<&'a mut [T]>,
    root: u32,
) -> Result<Plan<'a>, CollError> {
    const OP: &str = "scatter";
    let b = match &recv {
        Some(r) => r.len(),
        None => {
            in_place_at_root(OP, comm, root)?;
            block_len(OP, comm, send.len())?
        }
    };
    let (c, d) = counts_of(comm.size(), b);
    plan_scatterv(OP, comm, send, &c, &d, recv, root)
}

/// An allgather of equal blocks (`send` `None`: in place, each block already at
/// `rank * block`).
pub(crate) fn plan_allgather<'a, T: Pod>(
    comm: &Communicator,
    send: Option<&'a [T]>,
    recv: &'a mut [T],
) -> Result<Plan<'a>, CollError> {
    const OP: &str = "allgather";
    let b = match send {
        Some(s) => s.len(),
        None => block_len(OP, comm, recv.len())?,
    };
    let (c, d) = counts_of(comm.size(), b);
    plan_allgatherv(OP, comm, send, recv, &c, &d, true)
}

fn in_place_at_root(op: &'static str, comm: &Communicator, root: u32) -> Result<(), CollError> {
    check_root(op, comm, root)?;
    if comm.rank() != root {
        return Err(invalid(
            op,
            format!("in place only at the root ({root}); this member calls {op}"),
        ));
    }
    Ok(())
}

/// A reduce-scatter of equal blocks; `send` `None` is in place: `recv` holds the input
/// (size x the block) and gets the result in its first block.
pub(crate) fn plan_reduce_scatter_block<'a, T: Element>(
    comm: &Communicator,
    send: Option<&'a [T]>,
    recv: &'a mut [T],
    red: &Op<T>,
) -> Result<Plan<'a>, CollError> {
    const OP: &str = "reduce_scatter_block";
    check_op(OP, red)?;
    let n = comm.size() as usize;
    let count = match send {
        Some(send) => {
            let count = recv.len();
            if send.len() != count * n {
                return Err(invalid(
                    OP,
                    format!(
                        "the send buffer holds {} elements, {n} blocks of the receive buffer's {count} make {}",
                        send.len(),
                        count * n
                    ),
                ));
            }
            count
        }
        None => block_len(OP, comm, recv.len())?,
    };
    let es = std::mem::size_of::<T>();
    let input = input(send, count * n * es);
    let at = at(comm);
    let bop = op::byte_op(red);
    let sched = if red.commutative() && n > 1 {
        algo::reduce_scatter_block_ring(at, count, es, &bop, input)
    } else {
        algo::reduce_scatter_block_ordered(at, count, es, &bop, input)
    };
    Ok(Plan {
        op: OP,
        sched,
        send: send.map_or(&[][..], as_bytes),
        recv: as_bytes_mut(recv),
    })
}

pub(crate) fn plan_scan<'a, T: Element>(
    op: &'static str,
    comm: &Communicator,
    send: Option<&'a [T]>,
    recv: &'a mut [T],
    red: &Op<T>,
    exclusive: bool,
) -> Result<Plan<'a>, CollError> {
    check_op(op, red)?;
    let count = send.map_or(recv.len(), <[T]>::len);
    if recv.len() != count {
        return Err(invalid(
            op,
            format!(
                "the send buffer holds {count} elements, the receive buffer {}",
                recv.len()
            ),
        ));
    }
    let bytes = count * std::mem::size_of::<T>();
    let mine = input(send, bytes);
    let sched = algo::scan(
        at(comm),
        bytes,
        &op::byte_op(red),
        red.commutative(),
        exclusive,
        mine,
    );
    Ok(Plan {
        op,
        sched,
        send: send.map_or(&[][..], as_bytes),
        recv: as_bytes_mut(recv),
    })
}

/// A reduce (to `root`) or allreduce (`root` `None`) through the node's segment, when the
/// communicator has one and the vector fits; `None` to take the point-to-point path
/// (which also reports argument errors, before anything moves).
#[inline]
pub(crate) fn shm_reduce<T: Element>(
    op_name: &'static str,
    comm: &Communicator,
    send: Option<&[T]>,
    recv: &mut [T],
    red: &Op<T>,
    root: Option<u32>,
) -> Option<Result<(), CollError>> {
    let count = send.map_or(recv.len(), <[T]>::len);
    let bytes = count * std::mem::size_of::<T>();
    if let Some(r) = root {
        check_root(op_name, comm, r).ok()?;
    }
    check_op(op_name, red).ok()?;
    let here = root.is_none_or(|r| r == comm.rank());
    if ((here || send.is_none()) && recv.len() < count) || (root.is_none() && recv.len() != count) {
        return None;
    }
    let small = bytes <= crate::Config::get().shm_max;
    let nc = crate::node(comm).filter(|nc| small || nc.single_copy())?;
    Some(nc.reduce(op_name, comm, send, recv, count, red, root, small))
}

pub(crate) fn counts_of(n: u32, count: usize) -> (Vec<usize>, Vec<usize>) {
    (
        vec![count; n as usize],
        (0..n as usize).map(|i| i * count).collect(),
    )
}

pub(crate) fn block_len(
    op: &'static str,
    comm: &Communicator,
    total: usize,
) -> Result<usize, CollError> {
    let n = comm.size() as usize;
    if total % n != 0 {
        return Err(invalid(
            op,
            format!("a buffer of {total} elements is not {n} equal blocks"),
        ));
    }
    Ok(total / n)
}

//! Non-blocking collectives ([`NonBlocking`]): every one a schedule started in a
//! request scope, so its request mixes with point-to-point ones.

use weft_fabric::{Pod, Request, RequestScope};

use crate::plan::{
    plan_allgather, plan_allgatherv, plan_allreduce, plan_alltoall, plan_alltoallv, plan_barrier,
    plan_bcast, plan_gather, plan_gatherv, plan_reduce, plan_reduce_scatter_block, plan_scan,
    plan_scatter, plan_scatterv, Plan,
};
use crate::{CollError, Element, Op};

/// Non-blocking collectives, started in a [`RequestScope`] of the communicator (see
/// [`Communicator::scope`](weft_fabric::Communicator::scope)): the buffers stay borrowed
/// until the scope ends, and the returned [`Request`] mixes with point-to-point ones.
/// Each is the non-blocking form of the [`Collectives`](crate::Collectives) method of
/// the same name without the `i`, with the same arguments and errors; arguments are
/// checked when the operation starts. Members start the collectives of a communicator
/// in the same order, blocking and non-blocking alike.
pub trait NonBlocking<'scope> {
    /// Non-blocking [`Collectives::barrier`](crate::Collectives::barrier).
    fn ibarrier(&'scope self) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::bcast`](crate::Collectives::bcast).
    fn ibcast<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::reduce`](crate::Collectives::reduce).
    fn ireduce<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::reduce_in_place`](crate::Collectives::reduce_in_place).
    fn ireduce_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: Op<T>,
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::allreduce`](crate::Collectives::allreduce).
    fn iallreduce<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking
    /// [`Collectives::allreduce_in_place`](crate::Collectives::allreduce_in_place).
    fn iallreduce_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::gather`](crate::Collectives::gather).
    fn igather<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::gather_in_place`](crate::Collectives::gather_in_place)
    /// (at the root only).
    fn igather_in_place<T: Pod>(
        &'scope self,
        recv: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::gatherv`](crate::Collectives::gatherv).
    fn igatherv<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        counts: &[usize],
        displs: &[usize],
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::scatter`](crate::Collectives::scatter).
    fn iscatter<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking
    /// [`Collectives::scatter_in_place`](crate::Collectives::scatter_in_place) (at the
    /// root only).
    fn iscatter_in_place<T: Pod>(
        &'scope self,
        send: &'scope [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::scatterv`](crate::Collectives::scatterv).
    fn iscatterv<T: Pod>(
        &'scope self,
        send: &'scope [T],
        counts: &[usize],
        displs: &[usize],
        recv: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::allgather`](crate::Collectives::allgather).
    fn iallgather<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking
    /// [`Collectives::allgather_in_place`](crate::Collectives::allgather_in_place).
    fn iallgather_in_place<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::allgatherv`](crate::Collectives::allgatherv).
    fn iallgatherv<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking
    /// [`Collectives::allgatherv_in_place`](crate::Collectives::allgatherv_in_place).
    fn iallgatherv_in_place<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::alltoall`](crate::Collectives::alltoall).
    fn ialltoall<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking
    /// [`Collectives::alltoall_in_place`](crate::Collectives::alltoall_in_place).
    fn ialltoall_in_place<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::alltoallv`](crate::Collectives::alltoallv).
    #[allow(clippy::too_many_arguments)]
    fn ialltoallv<T: Pod>(
        &'scope self,
        send: &'scope [T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: &'scope mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking
    /// [`Collectives::alltoallv_in_place`](crate::Collectives::alltoallv_in_place).
    fn ialltoallv_in_place<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking
    /// [`Collectives::reduce_scatter_block`](crate::Collectives::reduce_scatter_block).
    fn ireduce_scatter_block<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::reduce_scatter_block_in_place`](
    /// crate::Collectives::reduce_scatter_block_in_place).
    fn ireduce_scatter_block_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::scan`](crate::Collectives::scan).
    fn iscan<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::scan_in_place`](crate::Collectives::scan_in_place).
    fn iscan_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::exscan`](crate::Collectives::exscan).
    fn iexscan<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::exscan_in_place`](crate::Collectives::exscan_in_place).
    fn iexscan_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
}

/// Starts a planned operation in the scope.
fn start<'scope>(
    s: &'scope RequestScope<'scope, '_>,
    p: Result<Plan<'scope>, CollError>,
) -> Result<Request<'scope>, CollError> {
    let p = p?;
    let op = p.op;
    s.start_schedule(p.sched, p.send, p.recv)
        .map_err(|e| CollError::of(op, e))
}

impl<'scope, 'env> NonBlocking<'scope> for RequestScope<'scope, 'env> {
    fn ibarrier(&'scope self) -> Result<Request<'scope>, CollError> {
        start(self, Ok(plan_barrier(self.comm())))
    }

    fn ibcast<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_bcast(self.comm(), buf, root))
    }

    fn ireduce<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        let c = self.comm();
        start(self, plan_reduce("reduce", c, Some(send), recv, &op, root))
    }

    fn ireduce_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: Op<T>,
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        start(
            self,
            plan_reduce("reduce", self.comm(), None, buf, &op, root),
        )
    }

    fn iallreduce<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_allreduce(self.comm(), Some(send), recv, &op))
    }

    fn iallreduce_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_allreduce(self.comm(), None, buf, &op))
    }

    fn igather<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_gather(self.comm(), Some(send), recv, root))
    }

    fn igather_in_place<T: Pod>(
        &'scope self,
        recv: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_gather(self.comm(), None, recv, root))
    }

    fn igatherv<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        counts: &[usize],
        displs: &[usize],
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        let c = self.comm();
        start(
            self,
            plan_gatherv("gatherv", c, Some(send), recv, counts, displs, root),
        )
    }

    fn iscatter<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_scatter(self.comm(), send, Some(recv), root))
    }

    fn iscatter_in_place<T: Pod>(
        &'scope self,
        send: &'scope [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_scatter(self.comm(), send, None, root))
    }

    fn iscatterv<T: Pod>(
        &'scope self,
        send: &'scope [T],
        counts: &[usize],
        displs: &[usize],
        recv: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        let c = self.comm();
        start(
            self,
            plan_scatterv("scatterv", c, send, counts, displs, Some(recv), root),
        )
    }

    fn iallgather<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_allgather(self.comm(), Some(send), recv))
    }

    fn iallgather_in_place<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_allgather(self.comm(), None, buf))
    }

    fn iallgatherv<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Request<'scope>, CollError> {
        let c = self.comm();
        start(
            self,
            plan_allgatherv("allgatherv", c, Some(send), recv, counts, displs, false),
        )
    }

    fn iallgatherv_in_place<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Request<'scope>, CollError> {
        let c = self.comm();
        start(
            self,
            plan_allgatherv("allgatherv", c, None, buf, counts, displs, false),
        )
    }

    fn ialltoall<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_alltoall(self.comm(), Some(send), recv))
    }

    fn ialltoall_in_place<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_alltoall(self.comm(), None, buf))
    }

    fn ialltoallv<T: Pod>(
        &'scope self,
        send: &'scope [T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: &'scope mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<Request<'scope>, CollError> {
        let c = self.comm();
        start(
            self,
            plan_alltoallv(
                "alltoallv",
                c,
                Some(send),
                scounts,
                sdispls,
                recv,
                rcounts,
                rdispls,
            ),
        )
    }

    fn ialltoallv_in_place<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Request<'scope>, CollError> {
        let c = self.comm();
        start(
            self,
            plan_alltoallv("alltoallv", c, None, &[], &[], buf, counts, displs),
        )
    }

    fn ireduce_scatter_block<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError> {
        start(
            self,
            plan_reduce_scatter_block(self.comm(), Some(send), recv, &op),
        )
    }

    fn ireduce_scatter_block_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_reduce_scatter_block(self.comm(), None, buf, &op))
    }

    fn iscan<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError> {
        let c = self.comm();
        start(self, plan_scan("scan", c, Some(send), recv, &op, false))
    }

    fn iscan_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_scan("scan", self.comm(), None, buf, &op, false))
    }

    fn iexscan<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError> {
        let c = self.comm();
        start(self, plan_scan("exscan", c, Some(send), recv, &op, true))
    }

    fn iexscan_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_scan("exscan", self.comm(), None, buf, &op, true))
    }
}

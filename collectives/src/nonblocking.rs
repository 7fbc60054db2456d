//! Non-blocking collectives ([`NonBlocking`]): every one a schedule started in a
//! request scope, so its request mixes with point-to-point ones.

use weft_fabric::{Pod, Request, RequestScope};

use crate::plan::{
    block_len, counts_of, plan_allgatherv, plan_allreduce, plan_alltoallv, plan_barrier,
    plan_bcast, plan_gatherv, plan_reduce, plan_reduce_scatter_block, plan_scan, plan_scatterv,
    Plan,
};
use crate::{CollError, Element, Op};

/// Non-blocking collectives, started in a [`RequestScope`] of the communicator (see
/// [`Communicator::scope`]): the buffers stay borrowed until the scope ends, and the
/// returned [`Request`] mixes with point-to-point ones.
pub trait NonBlocking<'scope> {
    /// Non-blocking [`Collectives::barrier`].
    fn ibarrier(&'scope self) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::bcast`].
    fn ibcast<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::reduce`].
    fn ireduce<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::allreduce`].
    fn iallreduce<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::allreduce_in_place`].
    fn iallreduce_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::gather`].
    fn igather<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::scatter`].
    fn iscatter<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::allgather`].
    fn iallgather<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::alltoall`].
    fn ialltoall<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::reduce_scatter_block`].
    fn ireduce_scatter_block<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::scan`].
    fn iscan<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
    /// Non-blocking [`Collectives::exscan`].
    fn iexscan<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError>;
}

fn start<'scope>(
    s: &'scope RequestScope<'scope, '_>,
    p: Plan<'scope>,
) -> Result<Request<'scope>, CollError> {
    let op = p.op;
    s.start_schedule(p.sched, p.send, p.recv)
        .map_err(|e| CollError::of(op, e))
}

impl<'scope, 'env> NonBlocking<'scope> for RequestScope<'scope, 'env> {
    fn ibarrier(&'scope self) -> Result<Request<'scope>, CollError> {
        start(self, plan_barrier(self.comm()))
    }

    fn ibcast<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_bcast(self.comm(), buf, root)?)
    }

    fn ireduce<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        start(
            self,
            plan_reduce("reduce", self.comm(), Some(send), recv, &op, root)?,
        )
    }

    fn iallreduce<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_allreduce(self.comm(), Some(send), recv, &op)?)
    }

    fn iallreduce_in_place<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError> {
        start(self, plan_allreduce(self.comm(), None, buf, &op)?)
    }

    fn igather<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        let (c, d) = counts_of(self.comm().size(), send.len());
        start(
            self,
            plan_gatherv("gather", self.comm(), Some(send), recv, &c, &d, root)?,
        )
    }

    fn iscatter<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        root: u32,
    ) -> Result<Request<'scope>, CollError> {
        let (c, d) = counts_of(self.comm().size(), recv.len());
        start(
            self,
            plan_scatterv("scatter", self.comm(), send, &c, &d, Some(recv), root)?,
        )
    }

    fn iallgather<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
    ) -> Result<Request<'scope>, CollError> {
        let (c, d) = counts_of(self.comm().size(), send.len());
        start(
            self,
            plan_allgatherv("allgather", self.comm(), Some(send), recv, &c, &d, true)?,
        )
    }

    fn ialltoall<T: Pod>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
    ) -> Result<Request<'scope>, CollError> {
        let b = block_len("alltoall", self.comm(), send.len())?;
        let (c, d) = counts_of(self.comm().size(), b);
        start(
            self,
            plan_alltoallv("alltoall", self.comm(), send, &c, &d, recv, &c, &d)?,
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
            plan_reduce_scatter_block(self.comm(), send, recv, &op)?,
        )
    }

    fn iscan<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError> {
        start(
            self,
            plan_scan("scan", self.comm(), Some(send), recv, &op, false)?,
        )
    }

    fn iexscan<T: Element>(
        &'scope self,
        send: &'scope [T],
        recv: &'scope mut [T],
        op: Op<T>,
    ) -> Result<Request<'scope>, CollError> {
        start(
            self,
            plan_scan("exscan", self.comm(), Some(send), recv, &op, true)?,
        )
    }
}

//! Weft's collectives: barrier, broadcast, reductions, gathers, scatters, all-to-all and
//! scans on every [`Communicator`], their non-blocking forms, and communicator
//! management (dup, split, split by node, create) with context ids derived locally.
//!
//! ```no_run
//! use weft_collectives::{Collectives, Op};
//! # let fabric = weft_fabric::Fabric::init()?;
//! let world = fabric.world();
//! let mut sum = [0u64; 1];
//! world.allreduce(&[world.rank() as u64], &mut sum, Op::Sum)?;
//! let half = world.split(Some(world.rank() % 2), 0)?.expect("a color was given");
//! half.barrier()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Non-blocking forms start inside a [`RequestScope`], like `isend` and `irecv`, and
//! return the same [`Request`]s (test, wait, `wait_all` and `wait_any` mix both kinds):
//!
//! ```no_run
//! use weft_collectives::{NonBlocking, Op};
//! # let fabric = weft_fabric::Fabric::init()?;
//! let world = fabric.world();
//! let (mine, mut sum) = ([1.0f64; 8], [0.0f64; 8]);
//! world.scope(|s| {
//!     let r = s.iallreduce(&mine, &mut sum, Op::Sum)?;
//!     // ... compute, or run point-to-point, meanwhile ...
//!     r.wait()?;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Semantics
//! Every member calls the collectives of a communicator in the same order (MPI's rule);
//! each operation's messages carry a tag from a per-communicator sequence number on the
//! communicator's collective plane, so collectives never match point-to-point messages,
//! and operations in flight at once (non-blocking ones, or collectives on other
//! communicators from other threads) never match each other's. A member whose
//! arguments disagree in a way a message shows (a count, a root) makes the operation
//! fail with [`CollError::Mismatch`] rather than corrupt data, at the member that sees the
//! disagreement; it tells the others, and a member still waiting in that operation then
//! fails with [`CollError::Aborted`], while a member whose part was complete returns `Ok`
//! with its own results right (a bcast's root when a leaf expects another count, a
//! gather's senders when the root does; see [`CollError::Mismatch`]). A member that dies,
//! or finalizes or exits while others wait on it, makes the operation fail at every
//! survivor with [`CollError::MemberGone`] naming it.
//!
//! # Algorithms
//! Selected by size and shape, tunable with `WEFT_COLL_*` ([`TUNABLES`]): dissemination
//! barrier; binomial and scatter+allgather broadcast; binomial reduce; recursive-doubling,
//! Rabenseifner and ring allreduce; linear gather(v) and scatter(v); Bruck and ring allgather;
//! pairwise all-to-all; ring and rank-ordered reduce-scatter; recursive-doubling scans.
//! Non-commutative operations always reduce in rank order. Within a node, a shared-memory
//! segment (`node`: flags, inline payloads, cells, single-copy reads); across nodes,
//! hierarchical barrier, bcast and small allreduce (`hier`); two members without a
//! segment exchange once (`pair`).
//!
//! # Beyond collectives
//! [`Collectives::fence`] moves the cards committed since the last fence with an
//! allgather instead of through the servers, and [`FabricGroup::create_comm`] makes a
//! communicator from a session group with one allreduce among its members.

#![forbid(unsafe_code)]

mod algo;
mod fence;
mod group;
mod hier;
mod ids;
mod node;
mod nonblocking;
mod op;
mod pair;
mod plan;
mod tunables;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use weft_fabric::sched::{as_bytes, as_bytes_mut};
pub use weft_fabric::{Communicator, Group, Loc, P2pError, Pod, Request, RequestScope};

use algo::At;
pub use nonblocking::NonBlocking;
pub use op::{Element, Op, UserOp};
use plan::{
    block_len, check_root, invalid, plan_allgather, plan_allgatherv, plan_allreduce, plan_alltoall,
    plan_alltoallv, plan_barrier, plan_bcast, plan_gather, plan_gatherv, plan_reduce,
    plan_reduce_scatter_block, plan_scan, plan_scatter, plan_scatterv, shm_reduce,
};
use tunables::Config;
pub use tunables::{Tunable, TUNABLES};

/// Errors of collective operations and communicator management.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CollError {
    /// The root is not a rank of the communicator.
    #[error("{op}: root {root} is not in the communicator (size {size})")]
    InvalidRoot {
        /// The operation.
        op: &'static str,
        /// The root given.
        root: u32,
        /// The communicator's size.
        size: u32,
    },
    /// The arguments are wrong on this member (a buffer too small, counts that do not
    /// fit the communicator).
    #[error("{op}: {what}")]
    InvalidArgs {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        what: String,
    },
    /// The reduction operation is not defined for the element type.
    #[error("{op}: {reduction} is not defined for {ty}")]
    UnsupportedOp {
        /// The operation.
        op: &'static str,
        /// The reduction.
        reduction: &'static str,
        /// The element type.
        ty: &'static str,
    },
    /// The members disagree on the operation's arguments (a message of another size
    /// than this member expected). Given at the member that saw the disagreement; the
    /// members still waiting in the operation get [`CollError::Aborted`] naming it, and
    /// those whose part was complete by then return `Ok` (their results are right): a
    /// bcast where a leaf expects another count fails at that leaf (and with `Aborted` at
    /// a member not done yet when told), a gather where a member sends another count at
    /// the root, an allreduce at every member.
    #[error("{op}: the members disagree on the arguments: {source}")]
    Mismatch {
        /// The operation.
        op: &'static str,
        /// What the transport saw.
        source: P2pError,
    },
    /// A member of the communicator is gone (died, or finalized or exited while others
    /// waited on it) during the operation. Every survivor names the member that ended,
    /// also when another survivor saw it go first (it relays the cause, not its own
    /// failure).
    #[error("{op}: rank {rank} is gone: {reason}")]
    MemberGone {
        /// The operation.
        op: &'static str,
        /// The member (communicator rank).
        rank: u32,
        /// What happened to it.
        reason: String,
    },
    /// Another member failed its part of the operation and told the others (its error
    /// is given: a disagreement it saw, a member it saw gone).
    #[error("{op}: rank {rank} failed its part: {reason}")]
    Aborted {
        /// The operation.
        op: &'static str,
        /// The member that failed (communicator rank).
        rank: u32,
        /// Its error.
        reason: String,
    },
    /// Another member is in a different collective operation at this point, or in the
    /// same one with another root (the members called collectives in different orders,
    /// or disagree on the root).
    #[error("{op}: rank {rank} {what}: the members disagree on the order or the roots of their collective operations")]
    OutOfOrder {
        /// The operation.
        op: &'static str,
        /// The member (communicator rank).
        rank: u32,
        /// What it did instead.
        what: String,
    },
    /// Another failure of the operation's messages.
    #[error("{op}: {source}")]
    Transport {
        /// The operation.
        op: &'static str,
        /// The failure.
        source: P2pError,
    },
    /// Making a communicator failed (a server construct after the derived ids ran out).
    #[error("{op}: {reason}")]
    Construct {
        /// The operation.
        op: &'static str,
        /// What failed.
        reason: String,
    },
}

impl CollError {
    fn of(op: &'static str, e: P2pError) -> CollError {
        match e {
            P2pError::PeerGone { rank, reason } => CollError::MemberGone { op, rank, reason },
            P2pError::Aborted { rank, reason } => CollError::Aborted { op, rank, reason },
            e @ (P2pError::SizeMismatch { .. } | P2pError::Truncated { .. }) => {
                CollError::Mismatch { op, source: e }
            }
            e => CollError::Transport { op, source: e },
        }
    }
}

/// Communicators from session groups, agreed among their members over the fabric.
pub trait FabricGroup {
    /// A communicator of the group's members (ranks in group order), like
    /// `Communicator::create_from_group` (MPI_Comm_create_from_group): collective over
    /// the members, which must all call it with the same group and tag. The members
    /// agree with one allreduce among themselves instead of a group construct at the
    /// servers, and the context id comes from the group's first member (its job rank and
    /// a count of its own), so no server is involved (past the id scheme's limits, a
    /// construct at the servers is used instead). Like one made by dup or split, the
    /// communicator has no wire-up group behind it: `free` is local and the session's
    /// finalize has nothing to destruct for it; its own dup and split get their ids
    /// from the root server.
    fn create_comm(&self, tag: &str) -> Result<Communicator, CollError>;
}

impl FabricGroup for Group {
    fn create_comm(&self, tag: &str) -> Result<Communicator, CollError> {
        group::create(self, tag)
    }
}

/// How a communicator is split by [`Collectives::split_type`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SplitType {
    /// The processes that share a node (MPI_COMM_TYPE_SHARED).
    Shared,
}

/// What this crate keeps per communicator (shared by its handles).
#[derive(Debug, Default)]
struct CollState {
    /// The next operation's sequence number (its messages' tag).
    seq: AtomicU32,
    /// Children derived so far (the next one's counter is this plus one).
    children: AtomicU64,
    /// The node-local segment, once the first operation that could use it made it
    /// (`None`: the communicator does not qualify, or it could not be made).
    node: std::sync::OnceLock<Option<node::NodeColl>>,
    /// The node and leader sub-communicators, once the first operation that could use
    /// them made them (`None`: the communicator does not span nodes usefully).
    hier: std::sync::OnceLock<Option<hier::Hier>>,
}

/// The communicator's node-local segment, made on first use (collective: every member
/// calls this at the same operation), if the communicator qualifies.
fn node(comm: &Communicator) -> Option<&node::NodeColl> {
    if !Config::get().shm {
        return None;
    }
    let c = Config::get();
    state(comm)
        .node
        .get_or_init(|| node::setup(comm, c.single_copy))
        .as_ref()
}

/// The hierarchy of a communicator that spans nodes (made on first use, without
/// messages), if it helps and `WEFT_COLL_HIER` allows.
fn hier(comm: &Communicator) -> Option<&hier::Hier> {
    if !Config::get().hier {
        return None;
    }
    state(comm).hier.get_or_init(|| hier::setup(comm)).as_ref()
}

/// The segment, for an operation of `bytes` (within `WEFT_COLL_SHM_MAX`).
fn node_for(comm: &Communicator, bytes: usize) -> Option<&node::NodeColl> {
    if bytes > Config::get().shm_max {
        return None;
    }
    node(comm)
}

/// The segment, for a bcast above `WEFT_COLL_SHM_MAX`: every member reads the root's
/// buffer with one copy, when there are 3 or more (for two, the point-to-point
/// rendezvous splits the copy between both and wins).
fn bcast_single_copy(comm: &Communicator) -> Option<&node::NodeColl> {
    if comm.size() < 3 {
        return None;
    }
    node(comm).filter(|nc| nc.single_copy())
}

/// The segment, for an allgather or alltoall whose members' payloads are `bytes` each:
/// through its cells up to [`gather_cells_max`], above with single-copy reads.
fn node_gather(comm: &Communicator, bytes: usize) -> Option<&node::NodeColl> {
    node(comm).filter(|nc| bytes <= gather_cells_max() || nc.single_copy())
}

/// Bytes per member up to which allgather and alltoall go through the segment's cells
/// (every member reads every other's: beyond 4 KiB single-copy reads win).
fn gather_cells_max() -> usize {
    Config::get().shm_max.min(4096)
}

/// The hierarchy, for an allreduce of `count` elements into `recv_len` with `op`: only
/// commutative operations (the order is not rank order) defined for the type, up to
/// `WEFT_COLL_HIER_MAX`, with arguments the flat path would accept (it reports them).
fn hier_reduce<'c, T: Element>(
    comm: &'c Communicator,
    count: usize,
    recv_len: usize,
    op: &Op<T>,
) -> Option<&'c hier::Hier> {
    if count != recv_len
        || !op.commutative()
        || count * std::mem::size_of::<T>() > Config::get().hier_max
        || plan::check_op("allreduce", op).is_err()
    {
        return None;
    }
    hier(comm)
}

/// Whether an allreduce of `count` elements into `recv_len` with `op` on a two-member
/// communicator (without a node segment: those took it already) is one exchange: up to
/// `WEFT_COLL_ALLREDUCE_LARGE` with the algorithm left to Weft, and arguments the flat
/// path would accept (it reports them).
fn pair_reduce<T: Element>(comm: &Communicator, count: usize, recv_len: usize, op: &Op<T>) -> bool {
    let c = Config::get();
    comm.size() == 2
        && count == recv_len
        && c.allreduce == tunables::Allreduce::Auto
        && count * std::mem::size_of::<T>() < c.allreduce_large
        && plan::check_op("allreduce", op).is_ok()
}

fn state(comm: &Communicator) -> &CollState {
    // Only this crate uses the slot, always with `CollState`.
    comm.coll_state(CollState::default)
        .expect("the communicator's collective slot holds CollState")
}

/// The next operation on `comm`: where it runs, with its tag.
fn at(comm: &Communicator) -> At {
    // Relaxed: the counter orders nothing; each member advances its own alike.
    let seq = state(comm).seq.fetch_add(1, Ordering::Relaxed);
    At {
        rank: comm.rank(),
        size: comm.size(),
        tag: seq & 0x7fff_ffff,
    }
}

/// Collective operations and communicator management on a [`Communicator`] (blocking).
///
/// Buffers are typed slices of plain data; counts are in elements. The receive buffer
/// of a rooted operation matters only at its root (others may pass an empty slice).
pub trait Collectives {
    /// Waits until every member has entered the barrier.
    fn barrier(&self) -> Result<(), CollError>;
    /// Broadcasts `buf` from `root` to every member's `buf` (the same length everywhere).
    fn bcast<T: Pod>(&self, buf: &mut [T], root: u32) -> Result<(), CollError>;
    /// Reduces every member's `send` with `op` into `recv` at `root`.
    fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: Op<T>,
        root: u32,
    ) -> Result<(), CollError>;
    /// [`reduce`](Collectives::reduce) in place: `buf` is every member's input, and the
    /// root's result.
    fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: Op<T>,
        root: u32,
    ) -> Result<(), CollError>;
    /// Reduces every member's `send` with `op` into every member's `recv`.
    fn allreduce<T: Element>(&self, send: &[T], recv: &mut [T], op: Op<T>)
        -> Result<(), CollError>;
    /// [`allreduce`](Collectives::allreduce) in place.
    fn allreduce_in_place<T: Element>(&self, buf: &mut [T], op: Op<T>) -> Result<(), CollError>;
    /// Gathers every member's `send` (the same length) into `recv` at `root`, in rank
    /// order.
    fn gather<T: Pod>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<(), CollError>;
    /// Gathers member i's `send` (`counts[i]` elements) to `recv[displs[i]..]` at `root`.
    fn gatherv<T: Pod>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        displs: &[usize],
        root: u32,
    ) -> Result<(), CollError>;
    /// Scatters `send` (at `root`: member i's block is `recv.len()` elements at
    /// `i * recv.len()`) into every member's `recv`.
    fn scatter<T: Pod>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<(), CollError>;
    /// Scatters `send[displs[i]..][..counts[i]]` (at `root`) to member i's `recv`.
    fn scatterv<T: Pod>(
        &self,
        send: &[T],
        counts: &[usize],
        displs: &[usize],
        recv: &mut [T],
        root: u32,
    ) -> Result<(), CollError>;
    /// Gathers every member's `send` (the same length) into every member's `recv`.
    fn allgather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollError>;
    /// [`allgather`](Collectives::allgather) in place: each member's block is already
    /// at `rank * (buf.len() / size)`.
    fn allgather_in_place<T: Pod>(&self, buf: &mut [T]) -> Result<(), CollError>;
    /// Gathers member i's `send` (`counts[i]` elements) to every `recv[displs[i]..]`.
    fn allgatherv<T: Pod>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<(), CollError>;
    /// [`allgatherv`](Collectives::allgatherv) in place: each member's block is already
    /// at `buf[displs[rank]..][..counts[rank]]`.
    fn allgatherv_in_place<T: Pod>(
        &self,
        buf: &mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<(), CollError>;
    /// Sends block j of `send` to member j and receives member i's block into block i
    /// of `recv` (blocks of `send.len() / size` elements).
    fn alltoall<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollError>;
    /// All-to-all with per-member counts and displacements (in elements).
    #[allow(clippy::too_many_arguments)]
    fn alltoallv<T: Pod>(
        &self,
        send: &[T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: &mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<(), CollError>;
    /// [`alltoallv`](Collectives::alltoallv) in place (MPI_IN_PLACE): block j of `buf`
    /// (`counts[j]` elements at `displs[j]`) is sent to member j and replaced by what
    /// member j sends here, so member j's `counts[i]` must equal member i's `counts[j]`.
    fn alltoallv_in_place<T: Pod>(
        &self,
        buf: &mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<(), CollError>;
    /// Reduces every member's `send` (size x `recv.len()` elements) with `op` and
    /// leaves block i of the result at member i.
    fn reduce_scatter_block<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: Op<T>,
    ) -> Result<(), CollError>;
    /// Inclusive prefix reduction: member i gets `send_0 op ... op send_i`.
    fn scan<T: Element>(&self, send: &[T], recv: &mut [T], op: Op<T>) -> Result<(), CollError>;
    /// Exclusive prefix reduction: member i > 0 gets `send_0 op ... op send_(i-1)`;
    /// member 0's `recv` is left as it was.
    fn exscan<T: Element>(&self, send: &[T], recv: &mut [T], op: Op<T>) -> Result<(), CollError>;
    /// [`gather`](Collectives::gather) at the root with its own block already in place
    /// (block `root` of `recv`, MPI_IN_PLACE); the other members call `gather`.
    fn gather_in_place<T: Pod>(&self, recv: &mut [T], root: u32) -> Result<(), CollError>;
    /// [`scatter`](Collectives::scatter) at the root, whose own block stays in `send`
    /// (MPI_IN_PLACE); the other members call `scatter`.
    fn scatter_in_place<T: Pod>(&self, send: &[T], root: u32) -> Result<(), CollError>;
    /// [`alltoall`](Collectives::alltoall) in place: `buf` holds the blocks to send and
    /// receives the blocks sent here.
    fn alltoall_in_place<T: Pod>(&self, buf: &mut [T]) -> Result<(), CollError>;
    /// [`reduce_scatter_block`](Collectives::reduce_scatter_block) in place: `buf` holds
    /// this member's input (size x the block) and receives its block of the result in
    /// its first elements.
    fn reduce_scatter_block_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: Op<T>,
    ) -> Result<(), CollError>;
    /// [`scan`](Collectives::scan) in place: `buf` is this member's input and result.
    fn scan_in_place<T: Element>(&self, buf: &mut [T], op: Op<T>) -> Result<(), CollError>;
    /// [`exscan`](Collectives::exscan) in place (member 0's `buf` is left as it was).
    fn exscan_in_place<T: Element>(&self, buf: &mut [T], op: Op<T>) -> Result<(), CollError>;

    /// A communicator of the same members with a new context id (MPI_Comm_dup),
    /// derived locally: no message, no server call.
    fn dup(&self) -> Result<Communicator, CollError>;
    /// Splits by `color` (MPI_Comm_split): the members with the same color form a new
    /// communicator, ranked by `key` then by their rank here; `None` (MPI_UNDEFINED)
    /// joins none and gets `None`. One allgather of (color, key); the context ids are
    /// derived locally.
    fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>, CollError>;
    /// Splits by type: [`SplitType::Shared`] gives the members on this node.
    fn split_type(&self, kind: SplitType, key: i32) -> Result<Communicator, CollError>;
    /// A communicator of the members of `group` (job ranks; all of them members of
    /// this communicator, in the group's order), called by every member of this one
    /// with the same group (MPI_Comm_create); `None` for those outside it.
    fn create(&self, group: &Group) -> Result<Option<Communicator>, CollError>;
    /// A fence among the members run by the fabric instead of the wire-up servers
    /// (called by every member): afterwards a get of any member's key sees what it
    /// committed before the fence, as after a server fence of mode Full among them.
    /// What each member committed since its last fence moves with an allgather (through
    /// the node's shared memory and the network), so with nothing committed it costs
    /// about a barrier; the servers are not involved, and processes outside the
    /// communicator find the data at the servers as before. Needs the wire-up service
    /// (a fabric started by `weft run`).
    fn fence(&self) -> Result<(), CollError>;
}

impl Collectives for Communicator {
    fn barrier(&self) -> Result<(), CollError> {
        if let Some(nc) = node(self) {
            return nc.barrier(self);
        }
        if let Some(h) = hier(self) {
            return h.barrier(self);
        }
        if self.size() == 2 {
            return pair::barrier(self);
        }
        plan_barrier(self).run(self)
    }

    fn bcast<T: Pod>(&self, buf: &mut [T], root: u32) -> Result<(), CollError> {
        check_root("bcast", self, root)?;
        if let Some(nc) = node_for(self, std::mem::size_of_val(buf)) {
            return nc.bcast(self, as_bytes_mut(buf), root);
        }
        if let Some(nc) = bcast_single_copy(self) {
            return nc.bcast(self, as_bytes_mut(buf), root);
        }
        if let Some(h) = hier(self) {
            return h.bcast(self, buf, root);
        }
        plan_bcast(self, buf, root)?.run(self)
    }

    fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: Op<T>,
        root: u32,
    ) -> Result<(), CollError> {
        if let Some(r) = shm_reduce("reduce", self, Some(send), recv, &op, Some(root)) {
            return r;
        }
        plan_reduce("reduce", self, Some(send), recv, &op, root)?.run(self)
    }

    fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: Op<T>,
        root: u32,
    ) -> Result<(), CollError> {
        if let Some(r) = shm_reduce("reduce", self, None, buf, &op, Some(root)) {
            return r;
        }
        plan_reduce("reduce", self, None, buf, &op, root)?.run(self)
    }

    fn allreduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: Op<T>,
    ) -> Result<(), CollError> {
        if let Some(r) = shm_reduce("allreduce", self, Some(send), recv, &op, None) {
            return r;
        }
        if let Some(h) = hier_reduce(self, send.len(), recv.len(), &op) {
            return h.allreduce(self, Some(send), recv, &op);
        }
        if pair_reduce(self, send.len(), recv.len(), &op) {
            return pair::allreduce(self, Some(send), recv, &op);
        }
        plan_allreduce(self, Some(send), recv, &op)?.run(self)
    }

    fn allreduce_in_place<T: Element>(&self, buf: &mut [T], op: Op<T>) -> Result<(), CollError> {
        if let Some(r) = shm_reduce("allreduce", self, None, buf, &op, None) {
            return r;
        }
        if let Some(h) = hier_reduce(self, buf.len(), buf.len(), &op) {
            return h.allreduce(self, None, buf, &op);
        }
        if pair_reduce(self, buf.len(), buf.len(), &op) {
            return pair::allreduce(self, None, buf, &op);
        }
        plan_allreduce(self, None, buf, &op)?.run(self)
    }

    fn gather<T: Pod>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<(), CollError> {
        plan_gather(self, Some(send), recv, root)?.run(self)
    }

    fn gatherv<T: Pod>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        displs: &[usize],
        root: u32,
    ) -> Result<(), CollError> {
        plan_gatherv("gatherv", self, Some(send), recv, counts, displs, root)?.run(self)
    }

    fn scatter<T: Pod>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<(), CollError> {
        plan_scatter(self, send, Some(recv), root)?.run(self)
    }

    fn scatterv<T: Pod>(
        &self,
        send: &[T],
        counts: &[usize],
        displs: &[usize],
        recv: &mut [T],
        root: u32,
    ) -> Result<(), CollError> {
        plan_scatterv("scatterv", self, send, counts, displs, Some(recv), root)?.run(self)
    }

    fn allgather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollError> {
        let b = std::mem::size_of_val(send);
        if recv.len() == send.len() * self.size() as usize {
            if let Some(nc) = node_gather(self, b) {
                return nc.allgather(self, Some(as_bytes(send)), as_bytes_mut(recv), b);
            }
        }
        plan_allgather(self, Some(send), recv)?.run(self)
    }

    fn allgather_in_place<T: Pod>(&self, buf: &mut [T]) -> Result<(), CollError> {
        let b = block_len("allgather", self, buf.len())?;
        let bytes = b * std::mem::size_of::<T>();
        if let Some(nc) = node_gather(self, bytes) {
            return nc.allgather(self, None, as_bytes_mut(buf), bytes);
        }
        plan_allgather(self, None, buf)?.run(self)
    }

    fn allgatherv<T: Pod>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<(), CollError> {
        plan_allgatherv("allgatherv", self, Some(send), recv, counts, displs, false)?.run(self)
    }

    fn allgatherv_in_place<T: Pod>(
        &self,
        buf: &mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<(), CollError> {
        plan_allgatherv("allgatherv", self, None, buf, counts, displs, false)?.run(self)
    }

    fn alltoall<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollError> {
        let b = block_len("alltoall", self, send.len())?;
        let bytes = b * std::mem::size_of::<T>();
        if recv.len() == send.len() {
            if let Some(nc) = node_gather(self, self.size() as usize * bytes) {
                return nc.alltoall(self, as_bytes(send), as_bytes_mut(recv), bytes);
            }
        }
        plan_alltoall(self, Some(send), recv)?.run(self)
    }

    fn alltoallv<T: Pod>(
        &self,
        send: &[T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: &mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<(), CollError> {
        plan_alltoallv(
            "alltoallv",
            self,
            Some(send),
            scounts,
            sdispls,
            recv,
            rcounts,
            rdispls,
        )?
        .run(self)
    }

    fn alltoallv_in_place<T: Pod>(
        &self,
        buf: &mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<(), CollError> {
        plan_alltoallv("alltoallv", self, None, &[], &[], buf, counts, displs)?.run(self)
    }

    fn reduce_scatter_block<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: Op<T>,
    ) -> Result<(), CollError> {
        plan_reduce_scatter_block(self, Some(send), recv, &op)?.run(self)
    }

    fn scan<T: Element>(&self, send: &[T], recv: &mut [T], op: Op<T>) -> Result<(), CollError> {
        plan_scan("scan", self, Some(send), recv, &op, false)?.run(self)
    }

    fn exscan<T: Element>(&self, send: &[T], recv: &mut [T], op: Op<T>) -> Result<(), CollError> {
        plan_scan("exscan", self, Some(send), recv, &op, true)?.run(self)
    }

    fn gather_in_place<T: Pod>(&self, recv: &mut [T], root: u32) -> Result<(), CollError> {
        plan_gather(self, None, recv, root)?.run(self)
    }

    fn scatter_in_place<T: Pod>(&self, send: &[T], root: u32) -> Result<(), CollError> {
        plan_scatter(self, send, None, root)?.run(self)
    }

    fn alltoall_in_place<T: Pod>(&self, buf: &mut [T]) -> Result<(), CollError> {
        let send = buf.to_vec();
        self.alltoall(&send, buf)
    }

    fn reduce_scatter_block_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: Op<T>,
    ) -> Result<(), CollError> {
        plan_reduce_scatter_block(self, None, buf, &op)?.run(self)
    }

    fn scan_in_place<T: Element>(&self, buf: &mut [T], op: Op<T>) -> Result<(), CollError> {
        plan_scan("scan", self, None, buf, &op, false)?.run(self)
    }

    fn exscan_in_place<T: Element>(&self, buf: &mut [T], op: Op<T>) -> Result<(), CollError> {
        plan_scan("exscan", self, None, buf, &op, true)?.run(self)
    }

    fn dup(&self) -> Result<Communicator, CollError> {
        let members: Vec<u32> = (0..self.size()).collect();
        child(self, "dup", &members, 1, 0)
    }

    fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>, CollError> {
        const OP: &str = "split";
        // (color + 1, or 0 for none; key) of every member.
        let mine = [color.map_or(0, |c| i64::from(c) + 1), i64::from(key)];
        let mut all = vec![[0i64; 2]; self.size() as usize];
        self.allgather(&[mine], &mut all).map_err(|e| match e {
            CollError::MemberGone { rank, reason, .. } => CollError::MemberGone {
                op: OP,
                rank,
                reason,
            },
            e => e,
        })?;
        let mut colors: Vec<i64> = all.iter().map(|c| c[0]).filter(|&c| c != 0).collect();
        colors.sort_unstable();
        colors.dedup();
        let Some(color) = color else {
            // Advance the counter like the others.
            state(self)
                .children
                .fetch_add(colors.len() as u64, Ordering::Relaxed);
            return Ok(None);
        };
        let c = i64::from(color) + 1;
        let index = colors.iter().position(|&x| x == c).unwrap_or(0);
        let mut members: Vec<u32> = (0..self.size())
            .filter(|&r| all[r as usize][0] == c)
            .collect();
        members.sort_by_key(|&r| (all[r as usize][1], r));
        child(self, OP, &members, colors.len() as u64, index as u64).map(Some)
    }

    fn split_type(&self, kind: SplitType, key: i32) -> Result<Communicator, CollError> {
        const OP: &str = "split_type";
        match kind {
            SplitType::Shared => {
                let node = self
                    .node_of(self.rank())
                    .ok_or_else(|| CollError::Construct {
                        op: OP,
                        reason: "this process's node is unknown (no wire-up service)".into(),
                    })?;
                let c = self.split(Some(node), key)?;
                c.ok_or_else(|| CollError::Construct {
                    op: OP,
                    reason: "no communicator for this node".into(),
                })
            }
        }
    }

    fn fence(&self) -> Result<(), CollError> {
        fence::run(self)
    }

    fn create(&self, group: &Group) -> Result<Option<Communicator>, CollError> {
        const OP: &str = "create";
        let jobs = self.job_ranks();
        let mut members = Vec::with_capacity(group.members().len());
        for &j in group.members() {
            match jobs.iter().position(|&x| x == j) {
                Some(r) => members.push(r as u32),
                None => {
                    return Err(invalid(
                        OP,
                        format!("job rank {j} of the group is not in the communicator"),
                    ))
                }
            }
        }
        if !members.contains(&self.rank()) {
            state(self).children.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        child(self, OP, &members, 1, 0).map(Some)
    }
}

/// Child `index` of `count` made at once (a split's colors) of `parent`: a derived id
/// if one is left, else a PGCID from the root server.
fn child(
    parent: &Communicator,
    op: &'static str,
    members: &[u32],
    count: u64,
    index: u64,
) -> Result<Communicator, CollError> {
    // Relaxed: each member advances its own counter alike (collective order).
    let first = state(parent).children.fetch_add(count, Ordering::Relaxed) + 1;
    let n = first + index;
    let comm = match ids::derive(parent.context_id(), n) {
        Some(ctx) => parent
            .derive(members, ctx)
            .map_err(|e| CollError::of(op, e))?,
        None => {
            tracing::debug!(
                "{op}: no derived context id left below {:#x} (child {n}, capacity {}): asking the root server",
                parent.context_id(),
                ids::capacity(parent.context_id())
            );
            let id = format!("{:x}/{n}", parent.context_id());
            parent
                .construct_on_server(members, &id)
                .map_err(|e| CollError::Construct {
                    op,
                    reason: e.to_string(),
                })?
        }
    };
    Ok(comm)
}

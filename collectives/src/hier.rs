//! Hierarchical collectives for communicators that span nodes: a phase among the members
//! of each node (through that node's shared-memory segment), one among the nodes'
//! leaders (the first member of each node, over the network), and a release on each
//! node. Used for barrier, bcast, and allreduce of commutative operations up to
//! `WEFT_COLL_HIER_MAX` (the node-then-leaders order is not rank order; larger vectors
//! keep the bandwidth-optimal flat ring), when some node holds two or more members.
//! `WEFT_COLL_HIER=off` keeps the flat point-to-point algorithms.
//!
//! The two sub-communicators (this node's members; the leaders) are made without any
//! message when the first such collective runs: every member knows every member's node,
//! and their ids derive from the communicator's like two children of a split (every
//! member advances the communicator's child counter by two, leaders or not).
//!
//! # Failures
//! A phase that fails at a member (a member died) does not stop it: it records the
//! failure in a status word and goes through the remaining phases, whose waits involve
//! only live members or fail fast, so nobody waits for it. The leaders combine their
//! statuses in their phase (an allreduce of the status, or the status riding with the
//! vector), each leader hands its node the result in the release, and every member ends
//! with the same verdict: success, or the error naming the failed member (in this
//! communicator's ranks).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use std::sync::Arc;

use weft_fabric::sched::{as_bytes, as_bytes_mut, cast_slice, cast_slice_mut, Buf};
use weft_fabric::{Communicator, Pod};

use crate::op::{apply, ByteOp, Scratch};
use crate::{algo, at as at_of, ids, state, CollError, Collectives, Element, Op};

/// Status of a member that saw no failure.
const OK: u32 = 0;
/// Status of a failure other than a member gone (its rank is then unknown).
const OTHER: u32 = u32::MAX;
/// How long a member told of a failure below it waits for the fabric to name the failed
/// member before it reports the failure without a name.
const FAILED_MEMBER_WAIT: Duration = Duration::from_millis(500);

/// What one member saw of an operation's phases: the highest status, and its own first
/// error.
#[derive(Debug, Default)]
struct Seen {
    status: u32,
    first: Option<CollError>,
}

impl Seen {
    /// Takes in the result of a phase on the sub-communicator whose members are `ranks`.
    fn note(&mut self, ranks: &[u32], r: Result<(), CollError>) {
        if let Err(e) = r {
            self.status = self.status.max(Hier::status(ranks, &e));
            self.first.get_or_insert(e);
        }
    }

    /// Takes in a status another member passed on.
    fn raise(&mut self, s: u32) {
        self.status = self.status.max(s);
    }

    /// The operation's result.
    fn verdict(self, comm: &Communicator, op: &'static str) -> Result<(), CollError> {
        if self.status == OK {
            return Ok(());
        }
        Err(Hier::verdict(comm, op, self.status, self.first))
    }
}

/// A communicator's node-level and leader-level sub-communicators.
#[derive(Debug)]
pub(crate) struct Hier {
    /// The members on this node, in communicator order (the leader is rank 0).
    local: Communicator,
    /// Communicator ranks of `local`'s members.
    local_ranks: Vec<u32>,
    /// The leaders, one per node in order of their first member (leaders only).
    leaders: Option<Communicator>,
    /// Communicator ranks of the leaders.
    leader_ranks: Vec<u32>,
    /// Per communicator rank: its node's index (its leader's rank among the leaders)
    /// and its rank among its node's members.
    place: Vec<(u32, u32)>,
    /// This member's node's index.
    my_node: u32,
}

/// The hierarchy of `comm`, or `None` when it does not help (one node, or one member per
/// node) or cannot be made (nodes unknown, no derived id left).
pub(crate) fn setup(comm: &Communicator) -> Option<Hier> {
    let n = comm.size();
    if n < 3 {
        return None;
    }
    let nodes: Vec<u32> = (0..n).map(|r| comm.node_of(r)).collect::<Option<_>>()?;
    let mut order: Vec<u32> = Vec::new();
    let mut place = Vec::with_capacity(n as usize);
    let mut counts: Vec<u32> = Vec::new();
    for &nd in &nodes {
        let i = match order.iter().position(|&x| x == nd) {
            Some(i) => i,
            None => {
                order.push(nd);
                counts.push(0);
                order.len() - 1
            }
        };
        place.push((i as u32, counts[i]));
        counts[i] += 1;
    }
    if order.len() < 2 || counts.iter().all(|&c| c == 1) {
        return None;
    }
    // Relaxed: each member advances its own counter alike (collective order).
    let first = state(comm).children.fetch_add(2, Ordering::Relaxed) + 1;
    let (local_id, leaders_id) = (
        ids::derive(comm.context_id(), first)?,
        ids::derive(comm.context_id(), first + 1)?,
    );
    let me = comm.rank() as usize;
    let my_node = place[me].0;
    let local_ranks: Vec<u32> = (0..n).filter(|&r| place[r as usize].0 == my_node).collect();
    let leader_ranks: Vec<u32> = (0..n).filter(|&r| place[r as usize].1 == 0).collect();
    let local = comm.derive(&local_ranks, local_id).ok()?;
    let leaders = if place[me].1 == 0 {
        Some(comm.derive(&leader_ranks, leaders_id).ok()?)
    } else {
        None
    };
    Some(Hier {
        local,
        local_ranks,
        leaders,
        leader_ranks,
        place,
        my_node,
    })
}

impl Hier {
    /// The status for error `e` of a phase on `sub` (whose ranks are `ranks` here).
    fn status(ranks: &[u32], e: &CollError) -> u32 {
        match e {
            CollError::MemberGone { rank, .. } => {
                ranks.get(*rank as usize).map_or(OTHER, |&r| r + 1)
            }
            _ => OTHER,
        }
    }

    /// The error of `op` for status `s` (not [`OK`]), naming the failed member with the
    /// reason this process's node knows (it learns of a death within milliseconds).
    fn verdict(
        comm: &Communicator,
        op: &'static str,
        s: u32,
        mine: Option<CollError>,
    ) -> CollError {
        if s != OTHER {
            let rank = s - 1;
            let deadline = Instant::now() + FAILED_MEMBER_WAIT;
            loop {
                // How it ended (died, or finalized without its part), once this node
                // knows.
                if let Some(reason) = comm.member_gone(rank) {
                    return CollError::MemberGone { op, rank, reason };
                }
                if Instant::now() >= deadline {
                    if let Some((r, reason)) = comm.failed_member() {
                        return CollError::MemberGone {
                            op,
                            rank: r,
                            reason,
                        };
                    }
                    return CollError::MemberGone {
                        op,
                        rank,
                        reason: "it failed (reported by another member)".into(),
                    };
                }
                comm.progress();
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        mine.unwrap_or(CollError::Aborted {
            op,
            rank: comm.rank(),
            reason: "another member's part of the operation failed".into(),
        })
    }

    /// Fan-in to the leader (a reduce of nothing), the leaders' allreduce of their
    /// statuses, fan-out of the result: the members wait for their leader only.
    pub(crate) fn barrier(&self, comm: &Communicator) -> Result<(), CollError> {
        let mut seen = Seen::default();
        let r = self.local.reduce::<u8>(&[], &mut [], Op::Sum, 0);
        seen.note(&self.local_ranks, r);
        if let Some(l) = &self.leaders {
            let mut all = [OK];
            let r = l.allreduce(&[seen.status], &mut all, Op::Max);
            seen.raise(all[0]);
            seen.note(&self.leader_ranks, r);
        }
        let mut v = [seen.status];
        let r = self.local.bcast(&mut v, 0);
        seen.raise(v[0]);
        seen.note(&self.local_ranks, r);
        seen.verdict(comm, "barrier")
    }

    /// The root's node first, then its leader to the other leaders, then each leader to
    /// its node (no status: the data flows one way, and whoever waits on a failed member
    /// sees it).
    pub(crate) fn bcast<T: Pod>(
        &self,
        comm: &Communicator,
        buf: &mut [T],
        root: u32,
    ) -> Result<(), CollError> {
        const OP: &str = "bcast";
        let (root_node, root_local) = self.place[root as usize];
        let lift = |ranks: &[u32], e: CollError| match Self::status(ranks, &e) {
            OTHER => e,
            s => Self::verdict(comm, OP, s, Some(e)),
        };
        if self.my_node == root_node {
            self.local
                .bcast(buf, root_local)
                .map_err(|e| lift(&self.local_ranks, e))?;
        }
        if let Some(l) = &self.leaders {
            l.bcast(buf, root_node)
                .map_err(|e| lift(&self.leader_ranks, e))?;
        }
        if self.my_node != root_node {
            self.local
                .bcast(buf, 0)
                .map_err(|e| lift(&self.local_ranks, e))?;
        }
        Ok(())
    }

    /// Reduce on each node to its leader; the leaders allreduce the vector with their
    /// statuses riding behind it; each leader bcasts the status, then (if all is well)
    /// the vector to its node. `count` elements of a commutative `op`, small enough for
    /// the leaders' recursive doubling (whole vectors, no segments).
    pub(crate) fn allreduce<T: Element>(
        &self,
        comm: &Communicator,
        send: Option<&[T]>,
        recv: &mut [T],
        op: &Op<T>,
    ) -> Result<(), CollError> {
        const OP: &str = "allreduce";
        let count = send.map_or(recv.len(), <[T]>::len);
        let bytes = count * std::mem::size_of::<T>();
        let mut seen = Seen::default();
        let r = match send {
            Some(x) => self.local.reduce(x, &mut recv[..count], op.clone(), 0),
            None => self
                .local
                .reduce_in_place(&mut recv[..count], op.clone(), 0),
        };
        seen.note(&self.local_ranks, r);
        if let Some(l) = &self.leaders {
            // The vector, then the status (a u32 at a 16-byte aligned offset), reduced
            // by one byte operation: the element operation on the vector, max on the
            // status.
            let at = bytes.next_multiple_of(16);
            let total = at + 16;
            // On the stack for vectors up to 48 bytes (the usual case here).
            let (mut mine_s, mut all_s) = (Scratch::default(), Scratch::default());
            let mine_b = mine_s.bytes(total);
            mine_b[..bytes].copy_from_slice(as_bytes(&recv[..count]));
            mine_b[at..at + 4].copy_from_slice(&seen.status.to_ne_bytes());
            let all = all_s.bytes(total);
            let el = op.clone();
            let both: ByteOp = Arc::new(move |input: &[u8], inout: &mut [u8]| {
                let (di, si) = input.split_at(at);
                let (dio, sio) = inout.split_at_mut(at);
                if let (Some(a), Some(b)) = (
                    cast_slice::<T>(&di[..bytes]),
                    cast_slice_mut::<T>(&mut dio[..bytes]),
                ) {
                    apply(&el, a, b);
                }
                let x = u32::from_ne_bytes(si[..4].try_into().unwrap_or_default());
                let y = u32::from_ne_bytes(sio[..4].try_into().unwrap_or_default());
                sio[..4].copy_from_slice(&x.max(y).to_ne_bytes());
            });
            // Recursive doubling whatever the tunables say: whole vectors, so that the
            // status stays where the operation looks for it.
            let sched = algo::allreduce_rd(at_of(l), total, &both, true, Buf::Send.at(0, total));
            let r = l
                .run_schedule(sched, mine_b, all)
                .map_err(|e| CollError::of(OP, e));
            if r.is_ok() {
                let b = &*all;
                seen.raise(u32::from_ne_bytes(
                    b[at..at + 4].try_into().unwrap_or_default(),
                ));
                as_bytes_mut(&mut recv[..count]).copy_from_slice(&b[..bytes]);
            }
            seen.note(&self.leader_ranks, r);
        }
        let mut v = [seen.status];
        let r = self.local.bcast(&mut v, 0);
        seen.raise(v[0]);
        seen.note(&self.local_ranks, r);
        if seen.status == OK {
            let r = self.local.bcast(&mut recv[..count], 0);
            seen.note(&self.local_ranks, r);
        }
        seen.verdict(comm, OP)
    }
}

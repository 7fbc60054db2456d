//! Node-local collectives through a shared-memory segment ([`weft_shm::CollSegment`]):
//! for a communicator whose members all share this node, barrier and small bcast,
//! reduce and allreduce run on flags and payloads in one segment instead of messages.
//!
//! Operation `e` (a per-communicator counter every member advances alike): a member
//! that contributes a payload waits until every member entered operation `e - 1` (so
//! none still reads its payload of parity `e % 2` from operation `e - 2`; usually already
//! true), writes it, and enters `e` (its sequence word, Release). A barrier or an
//! allreduce waits until every member entered `e`; an allreduce then reduces every
//! member's payload itself, in rank order (so non-commutative operations are right and
//! every member gets the same bits); a reduce does so at the root only; a bcast's
//! members wait for the root alone. Each member also publishes its payload length:
//! members that disagree get [`CollError::Mismatch`]. Waiting spins, then yields, then
//! naps, keeps the fabric progressing, and checks for failed members every few
//! thousand looks: a dead member is a [`CollError::MemberGone`] within milliseconds.
//!
//! The segment is made on the first such operation: member 0 creates it under the
//! job's segment prefix, tells the others with a point-to-point broadcast, they open it
//! and all agree (a point-to-point allreduce) before member 0 unlinks the name; if any
//! step fails the communicator keeps using point-to-point algorithms.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use weft_fabric::sched::{as_bytes, as_bytes_mut, cast_slice, Buf};
use weft_fabric::{Communicator, P2pError};
use weft_shm::CollSegment;

use crate::op::{apply, ByteOp, Element, Op};
use crate::{algo, at, CollError};

/// Members past which the flat algorithms here stop paying (every member reads every
/// payload): larger communicators keep the point-to-point algorithms.
const MAX_MEMBERS: u32 = 64;
/// How often a waiting member checks for failed members once it no longer spins.
const CHECK_EVERY: Duration = Duration::from_millis(5);

/// Operation numbers of a segment (see [`NodeColl::epoch`]).
#[derive(Debug, Default)]
struct Epoch {
    started: u64,
    seen_all: u64,
}

/// A communicator's segment and its operation counter.
#[derive(Debug)]
pub(crate) struct NodeColl {
    seg: CollSegment,
    /// The last operation started here, and the last one every member was seen to
    /// have entered (held during an operation: one at a time).
    epoch: Mutex<Epoch>,
}

/// Makes the segment of `comm` (collective over its members), or `None` when the
/// communicator does not qualify or any member cannot map it.
pub(crate) fn setup(comm: &Communicator) -> Option<NodeColl> {
    let n = comm.size();
    if !(2..=MAX_MEMBERS).contains(&n) {
        return None;
    }
    let prefix = comm.node_segment_prefix()?;
    let name = format!("{prefix}coll-{:x}", comm.context_id());
    let me = comm.rank();
    // Member 0 creates; the others learn whether it could (a broadcast of one byte).
    let created = (me == 0).then(|| CollSegment::create(&name, n as usize));
    let mut ok = [u8::from(created.as_ref().is_none_or(Result::is_ok))];
    let run = |sched, send: &[u8], recv: &mut [u8]| comm.run_schedule(sched, send, recv);
    run(algo::bcast_binomial(at(comm), 0, 1), &[], &mut ok).ok()?;
    if ok[0] == 0 {
        if let Some(Err(e)) = &created {
            tracing::warn!("collective segment {name}: {e}; using point-to-point");
        }
        return None;
    }
    let seg = match created {
        Some(c) => c.ok(),
        None => match CollSegment::open(&name, n as usize, me as usize) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("collective segment {name}: {e}; using point-to-point");
                None
            }
        },
    };
    // Every member must have it (a min over the members, bitwise and of 0/1).
    let mine = [u8::from(seg.is_some())];
    let mut all = [0u8];
    let and: ByteOp = std::sync::Arc::new(|i: &[u8], o: &mut [u8]| o[0] &= i[0]);
    run(
        algo::allreduce_rd(at(comm), 1, &and, true, Buf::Send.at(0, 1)),
        &mine,
        &mut all,
    )
    .ok()?;
    if me == 0 {
        if let Some(s) = &seg {
            // Every member has it mapped (or gave up): the name can go.
            let _ = s.unlink();
        }
    }
    if all[0] == 0 {
        return None;
    }
    seg.map(|seg| NodeColl {
        seg,
        epoch: Mutex::new(Epoch::default()),
    })
}

impl NodeColl {
    /// Starts the next operation: its number, and the lock that keeps it the only one.
    fn begin(&self) -> (std::sync::MutexGuard<'_, Epoch>, u64) {
        let mut g = self
            .epoch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.started += 1;
        let e = g.started;
        (g, e)
    }

    /// Waits until `ready` holds, keeping the fabric progressing and failing if a member
    /// failed.
    fn wait(
        &self,
        op: &'static str,
        comm: &Communicator,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), CollError> {
        let mut spins = 0u32;
        let mut checked = Instant::now();
        loop {
            if ready() {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            if spins % 256 == 0 {
                comm.progress();
            }
            let check = if spins < weft_fabric::spin_limit() {
                std::hint::spin_loop();
                spins % 4096 == 0
            } else {
                if spins < 1 << 20 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
                checked.elapsed() >= CHECK_EVERY
            };
            if check {
                checked = Instant::now();
                if let Some((rank, reason)) = comm.failed_member() {
                    return Err(CollError::MemberGone { op, rank, reason });
                }
            }
        }
    }

    /// Waits until every member entered operation `e` (at once when this member saw
    /// them all enter it or a later one already).
    fn wait_all(
        &self,
        op: &'static str,
        comm: &Communicator,
        ep: &mut Epoch,
        e: u64,
    ) -> Result<(), CollError> {
        if ep.seen_all >= e {
            return Ok(());
        }
        let n = self.seg.members();
        let mut next = 0;
        self.wait(op, comm, || {
            while next < n && self.seg.seq(next) >= e {
                next += 1;
            }
            next == n
        })?;
        ep.seen_all = e;
        Ok(())
    }

    /// Checks that member `r` entered operation `e` with `len` bytes too.
    fn same_len(&self, op: &'static str, r: usize, e: u64, len: usize) -> Result<(), CollError> {
        let got = self.seg.len(r, e) as usize;
        if got != len {
            return Err(CollError::Mismatch {
                op,
                source: P2pError::SizeMismatch {
                    rank: r as u32,
                    tag: 0,
                    expected: len,
                    got,
                },
            });
        }
        Ok(())
    }

    pub(crate) fn barrier(&self, comm: &Communicator) -> Result<(), CollError> {
        let (mut g, e) = self.begin();
        self.seg.enter_bare(e);
        self.wait_all("barrier", comm, &mut g, e)
    }

    pub(crate) fn bcast(
        &self,
        comm: &Communicator,
        buf: &mut [u8],
        root: u32,
    ) -> Result<(), CollError> {
        const OP: &str = "bcast";
        let (mut g, e) = self.begin();
        let root = root as usize;
        self.wait_all(OP, comm, &mut g, e - 1)?;
        if comm.rank() as usize == root {
            self.seg.put(e, buf);
            self.seg.enter(e, buf.len() as u64);
            // Members have nothing for the root: done (they read before entering e + 1,
            // which the root's next payload of this parity waits for).
            return Ok(());
        }
        self.seg.enter(e, buf.len() as u64);
        self.wait(OP, comm, || self.seg.seq(root) >= e)?;
        self.same_len(OP, root, e, buf.len())?;
        self.seg.get(root, e, buf);
        Ok(())
    }

    /// Reduce (to `root`, or to everyone when `root` is `None`) of `count` elements from
    /// `mine` (this member's input: the send buffer, or `recv` itself in place) into
    /// `recv`, typed (no closure, no allocation for small vectors).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce<T: Element>(
        &self,
        op_name: &'static str,
        comm: &Communicator,
        mine: Option<&[T]>,
        recv: &mut [T],
        count: usize,
        op: &Op<T>,
        root: Option<u32>,
    ) -> Result<(), CollError> {
        let (mut g, e) = self.begin();
        let n = self.seg.members();
        let me = comm.rank() as usize;
        let bytes = count * std::mem::size_of::<T>();
        self.wait_all(op_name, comm, &mut g, e - 1)?;
        match mine {
            Some(m) => self.seg.put(e, as_bytes(m)),
            None => self.seg.put(e, as_bytes(&recv[..count])),
        }
        self.seg.enter(e, bytes as u64);
        if root.is_some_and(|r| r as usize != me) {
            return Ok(());
        }
        self.wait_all(op_name, comm, &mut g, e)?;
        for r in 0..n {
            self.same_len(op_name, r, e, bytes)?;
        }
        // x0 op (x1 op (... op x(n-1))), from the right, the same bits everywhere.
        let out = &mut recv[..count];
        self.seg.get(n - 1, e, as_bytes_mut(out));
        let mut small = [0u128; 4];
        let mut large = Vec::new();
        let words = bytes.div_ceil(16);
        let tmp: &mut [u128] = if words <= small.len() {
            &mut small[..words]
        } else {
            large.resize(words, 0u128);
            &mut large
        };
        let tmp = &mut as_bytes_mut(tmp)[..bytes];
        for r in (0..n - 1).rev() {
            self.seg.get(r, e, tmp);
            let input = cast_slice::<T>(tmp).ok_or_else(|| CollError::InvalidArgs {
                op: op_name,
                what: "misaligned scratch".into(),
            })?;
            apply(op, input, out);
        }
        Ok(())
    }
}

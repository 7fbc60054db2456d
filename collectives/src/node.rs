//! Node-local collectives through a shared-memory segment ([`weft_shm::CollSegment`]):
//! for a communicator whose members all share this node, barrier, bcast, reduce,
//! allreduce, allgather and alltoall run on flags and payloads in one segment instead
//! of messages.
//!
//! # Stages
//! Every operation takes three stages of the segment (operation `k` owns stages
//! `3k + 1 ..= 3k + 3`), whatever it is, so that members stay in step even when one of
//! them fails an operation the others do not: a member's sequence word says the last
//! stage it entered, and every operation ends with the member entering `3k + 3`.
//!
//! - Before a member writes anything for operation `k` (a payload, a descriptor, its
//!   word) it waits until every member entered `3k` (the end of operation `k - 1`), so
//!   nobody still reads what it wrote for operation `k - 2` in the same parity.
//! - A member's word (per parity) packs the operation's number (12 bits), its kind, its
//!   root and its byte count: a reader compares it with its own expectation, so a count
//!   that differs ([`CollError::Mismatch`]), another root or another operation
//!   ([`CollError::OutOfOrder`]) is an error, never a wrong read.
//!
//! # Small bcasts: the root's ring (up to 240 bytes)
//! A bcast of up to 240 bytes (and `WEFT_COLL_SHM_MAX`) goes through the root's ring of
//! 64 slots instead of its line: the root writes slot `k % 64` of operation `k`, stamps
//! it and enters `3k + 3` without waiting for anyone, unless the slot was last used by
//! an operation some member has not returned from (a member's `done` word, or the stage
//! it entered, says how far it got). So when members wait for a CPU the root runs up to
//! 64 operations ahead, as eager point-to-point sends would, while the checks stay: the
//! slot carries the root's word (a member that expects another count fails with
//! `Mismatch`), and a root that entered the operation's last stage without stamping
//! called something else (`OutOfOrder`, not a hang). This is the one exception to the
//! rule above: the ring is the root's alone, and nothing of a parity is written.
//!
//! # Small payloads (up to `WEFT_COLL_SHM_MAX`, 4 KiB)
//! Payloads go inline in the member's line (48 B) or in its cell: a member writes its
//! own, enters `3k + 3`, and reads the others' once they entered it. Reductions run in
//! rank order at every reader, so non-commutative operations are right and every member
//! gets the same bits.
//!
//! # Large payloads: single copy
//! When every member can read every other's memory with cross-memory attach (probed
//! when the segment is made; `WEFT_COLL_SINGLE_COPY`), larger bcast, reduce, allreduce,
//! allgather and alltoall publish their buffers' addresses instead (stage `3k + 1`) and
//! read each other's buffers with one copy each (`process_vm_readv`):
//! - allgather and alltoall: each member reads its blocks from every other member, then
//!   enters `3k + 3` and waits for all (its buffers are read until then);
//! - bcast (3 or more members): each member reads the root's buffer, and the root
//!   returns once all have entered `3k + 3`;
//! - reduce and allreduce: the vector is cut in one segment per member; each member
//!   reduces its own segment from everyone's input, in chunks of 64 KiB that stay in
//!   cache (stage `3k + 2`: done), then the members (allreduce) or the root (reduce)
//!   read the reduced segments; with two members and up to 256 KiB, each reads the
//!   other's whole input instead (one phase, clean data).
//!
//! A failure in the middle of such an operation (a member that died, a read the kernel
//! refused) marks this member's word as aborted, so nobody waits for it, and leaves the
//! communicator's segment unusable (later node-local operations fail at once).
//!
//! # The release/gather tree
//! From `WEFT_COLL_SHM_TREE` members (default 9) the barrier runs over a k-ary tree of
//! the members in heap order (`WEFT_COLL_SHM_RADIX` children each, default 4; each
//! member's two tree words on their own cache lines): a member waits for its children's
//! gather words, sets its own, waits for its parent's release word and sets its own. That
//! is 2 log_k(N) hops where the flat barrier takes one, but each member reads k + 1 lines
//! instead of N (the flat barrier's N^2 line transfers grow past what one hop saves). The
//! crossover could not be measured on the 2-core development machine (2 members: flat
//! 0.15-0.18 us; more members only oversubscribed): the default keeps the flat barrier up
//! to 8 members, where it costs 64 line reads, and is a tunable.
//!
//! # Waiting
//! Waiting spins, then yields, then naps, keeps the fabric progressing, and checks for
//! failed members every few thousand looks: a dead member is a
//! [`CollError::MemberGone`] within milliseconds.
//!
//! # Setup
//! The segment is made on the first operation that could use it: member 0 creates it
//! under the job's segment prefix, tells the others with a point-to-point broadcast,
//! they open it and all agree (a point-to-point allreduce) before member 0 unlinks the
//! name, then they probe single-copy reads of each other (another allreduce); if any
//! step fails the communicator keeps using point-to-point algorithms.

use std::time::{Duration, Instant};

use weft_fabric::sched::{as_bytes, as_bytes_mut, cast_slice, cast_slice_mut, Buf};
use weft_fabric::{Communicator, P2pError, SpinGuard, SpinLock};
use weft_shm::{cma_read, CollSegment};

use crate::op::{apply, misaligned, ByteOp, Element, Op};
use crate::{algo, at, CollError};

mod reduce;

/// Members past which the flat algorithms here stop paying (every member reads every
/// payload): larger communicators keep the point-to-point algorithms.
const MAX_MEMBERS: u32 = 64;
/// How often a waiting member checks for failed members once it no longer spins.
const CHECK_EVERY: Duration = Duration::from_millis(5);
/// Stages per operation (see the module's documentation).
const STAGES: u64 = 3;
/// Bytes a member reduces at a time in a single-copy reduction (stays in cache). Measured
/// on 2 cores (2 MiB of L2 each), 2 members: 256 KiB against 64 KiB takes 0.85x the time
/// at 256 KiB, 0.95x at 1 MiB and 4 MiB (fewer reads, each pinning its pages); 512 KiB
/// gains nothing more.
const CHUNK: usize = 256 << 10;
/// Bytes up to which a two-member single-copy reduction reads the other's whole input
/// (one phase, clean data) rather than reduce-scatter (two phases, the second reading
/// segments dirty in the other core's cache): measured on 2 cores with 256 KiB chunks,
/// 512 KiB takes 42 us in one phase against 56 us in two, 1 MiB 148 us against 135 us.
const PAIR_MAX: usize = 512 << 10;
/// What the setup probe reads from the other members.
static PROBE: u64 = 0x5745_4654_5052_4f42;

/// The operations, as they appear in a member's word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Bcast = 1,
    Reduce = 2,
    Allreduce = 3,
    Allgather = 4,
    Alltoall = 5,
}

fn kind_name(k: u64) -> &'static str {
    match k {
        1 => "bcast",
        2 => "reduce",
        3 => "allreduce",
        4 => "allgather",
        5 => "alltoall",
        _ => "another operation",
    }
}

const BYTES_BITS: u32 = 40;
const NO_ROOT: u64 = 0xff;

/// The parity of the operation that stage `s` (at least 1) belongs to: operation
/// `k = (s - 1) / 3` uses parity `(k + 1) % 2`, the parity of its first stage `3k + 1`.
fn parity(s: u64) -> u64 {
    ((s - 1) / STAGES + 1) & 1
}

/// A member's word for operation `base / 3` (see the module's documentation).
fn word(base: u64, kind: Kind, root: Option<u32>, bytes: usize) -> u64 {
    // 1 to 4095: never the stamp of a word not written yet (0).
    ((((base / STAGES) % 0xfff) + 1) << 52)
        | ((kind as u64) << 48)
        | (root.map_or(NO_ROOT, |r| u64::from(r) & 0xff) << BYTES_BITS)
        | (bytes as u64 & ((1 << BYTES_BITS) - 1))
}

/// A communicator's segment, its operation counter and scratch space.
#[derive(Debug)]
pub(crate) struct NodeColl {
    seg: CollSegment,
    /// The members' process ids, when every member can read every other's memory
    /// with one copy.
    pids: Option<Vec<i32>>,
    /// Held during an operation: one at a time (a lock whose release is a plain store:
    /// `std`'s would wait for the flag just published to leave the store buffer).
    state: SpinLock<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Operations started.
    started: u64,
    /// The last stage every member was seen to have entered.
    seen_all: u64,
    /// Why the segment is unusable, after a failure in the middle of an operation.
    broken: Option<String>,
    /// Chunks and partial results of single-copy reductions (16-byte aligned).
    scratch: Vec<u128>,
    /// Operations every other member was seen to have returned from (what a ring
    /// bcast's root checks before rewriting a slot).
    ring_free: u64,
}

/// Makes the segment of `comm` (collective over its members), or `None` when the
/// communicator does not qualify or any member cannot map it.
pub(crate) fn setup(comm: &Communicator, single_copy: bool) -> Option<NodeColl> {
    let n = comm.size();
    if !(2..=MAX_MEMBERS).contains(&n) {
        return None;
    }
    let prefix = comm.node_segment_prefix()?;
    let name = format!("{prefix}coll-{:x}", comm.context_id());
    let me = comm.rank() as usize;
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
        None => match CollSegment::open(&name, n as usize, me) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("collective segment {name}: {e}; using point-to-point");
                None
            }
        },
    };
    // What the others need to probe single-copy reads of this process: its pid and the
    // address of `PROBE` (in the payload of parity 0, which operation 1 uses first,
    // after everyone is done here).
    if let Some(s) = &seg {
        let mut desc = [0u8; 16];
        desc[..8].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
        desc[8..].copy_from_slice(&(&raw const PROBE as usize as u64).to_le_bytes());
        s.put(0, &desc);
    }
    // Every member must have it (bitwise and over the members).
    let and: ByteOp = std::sync::Arc::new(|i: &[u8], o: &mut [u8]| o[0] &= i[0]);
    let all_and = |mine: bool| -> Option<bool> {
        let mut all = [0u8];
        run(
            algo::allreduce_rd(at(comm), 1, &and, true, Buf::Send.at(0, 1)),
            &[u8::from(mine)],
            &mut all,
        )
        .ok()?;
        Some(all[0] == 1)
    };
    let all = all_and(seg.is_some())?;
    if me == 0 {
        if let Some(s) = &seg {
            // Every member has it mapped (or gave up): the name can go.
            let _ = s.unlink();
        }
    }
    let seg = seg.filter(|_| all)?;
    // Single-copy reads: every member reads every other's probe word.
    let mut pids = vec![0i32; n as usize];
    let mut readable = single_copy;
    for (r, pid) in pids.iter_mut().enumerate() {
        let mut desc = [0u8; 16];
        seg.get(r, 0, &mut desc);
        *pid = i32::try_from(u64::from_le_bytes(desc[..8].try_into().unwrap_or_default()))
            .unwrap_or(0);
        let addr = u64::from_le_bytes(desc[8..].try_into().unwrap_or_default()) as usize;
        if readable && r != me {
            let mut got = [0u8; 8];
            match cma_read(*pid, addr, &mut got) {
                Ok(()) if u64::from_ne_bytes(got) == PROBE => {}
                Ok(()) => readable = false,
                Err(e) => {
                    tracing::debug!(
                        "collective segment {name}: no single-copy reads of rank {r}: {e}"
                    );
                    readable = false;
                }
            }
        }
    }
    let readable = all_and(readable)?;
    Some(NodeColl {
        seg,
        pids: readable.then_some(pids),
        state: SpinLock::new(State::default()),
    })
}

/// One operation in progress: its stages, and the state held meanwhile.
struct Run<'a> {
    nc: &'a NodeColl,
    comm: &'a Communicator,
    op: &'static str,
    st: SpinGuard<'a, State>,
    /// Stage `3k` of operation `k`.
    base: u64,
}

impl Run<'_> {
    fn slot(&self) -> u64 {
        self.base + 1
    }

    fn fin(&self) -> u64 {
        self.base + STAGES
    }

    /// Whether member `r` passed stage `s` (an error when it gave up before it). A
    /// member that gave up in a later operation had passed `s` (its word keeps the stage
    /// it reached under the abort mark): a member still finishing this operation must
    /// not fail it because another failed the next one.
    fn passed(&self, r: usize, s: u64) -> Result<bool, CollError> {
        if s == 0 {
            return Ok(true);
        }
        let v = self.nc.seg.seq(r, parity(s));
        if v & !CollSegment::ABORTED >= s {
            return Ok(true);
        }
        if v & CollSegment::ABORTED != 0 {
            return Err(self.gave_up(r));
        }
        Ok(false)
    }

    /// The error for member `r`, which marked its words aborted.
    fn gave_up(&self, r: usize) -> CollError {
        // Usually because a member died or finalized without its part: the node's store
        // already says which (the member that gave up read it there), and that is the
        // error to give.
        if let Some((rank, reason)) = self.gone_member() {
            return CollError::MemberGone {
                op: self.op,
                rank,
                reason,
            };
        }
        CollError::Aborted {
            op: self.op,
            rank: r as u32,
            reason: "it gave up on the node's collective segment after a failure".into(),
        }
    }

    /// A member that died, or else the member that ended (finalized, or exited with
    /// status 0) without entering this operation's last stage and stopped earliest
    /// (the lowest stage entered: a member that stopped later most likely did so after
    /// failing because of it), as (rank, how it ended).
    fn gone_member(&self) -> Option<(u32, String)> {
        if let Some(failed) = self.comm.failed_member() {
            return Some(failed);
        }
        let fin = self.fin();
        let me = self.comm.rank() as usize;
        let seg = &self.nc.seg;
        let stage = |m: usize| {
            let clean = |p: u64| seg.seq(m, p) & !CollSegment::ABORTED;
            clean(0).max(clean(1))
        };
        (0..seg.members())
            .filter(|&m| m != me)
            .filter_map(|m| {
                let at = stage(m);
                (at < fin).then_some(())?;
                Some((at, m as u32, self.comm.member_gone(m as u32)?))
            })
            .min_by_key(|&(at, m, _)| (at, m))
            .map(|(_, m, why)| (m, why))
    }

    /// The error when member `r`, which this member waits for, is gone (died, or ended
    /// cleanly without its part, which it then never does): naming the member that
    /// stopped first (see [`gone_member`](Self::gone_member)).
    #[cold]
    #[inline(never)]
    fn ended(&self, r: usize) -> Option<CollError> {
        let reason = self.comm.member_gone(r as u32)?;
        let (rank, reason) = self.gone_member().unwrap_or((r as u32, reason));
        Some(CollError::MemberGone {
            op: self.op,
            rank,
            reason,
        })
    }

    /// Waits until `ready` says it is done (`Ok(None)`; `Ok(Some(r))`: still waiting for
    /// member `r`), keeping the fabric progressing and failing if a member failed, or if
    /// the member waited for ended without doing its part.
    fn wait(
        &self,
        ready: impl FnMut() -> Result<Option<usize>, CollError>,
    ) -> Result<(), CollError> {
        self.wait_for(ready).inspect_err(|e| {
            if matches!(e, CollError::MemberGone { .. } | CollError::Aborted { .. }) {
                // A member is gone (or gave up because one is): the segment can no
                // longer complete an operation. Whoever waits for this member learns it
                // at once (rather than waiting for a member still alive but done here),
                // and so does this member's next operation (`NodeColl::begin`).
                self.nc.seg.abort();
            }
        })
    }

    /// [`wait`](Self::wait) without giving up on the segment.
    fn wait_for(
        &self,
        mut ready: impl FnMut() -> Result<Option<usize>, CollError>,
    ) -> Result<(), CollError> {
        let mut spins = 0u32;
        // Taken once spinning stops (reading the clock costs more than a short wait); the
        // first check comes `CHECK_EVERY` after that, not at the first yield: waits of a
        // few yields are most of them when processes outnumber CPUs, and a check costs
        // system calls (whether the server is still there).
        let mut checked: Option<Instant> = None;
        loop {
            let Some(waited) = ready()? else {
                return Ok(());
            };
            spins = spins.wrapping_add(1);
            if spins % 256 == 0 {
                self.comm.progress();
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
                let since = *checked.get_or_insert_with(Instant::now);
                since.elapsed() >= CHECK_EVERY
            };
            if check {
                checked = Some(Instant::now());
                if let Some((rank, reason)) = self.comm.failed_member() {
                    return Err(CollError::MemberGone {
                        op: self.op,
                        rank,
                        reason,
                    });
                }
                if let Some(e) = self.ended(waited) {
                    // It may have done its part just before it ended: its stage was
                    // written before its end was announced (SYNC: the member's Release
                    // store of its stage, then its finalize over the server's socket,
                    // before the store says it ended; read again here after that).
                    if ready()?.is_none() {
                        return Ok(());
                    }
                    return Err(e);
                }
            }
        }
    }

    /// `Ok(None)` when member `r` passed stage `s`, else `Ok(Some(r))`.
    fn pending(&self, r: usize, s: u64) -> Result<Option<usize>, CollError> {
        Ok((!self.passed(r, s)?).then_some(r))
    }

    fn wait_member(&self, r: usize, s: u64) -> Result<(), CollError> {
        self.wait(|| self.pending(r, s))
    }

    /// Waits until every member entered stage `s` (at once when this member saw them
    /// all enter it or a later one already).
    fn wait_all(&mut self, s: u64) -> Result<(), CollError> {
        if self.st.seen_all >= s {
            return Ok(());
        }
        let n = self.nc.seg.members();
        let mut next = 0;
        self.wait(|| {
            while next < n {
                if !self.passed(next, s)? {
                    return Ok(Some(next));
                }
                next += 1;
            }
            Ok(None)
        })?;
        self.st.seen_all = s;
        Ok(())
    }

    /// [`wait_all`](Self::wait_all) for stage `s`, taking each member's word (checked
    /// against `mine`) and payload (`into`'s share: member r's `into.len() / members`
    /// bytes) as soon as it is seen to pass, while its line is in this core's cache.
    #[inline]
    fn wait_all_taking(&mut self, s: u64, mine: u64, into: &mut [u8]) -> Result<(), CollError> {
        let n = self.nc.seg.members();
        let slot = self.slot();
        let each = into.len() / n;
        let mut next = 0;
        self.wait(|| {
            while next < n {
                if !self.passed(next, s)? {
                    return Ok(Some(next));
                }
                let got = self.nc.seg.word(next, slot);
                if got != mine {
                    return Err(self.mismatch(next, got, mine));
                }
                self.nc
                    .seg
                    .get(next, slot, &mut into[next * each..(next + 1) * each]);
                next += 1;
            }
            Ok(None)
        })?;
        self.st.seen_all = s;
        Ok(())
    }

    /// Whether tree word `v` of member `r` reached stage `s` (an error when it gave up
    /// before it; see [`passed`](Self::passed)).
    fn tree_passed(&self, r: usize, v: u64, s: u64) -> Result<bool, CollError> {
        if v & !CollSegment::ABORTED >= s {
            return Ok(true);
        }
        if v & CollSegment::ABORTED != 0 {
            return Err(self.gave_up(r));
        }
        Ok(false)
    }

    /// Waits until every member entered stage `s` over the segment's release/gather
    /// tree (members in heap order, `radix` children each): a member waits for its
    /// children's gather words to reach `s`, sets its own (its whole subtree arrived),
    /// then waits for its parent's release word and releases its children; the root
    /// releases once its gather completes. 2 log_radix(members) hops instead of every
    /// member reading every other's line. Every member must call it for `s` after
    /// entering `s` (a barrier does).
    fn wait_tree(&mut self, s: u64, radix: usize) -> Result<(), CollError> {
        let n = self.nc.seg.members();
        let me = self.comm.rank() as usize;
        let first = me.saturating_mul(radix).saturating_add(1);
        let kids = first.min(n)..first.saturating_add(radix).min(n);
        let seg = &self.nc.seg;
        let mut next = kids.start;
        self.wait(|| {
            while next < kids.end {
                if !self.tree_passed(next, seg.up(next), s)? {
                    return Ok(Some(next));
                }
                next += 1;
            }
            Ok(None)
        })?;
        seg.set_up(s);
        if me != 0 {
            let parent = (me - 1) / radix;
            self.wait(|| Ok((!self.tree_passed(parent, seg.down(parent), s)?).then_some(parent)))?;
        }
        seg.set_down(s);
        self.st.seen_all = s;
        Ok(())
    }

    /// Enters `stage` of this operation.
    fn enter(&self, stage: u64) {
        self.nc.seg.enter(self.slot(), stage);
    }

    /// Publishes this member's word (and payload, written before) and enters `stage`.
    fn publish(&self, w: u64, stage: u64) {
        self.nc.seg.set_word(self.slot(), w);
        self.enter(stage);
    }

    /// Checks member `r`'s word against `mine` (read after it passed the slot).
    #[inline]
    fn check(&self, r: usize, mine: u64) -> Result<(), CollError> {
        let got = self.nc.seg.word(r, self.slot());
        if got == mine {
            return Ok(());
        }
        Err(self.mismatch(r, got, mine))
    }

    /// The error of member `r`'s word `got`, which differs from `mine`.
    #[cold]
    #[inline(never)]
    fn mismatch(&self, r: usize, got: u64, mine: u64) -> CollError {
        let high = |w: u64| w >> BYTES_BITS;
        let bytes = |w: u64| (w & ((1 << BYTES_BITS) - 1)) as usize;
        if high(got) == high(mine) {
            return CollError::Mismatch {
                op: self.op,
                source: P2pError::SizeMismatch {
                    rank: r as u32,
                    tag: 0,
                    expected: bytes(mine),
                    got: bytes(got),
                },
            };
        }
        let what = if (got >> 52) != (mine >> 52) {
            "is in another collective operation (or none)".to_string()
        } else {
            let root = (got >> BYTES_BITS) & 0xff;
            let root = if root == NO_ROOT {
                String::new()
            } else {
                format!(" with root {root}")
            };
            format!("called {}{root}", kind_name((got >> 48) & 0xf))
        };
        CollError::OutOfOrder {
            op: self.op,
            rank: r as u32,
            what,
        }
    }

    /// Waits until every other member returned from every operation before `need` (a
    /// ring bcast's root, before it rewrites the slot operation `need - 1` used): its
    /// done word or the stage it entered says so.
    fn ring_room(&mut self, need: u64) -> Result<(), CollError> {
        let seg = &self.nc.seg;
        let n = seg.members();
        let me = self.comm.rank() as usize;
        let mut next = 0;
        let mut low = u64::MAX;
        self.wait(|| {
            while next < n {
                if next != me {
                    let stage = |p: u64| seg.seq(next, p);
                    let (a, b) = (stage(0), stage(1));
                    let clean = (a & !CollSegment::ABORTED).max(b & !CollSegment::ABORTED);
                    // Entering any stage of operation j means it returned from j - 1.
                    let returned = seg.done(next).max(clean.saturating_sub(1) / STAGES);
                    if returned < need {
                        if (a | b) & CollSegment::ABORTED != 0 {
                            return Err(self.gave_up(next));
                        }
                        return Ok(Some(next));
                    }
                    low = low.min(returned);
                }
                next += 1;
            }
            Ok(None)
        })?;
        self.st.ring_free = low;
        Ok(())
    }

    /// The error when root `r` of a bcast this member expected through the cells (more
    /// than a ring slot holds) sent it through its ring: the count mismatch it is (the
    /// root stamps the slot before it enters the stage this member saw).
    #[cold]
    #[inline(never)]
    fn rooted_by_ring(&self, r: usize, mine: u64) -> Option<CollError> {
        let op = self.base / STAGES;
        (self.nc.seg.ring_stamp(r, op) == op + 1)
            .then(|| self.mismatch(r, self.nc.seg.ring_word(r, op), mine))
    }

    /// The error when the root `r` of a ring bcast ended the operation without
    /// stamping its slot (its word, of that operation, says what it called instead).
    #[cold]
    #[inline(never)]
    fn not_rooted(&self, r: usize, mine: u64) -> CollError {
        let got = self.nc.seg.word(r, self.slot());
        if got >> 52 == mine >> 52 && got != mine {
            return self.mismatch(r, got, mine);
        }
        CollError::OutOfOrder {
            op: self.op,
            rank: r as u32,
            what: "did not send as the root (it called bcast with another root, or another collective)"
                .into(),
        }
    }

    /// Checks every member's word (after all passed the slot).
    #[inline]
    fn check_all(&self, mine: u64) -> Result<(), CollError> {
        for r in 0..self.nc.seg.members() {
            let got = self.nc.seg.word(r, self.slot());
            if got != mine {
                return Err(self.mismatch(r, got, mine));
            }
        }
        Ok(())
    }

    /// Gives up on the segment after a failure in the middle of an operation.
    fn fail(&mut self, e: CollError) -> CollError {
        self.nc.seg.abort();
        self.st.broken = Some(e.to_string());
        e
    }

    /// Reads `dst.len()` bytes at `addr` of member `r` with one copy.
    fn read(&self, r: usize, addr: u64, dst: &mut [u8]) -> Result<(), CollError> {
        let pid = self.nc.pids.as_ref().map_or(0, |p| p[r]);
        cma_read(pid, addr as usize, dst).map_err(|e| {
            if let Some((rank, reason)) = self.comm.failed_member() {
                return CollError::MemberGone {
                    op: self.op,
                    rank,
                    reason,
                };
            }
            if let Some(gone) = self.ended(r) {
                return gone;
            }
            CollError::Transport {
                op: self.op,
                source: P2pError::Transport {
                    rank: r as u32,
                    reason: format!("single-copy read of {} bytes: {e}", dst.len()),
                },
            }
        })
    }

    /// Member `r`'s published addresses (a single-copy operation's descriptor).
    fn desc(&self, r: usize) -> [u64; 2] {
        let mut d = [0u8; 16];
        self.nc.seg.get(r, self.slot(), &mut d);
        [
            u64::from_le_bytes(d[..8].try_into().unwrap_or_default()),
            u64::from_le_bytes(d[8..].try_into().unwrap_or_default()),
        ]
    }

    fn put_desc(&self, a: usize, b: usize) {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&(a as u64).to_le_bytes());
        d[8..].copy_from_slice(&(b as u64).to_le_bytes());
        self.nc.seg.put(self.slot(), &d);
    }
}

/// The error of an operation on a segment given up after an earlier failure (`why`).
#[cold]
#[inline(never)]
fn broken(op: &'static str, comm: &Communicator, why: &str) -> CollError {
    CollError::Aborted {
        op,
        rank: comm.rank(),
        reason: format!(
            "the communicator's node-local collectives are unusable after an earlier failure ({why})"
        ),
    }
}

/// Where a reduction's input is: the send buffer, or the receive buffer (in place).
type Input<'a, T> = Option<&'a [T]>;

impl NodeColl {
    /// Whether large operations can read each other's buffers with one copy.
    pub(crate) fn single_copy(&self) -> bool {
        self.pids.is_some()
    }

    /// Starts the next operation.
    #[inline]
    fn begin<'a>(&'a self, op: &'static str, comm: &'a Communicator) -> Result<Run<'a>, CollError> {
        let mut st = self.state.lock();
        if let Some(why) = &st.broken {
            return Err(broken(op, comm, why));
        }
        let base = st.started * STAGES;
        st.started += 1;
        let run = Run {
            nc: self,
            comm,
            op,
            st,
            base,
        };
        if self.seg.seq(comm.rank() as usize, 0) & CollSegment::ABORTED != 0 {
            // This member gave up on the segment in an earlier operation, when a member
            // was gone: name it again.
            return Err(run.gave_up(comm.rank() as usize));
        }
        Ok(run)
    }

    pub(crate) fn barrier(&self, comm: &Communicator) -> Result<(), CollError> {
        let mut run = self.begin("barrier", comm)?;
        run.enter(run.fin());
        let fin = run.fin();
        let cfg = crate::Config::get();
        if self.seg.members() >= cfg.shm_tree {
            return run.wait_tree(fin, cfg.shm_radix);
        }
        run.wait_all(fin)
    }

    pub(crate) fn bcast(
        &self,
        comm: &Communicator,
        buf: &mut [u8],
        root: u32,
    ) -> Result<(), CollError> {
        let mut run = self.begin("bcast", comm)?;
        let w = word(run.base, Kind::Bcast, Some(root), buf.len());
        let root = root as usize;
        let max = crate::Config::get().shm_max;
        if buf.len() <= max.min(CollSegment::RING_INLINE) {
            return self.bcast_ring(&mut run, w, buf, root);
        }
        if buf.len() > max {
            return self.bcast_large(&mut run, w, buf, root);
        }
        if comm.rank() as usize == root {
            run.wait_all(run.base)?;
            self.seg.put(run.slot(), buf);
            run.publish(w, run.fin());
            // Members have nothing for the root: done (they read before entering the
            // next operation's last stage, which the root's next payload of this parity
            // waits for).
            return Ok(());
        }
        // A member writes nothing here (so it need not wait for the others).
        run.enter(run.fin());
        run.wait_member(root, run.slot())?;
        run.check(root, w)
            .map_err(|e| run.rooted_by_ring(root, w).unwrap_or(e))?;
        self.seg.get(root, run.slot(), buf);
        Ok(())
    }

    /// A small bcast through the root's ring (see `weft_shm::CollSegment`): the root
    /// waits only when the slot it needs was last used by an operation some member has
    /// not returned from (`RING_SLOTS` operations back), so it runs ahead of members that
    /// wait for a CPU instead of meeting every member at every operation. A member enters
    /// the last stage at once (as in the segment bcast), waits for the root's stamp,
    /// checks the root's word, reads, and says it is done with the slot.
    fn bcast_ring(
        &self,
        run: &mut Run<'_>,
        w: u64,
        buf: &mut [u8],
        root: usize,
    ) -> Result<(), CollError> {
        let op = run.base / STAGES;
        if run.comm.rank() as usize == root {
            let need = (op + 1).saturating_sub(CollSegment::RING_SLOTS as u64);
            if run.st.ring_free < need {
                run.ring_room(need)?;
            }
            // Stamped before the stage: a member that sees the root past this
            // operation without the stamp knows it called something else.
            self.seg.ring_put(op, w, buf);
            run.enter(run.fin());
            return Ok(());
        }
        run.enter(run.fin());
        let seg = &self.seg;
        let fin = run.fin();
        let mut polls = 0u32;
        let res = run.wait(|| {
            if seg.ring_stamp(root, op) == op + 1 {
                return Ok(None);
            }
            polls = polls.wrapping_add(1);
            // Now and then: whether the root ended this operation without stamping
            // the slot (it called something else) or gave up.
            if polls % 64 != 0 || !run.passed(root, fin)? {
                return Ok(Some(root));
            }
            if seg.ring_stamp(root, op) == op + 1 {
                return Ok(None);
            }
            Err(run.not_rooted(root, w))
        });
        let res = res.and_then(|()| {
            let got = seg.ring_word(root, op);
            if got != w {
                return Err(run.mismatch(root, got, w));
            }
            seg.ring_get(root, op, buf);
            Ok(())
        });
        if !matches!(
            res,
            Err(CollError::MemberGone { .. } | CollError::Aborted { .. })
        ) {
            seg.set_done(op + 1);
        }
        res
    }

    /// A bcast above the cells' limit: the root publishes its buffer's address, every
    /// member reads it with one copy, and the root returns once all have (3 or more
    /// members, single copy available: see `bcast_single_copy` in the crate root).
    fn bcast_large(
        &self,
        run: &mut Run<'_>,
        w: u64,
        buf: &mut [u8],
        root: usize,
    ) -> Result<(), CollError> {
        if run.comm.rank() as usize == root {
            run.wait_all(run.base)?;
            run.put_desc(buf.as_ptr() as usize, 0);
            run.publish(w, run.fin());
            // Members read the buffer until they enter the last stage.
            return run.wait_all(run.fin()).map_err(|e| run.fail(e));
        }
        run.wait_member(root, run.slot())?;
        if let Err(e) = run.check(root, w) {
            run.enter(run.fin());
            return Err(run.rooted_by_ring(root, w).unwrap_or(e));
        }
        let d = run.desc(root);
        let res = run.read(root, d[0], buf);
        run.enter(run.fin());
        res.map_err(|e| run.fail(e))
    }

    /// Allgather of `b` bytes per member: this member's block is `send`, or its block
    /// of `recv` (in place).
    pub(crate) fn allgather(
        &self,
        comm: &Communicator,
        send: Option<&[u8]>,
        recv: &mut [u8],
        b: usize,
    ) -> Result<(), CollError> {
        let mut run = self.begin("allgather", comm)?;
        let n = self.seg.members();
        let me = comm.rank() as usize;
        let w = word(run.base, Kind::Allgather, None, b);
        run.wait_all(run.base)?;
        let small = b <= crate::gather_cells_max();
        if small {
            self.seg
                .put(run.slot(), send.unwrap_or(&recv[me * b..(me + 1) * b]));
            run.publish(w, run.fin());
        } else {
            let src = send.map_or(recv[me * b..].as_ptr(), <[u8]>::as_ptr);
            run.put_desc(src as usize, 0);
            run.publish(w, run.slot());
        }
        if let Some(s) = send {
            recv[me * b..(me + 1) * b].copy_from_slice(s);
        }
        let stop = run.wait_all(run.slot()).and_then(|()| run.check_all(w));
        if small {
            stop?;
            for r in (0..n).filter(|&r| r != me) {
                self.seg.get(r, run.slot(), &mut recv[r * b..(r + 1) * b]);
            }
            return Ok(());
        }
        if let Err(e) = stop {
            run.enter(run.fin());
            return Err(e);
        }
        let res = (|| {
            for k in 1..n {
                let r = (me + k) % n;
                let d = run.desc(r);
                run.read(r, d[0], &mut recv[r * b..(r + 1) * b])?;
            }
            run.enter(run.fin());
            run.wait_all(run.fin())
        })();
        res.map_err(|e| run.fail(e))
    }

    /// Alltoall of `b` bytes per pair of members.
    pub(crate) fn alltoall(
        &self,
        comm: &Communicator,
        send: &[u8],
        recv: &mut [u8],
        b: usize,
    ) -> Result<(), CollError> {
        let mut run = self.begin("alltoall", comm)?;
        let n = self.seg.members();
        let me = comm.rank() as usize;
        let w = word(run.base, Kind::Alltoall, None, b);
        run.wait_all(run.base)?;
        let small = n * b <= crate::gather_cells_max();
        if small {
            self.seg.put(run.slot(), send);
            run.publish(w, run.fin());
        } else {
            run.put_desc(send.as_ptr() as usize, 0);
            run.publish(w, run.slot());
        }
        recv[me * b..(me + 1) * b].copy_from_slice(&send[me * b..(me + 1) * b]);
        let stop = run.wait_all(run.slot()).and_then(|()| run.check_all(w));
        if small {
            stop?;
            for r in (0..n).filter(|&r| r != me) {
                self.seg
                    .get_at(r, run.slot(), n * b, me * b, &mut recv[r * b..(r + 1) * b]);
            }
            return Ok(());
        }
        if let Err(e) = stop {
            run.enter(run.fin());
            return Err(e);
        }
        let res = (|| {
            for k in 1..n {
                let r = (me + k) % n;
                let d = run.desc(r);
                run.read(r, d[0] + (me * b) as u64, &mut recv[r * b..(r + 1) * b])?;
            }
            run.enter(run.fin());
            run.wait_all(run.fin())
        })();
        res.map_err(|e| run.fail(e))
    }
}

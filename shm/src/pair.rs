//! Pair lines: the one cache line two local processes share for their small
//! frames in both directions (layout in [`crate::layout::PairLine`]).
//!
//! Why: a reply written into the cache line its request arrived in costs one
//! cache-line transfer; a reply written into another line (the next slot of
//! the other direction's ring) costs a transfer plus an ownership request
//! for a line the other core holds. On the development machine two threads
//! bouncing one line took 0.066 us one way, two rings 0.14 us.
//!
//! Protocol, for one direction (the writer's half, read by the other side):
//!
//! - The writer may write its half when the reader acknowledged its previous
//!   frame (the reader's ack word holds that frame's `seq`) and listens
//!   ([`PAIR_LISTENING`]). It writes the body, then the frame word with
//!   `seq + 1`, the length, and `ring`: how many frames it had published on
//!   its fastbox ring to the same reader before this one (mod 2^16). One
//!   Release store, last.
//! - The reader expects `seq` = last consumed + 1. A frame whose `ring`
//!   equals the number of ring frames it consumed is next in order; one with
//!   a larger `ring` waits behind ring frames, which were published before it
//!   and so are visible once the line frame is. The reader looks at the line
//!   first; when it holds nothing deliverable, the ring's next header, and if
//!   that holds a frame, the line again: a line frame published before that
//!   ring frame is then visible and goes first. It copies the frame out and
//!   hands it out; its ack is lazy, stored with its side's next line frame or
//!   at its next poll, whichever comes first, so that a reply costs the line
//!   one ownership request, not two.
//! - Otherwise frames go through the ring as before: at most one frame per
//!   direction sits in the line, so it never holds up a stream. A writer that
//!   found the line busy stops trying it until the reader side of the same
//!   process receives something from that peer (a conversation), so a
//!   one-way stream does not pay a cache miss per frame to look.

use core::sync::atomic::Ordering;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8};
use std::sync::{Arc, Mutex, PoisonError};

use crate::layout::{PairHalf, PairLine, PAIR_FRAME_MAX, PAIR_LISTENING};
use crate::segment::Keepalive;

/// Frame bytes carried in the frame word.
const WORD_BYTES: usize = 4;
/// Frame bytes carried in the body.
pub(crate) const BODY_BYTES: usize = PAIR_FRAME_MAX - WORD_BYTES;

/// The two halves of one pair line, as one side sees them.
///
/// # Safety
///
/// Implementations must keep both halves accessible for their lifetime, and
/// only this side may write `mine`.
pub(crate) unsafe trait LineMem {
    /// Loads the other side's frame word.
    fn load_their_frame(&self, order: Ordering) -> u64;
    /// Loads the other side's ack word.
    fn load_their_ack(&self, order: Ordering) -> u32;
    /// Loads our own frame word (only we write it).
    fn load_my_frame(&self) -> u64;
    /// Loads our own ack word (only we write it).
    fn load_my_ack(&self) -> u32;
    /// Stores our frame word.
    fn store_my_frame(&self, value: u64, order: Ordering);
    /// Stores our ack word.
    fn store_my_ack(&self, value: u32, order: Ordering);
    /// Writes the body of our half.
    ///
    /// # Safety
    ///
    /// The other side must have acknowledged our previous frame (ack word
    /// loaded with Acquire), so it no longer reads the body.
    unsafe fn write_my_body(&self, body: &[u8; BODY_BYTES]);
    /// Reads the body of the other side's half.
    ///
    /// # Safety
    ///
    /// Their frame word, holding a frame we have not acknowledged yet, must
    /// have been loaded with Acquire.
    unsafe fn read_their_body(&self, body: &mut [u8; BODY_BYTES]);
}

/// The sending side of one direction of a pair line.
#[derive(Debug)]
pub(crate) struct LineWriter {
    /// `seq` of our last frame.
    seq: u8,
}

impl LineWriter {
    /// A writer that goes on from what the half holds (all zero when new).
    pub(crate) fn resume<M: LineMem>(mem: &M) -> LineWriter {
        LineWriter {
            seq: mem.load_my_frame() as u8,
        }
    }

    /// Writes `a ++ b` (at most [`PAIR_FRAME_MAX`] bytes, else this panics)
    /// into our half, `ring` being the number of frames we published on our
    /// ring to the same reader so far, and with it our ack of `consumed`
    /// (the `seq` of the last frame our side's reader consumed from the
    /// line). False, writing nothing, if the reader has not consumed our
    /// previous frame or does not listen.
    #[inline]
    pub(crate) fn try_send<M: LineMem>(
        &mut self,
        mem: &M,
        a: &[u8],
        b: &[u8],
        ring: u64,
        consumed: u8,
    ) -> bool {
        let len = a.len() + b.len();
        assert!(len <= PAIR_FRAME_MAX, "pair-line frame of {len} bytes");
        // The frame is ready before the line is read: reading it and writing
        // it follow each other closely.
        let mut buf = [0u8; PAIR_FRAME_MAX];
        small_copy(&mut buf, 0, a);
        small_copy(&mut buf, a.len(), b);
        let (word_bytes, body) = buf.split_at(WORD_BYTES);
        let body: &[u8; BODY_BYTES] = body.try_into().expect("24 - 4 bytes");
        let seq = self.seq.wrapping_add(1);
        let first = u32::from_le_bytes(word_bytes.try_into().expect("4 bytes"));
        let word = u64::from(seq)
            | (len as u64) << 8
            | u64::from(ring as u16) << 16
            | u64::from(first) << 32;
        // SYNC: pairs with the reader's Release store of its ack in
        // `LineReader::take`: its reads of our previous frame happen before
        // we overwrite it.
        let ack = mem.load_their_ack(Ordering::Acquire);
        if ack & PAIR_LISTENING == 0 || ack as u8 != self.seq {
            return false;
        }
        // SAFETY: the reader acknowledged our previous frame (checked above
        // with Acquire).
        unsafe { mem.write_my_body(body) };
        // The ack goes with the frame: one ownership request for both.
        ack_up_to(mem, consumed);
        // SYNC: pairs with the reader's Acquire load of the frame word in
        // `LineReader::peek`: publishes the body.
        mem.store_my_frame(word, Ordering::Release);
        self.seq = seq;
        true
    }
}

/// Copies `src` into `dst` at `at` (`at + src.len()` at most
/// [`PAIR_FRAME_MAX`]) without a call to `memcpy`: a call costs more than
/// the copy at these sizes, and it sits between reading the line and
/// writing it.
#[inline(always)]
fn small_copy(dst: &mut [u8; PAIR_FRAME_MAX], at: usize, src: &[u8]) {
    let d = &mut dst[at..at + src.len()];
    // SAFETY: `d` and `src` are distinct slices of `src.len()` bytes each.
    unsafe { copy_short(src.as_ptr(), d.as_mut_ptr(), src.len()) }
}

/// Copies `n` bytes from `src` to `dst`: up to [`PAIR_FRAME_MAX`] (24) bytes
/// with at most three moves each way and no call (a call to `memcpy` costs
/// more than such a copy, and small messages pay it on their whole path),
/// longer ones with `copy_nonoverlapping`.
///
/// # Safety
/// `src` is readable and `dst` writable for `n` bytes, and the ranges do not
/// overlap.
#[inline(always)]
pub unsafe fn copy_short(src: *const u8, dst: *mut u8, n: usize) {
    use std::ptr::{read_unaligned as rd, write_unaligned as wr};
    // SAFETY: the caller's contract; each access lies in the first, second or
    // last `k` <= n bytes of the ranges (overlapping when n < 2k or 3k: the
    // same bytes twice).
    unsafe {
        if n > PAIR_FRAME_MAX {
            std::ptr::copy_nonoverlapping(src, dst, n);
        } else if n >= 8 {
            let a = rd(src.cast::<u64>());
            let m = if n > 16 {
                rd(src.add(8).cast::<u64>())
            } else {
                0
            };
            let b = rd(src.add(n - 8).cast::<u64>());
            wr(dst.cast::<u64>(), a);
            if n > 16 {
                wr(dst.add(8).cast::<u64>(), m);
            }
            wr(dst.add(n - 8).cast::<u64>(), b);
        } else if n >= 4 {
            let (a, b) = (rd(src.cast::<u32>()), rd(src.add(n - 4).cast::<u32>()));
            wr(dst.cast::<u32>(), a);
            wr(dst.add(n - 4).cast::<u32>(), b);
        } else if n >= 2 {
            let (a, b) = (rd(src.cast::<u16>()), rd(src.add(n - 2).cast::<u16>()));
            wr(dst.cast::<u16>(), a);
            wr(dst.add(n - 2).cast::<u16>(), b);
        } else if n == 1 {
            *dst = *src;
        }
    }
}

/// Stores our ack of the other side's frames up to `consumed`, keeping our
/// listening flag, unless it is there already.
#[inline(always)]
fn ack_up_to<M: LineMem>(mem: &M, consumed: u8) {
    let cur = mem.load_my_ack();
    let want = (cur & PAIR_LISTENING) | u32::from(consumed);
    if cur != want {
        // SYNC: pairs with the writer's Acquire load of our ack in
        // `LineWriter::try_send`: our reads of its frames up to `consumed`
        // happen before it writes the next one.
        mem.store_my_ack(want, Ordering::Release);
    }
}

/// What the other side's half holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peek {
    /// Nothing new.
    Empty,
    /// A frame that is next in order: its frame word.
    Ready(u64),
    /// A frame that waits for ring frames sent before it.
    Later,
}

/// The receiving side of one direction of a pair line.
#[derive(Debug)]
pub(crate) struct LineReader {
    /// `seq` of the next frame.
    expect: u8,
}

impl LineReader {
    /// A reader that goes on from what our ack says (all zero when new).
    pub(crate) fn resume<M: LineMem>(mem: &M) -> LineReader {
        LineReader {
            expect: (mem.load_my_ack() as u8).wrapping_add(1),
        }
    }

    /// Starts (or stops) listening: the writer uses the line only while we do.
    pub(crate) fn listen<M: LineMem>(&self, mem: &M, on: bool) {
        let flag = if on { PAIR_LISTENING } else { 0 };
        // SYNC: pairs with the writer's Acquire load of our ack word in
        // `LineWriter::try_send`.
        mem.store_my_ack(
            u32::from(self.expect.wrapping_sub(1)) | flag,
            Ordering::Release,
        );
    }

    /// Whether the other side's half holds nothing new: one Relaxed load, for
    /// spinning on.
    #[inline(always)]
    pub(crate) fn quiet<M: LineMem>(&self, mem: &M) -> bool {
        // Relaxed: a hint; `peek` acquires what is delivered.
        mem.load_their_frame(Ordering::Relaxed) as u8 != self.expect
    }

    /// Looks at the other side's half; `ring` is the number of ring frames
    /// consumed from the same writer.
    #[inline(always)]
    pub(crate) fn peek<M: LineMem>(&self, mem: &M, ring: u64) -> Peek {
        // SYNC: pairs with the writer's Release store of the frame word in
        // `LineWriter::try_send`: the body (and every ring frame published
        // before) is visible.
        let w = mem.load_their_frame(Ordering::Acquire);
        if w as u8 != self.expect {
            Peek::Empty
        } else if (w >> 16) as u16 == ring as u16 {
            Peek::Ready(w)
        } else {
            Peek::Later
        }
    }

    /// `seq` of the last frame consumed.
    #[inline(always)]
    pub(crate) fn consumed(&self) -> u8 {
        self.expect.wrapping_sub(1)
    }

    /// Stores the ack of every frame consumed, if our side has not sent it
    /// with a frame of its own (the ack is lazy: stored on the next poll or
    /// with our next line frame, whichever comes first, so that a reply
    /// costs the line one ownership request, not two).
    #[inline(always)]
    pub(crate) fn ack<M: LineMem>(&self, mem: &M) {
        ack_up_to(mem, self.consumed());
    }

    /// Consumes the frame `word` (from [`peek`](Self::peek)): copies it out,
    /// then calls `f` with it. `Err(())` (nothing consumed) if its length is
    /// impossible. The ack comes later (see [`ack`](Self::ack)).
    ///
    /// # Safety
    ///
    /// `word` must come from `peek` on `mem` returning `Ready` just before.
    #[inline(always)]
    pub(crate) unsafe fn take<M: LineMem, F: FnMut(&[u8])>(
        &mut self,
        mem: &M,
        word: u64,
        f: &mut F,
    ) -> Result<(), ()> {
        let len = (word >> 8) as u8 as usize;
        if len > PAIR_FRAME_MAX {
            return Err(());
        }
        let mut buf = [0u8; PAIR_FRAME_MAX];
        let (word_bytes, body) = buf.split_at_mut(WORD_BYTES);
        word_bytes.copy_from_slice(&((word >> 32) as u32).to_le_bytes());
        // SAFETY: the frame word was acquired by `peek` and not acknowledged
        // yet (contract).
        unsafe { mem.read_their_body(body.try_into().expect("24 - 4 bytes")) };
        self.expect = self.expect.wrapping_add(1);
        f(&buf[..len]);
        Ok(())
    }
}

/// One side's view of a pair line in a shared mapping.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShmLine {
    mine: *mut PairHalf,
    theirs: *const PairHalf,
    /// A private copy of our ack word, which only this side writes: reading
    /// it back from the line would pull the line over from the other core
    /// (the reader side spins on the line, the writer is about to write it),
    /// which measured 0.12-0.14 us one way against 0.06-0.11 us with the copy.
    my_ack: *const AtomicU32,
}

impl ShmLine {
    /// Our half of `line` is `side` (0 for the lower sender id, 1 for the
    /// higher); `my_ack` keeps our private copy of our ack word (this sets it
    /// to what the line holds).
    ///
    /// # Safety
    ///
    /// `line` must point to a `PairLine` in a shared mapping that outlives
    /// every use of the result, only this process may use half `side`, and
    /// `my_ack` must outlive every use of the result and be used by nothing
    /// else.
    pub(crate) unsafe fn new(line: *mut PairLine, side: usize, my_ack: &AtomicU32) -> ShmLine {
        // SAFETY: inside the PairLine (contract); no reference is made.
        let (mine, theirs) = unsafe {
            let h = core::ptr::addr_of_mut!((*line).halves).cast::<PairHalf>();
            (h.add(side), h.add(1 - side).cast_const())
        };
        // SAFETY: mapped (contract); an atomic field. Relaxed: only we write it.
        let cur = unsafe { &*core::ptr::addr_of!((*mine).ack) }.load(Ordering::Relaxed);
        my_ack.store(cur, Ordering::Relaxed);
        ShmLine {
            mine,
            theirs,
            my_ack,
        }
    }
}

// SAFETY: `ShmLine::new`'s contract keeps both halves mapped and ours to
// write; atomics are reached through references to the atomic fields only,
// the bodies through raw pointers.
unsafe impl LineMem for ShmLine {
    #[inline(always)]
    fn load_their_frame(&self, order: Ordering) -> u64 {
        // SAFETY: mapped (contract of `new`); an atomic field.
        unsafe { &*core::ptr::addr_of!((*self.theirs).frame) }.load(order)
    }
    #[inline(always)]
    fn load_their_ack(&self, order: Ordering) -> u32 {
        // SAFETY: as above.
        unsafe { &*core::ptr::addr_of!((*self.theirs).ack) }.load(order)
    }
    #[inline(always)]
    fn load_my_frame(&self) -> u64 {
        // SAFETY: as above. Relaxed: only we write it.
        unsafe { &*core::ptr::addr_of!((*self.mine).frame) }.load(Ordering::Relaxed)
    }
    #[inline(always)]
    fn load_my_ack(&self) -> u32 {
        // SAFETY: `my_ack` outlives us (contract of `new`). Relaxed: only
        // this process writes it, one thread at a time.
        unsafe { &*self.my_ack }.load(Ordering::Relaxed)
    }
    #[inline(always)]
    fn store_my_frame(&self, value: u64, order: Ordering) {
        // SAFETY: as above.
        unsafe { &*core::ptr::addr_of!((*self.mine).frame) }.store(value, order)
    }
    #[inline(always)]
    fn store_my_ack(&self, value: u32, order: Ordering) {
        // SAFETY: as in `load_my_ack`.
        unsafe { &*self.my_ack }.store(value, Ordering::Relaxed);
        // SAFETY: mapped (contract of `new`); an atomic field.
        unsafe { &*core::ptr::addr_of!((*self.mine).ack) }.store(value, order)
    }
    #[inline(always)]
    unsafe fn write_my_body(&self, body: &[u8; BODY_BYTES]) {
        // SAFETY: our half is mapped and only we write it; the reader does
        // not read the body now (caller's contract).
        unsafe {
            core::ptr::copy_nonoverlapping(
                body.as_ptr(),
                core::ptr::addr_of_mut!((*self.mine).body).cast::<u8>(),
                BODY_BYTES,
            )
        }
    }
    #[inline(always)]
    unsafe fn read_their_body(&self, body: &mut [u8; BODY_BYTES]) {
        // SAFETY: their half is mapped; the writer does not write the body
        // until we acknowledge the frame (caller's contract).
        unsafe {
            core::ptr::copy_nonoverlapping(
                core::ptr::addr_of!((*self.theirs).body).cast::<u8>(),
                body.as_mut_ptr(),
                BODY_BYTES,
            )
        }
    }
}

/// What the two ends a process holds for one peer share; alone on its 128
/// bytes (threads of one process may be the two sides of a pair).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Local {
    /// Whether the sender tries the line.
    try_line: AtomicBool,
    /// `seq` of the last line frame the reader consumed, for the sender to
    /// acknowledge with its next line frame.
    consumed: AtomicU8,
    /// Our copy of our ack word (see `ShmLine`).
    my_ack: AtomicU32,
}

impl Local {
    #[inline(always)]
    pub(crate) fn try_line(&self) -> bool {
        // Relaxed: a hint within one process.
        self.try_line.load(Ordering::Relaxed)
    }
    /// Sets the hint, storing only on a change (no write traffic when steady).
    #[inline(always)]
    pub(crate) fn set_try_line(&self, on: bool) {
        if self.try_line() != on {
            self.try_line.store(on, Ordering::Relaxed);
        }
    }
    /// The reader consumed line frames up to `seq`.
    #[inline(always)]
    pub(crate) fn set_consumed(&self, seq: u8) {
        // SYNC: pairs with the Acquire load in `OutLine::try_send`: the
        // reader's reads of those frames happen before the sender acks them.
        self.consumed.store(seq, Ordering::Release);
    }
}

/// The sending end of a pair line, held by an `Outbox`.
#[derive(Debug)]
pub(crate) struct OutLine {
    mem: ShmLine,
    writer: LineWriter,
    /// Whether to try the line: cleared when it was busy, set again by the
    /// reader side when a frame from the peer arrives.
    local: Arc<Local>,
    /// Keeps our own inbox mapped when the line lives there.
    _keep: Option<Keepalive>,
}

impl OutLine {
    /// Sends `a ++ b` through the line if it is short enough, the line is in
    /// use and the peer consumed our previous line frame.
    #[inline(always)]
    pub(crate) fn try_send(&mut self, a: &[u8], b: &[u8], ring: u64) -> bool {
        if a.len() + b.len() > PAIR_FRAME_MAX || !self.local.try_line() {
            return false;
        }
        // SYNC: pairs with the Release store in `Local::set_consumed`.
        let consumed = self.local.consumed.load(Ordering::Acquire);
        if self.writer.try_send(&self.mem, a, b, ring, consumed) {
            return true;
        }
        self.local.set_try_line(false);
        false
    }
}

/// The receiving end of a pair line, held by the inbox's reader of the peer.
#[derive(Debug)]
pub(crate) struct InLine {
    pub(crate) mem: ShmLine,
    pub(crate) reader: LineReader,
    pub(crate) local: Arc<Local>,
    /// Keeps the peer's inbox mapped when the line lives there.
    _keep: Option<Keepalive>,
}

/// A line waiting for the inbox to poll it, for sender `peer`.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) peer: u32,
    pub(crate) line: InLine,
}

/// What an [`Inbox`](crate::Inbox) shares with the code that connects its
/// process's outboxes: where its pair lines are, and the lines waiting to be
/// polled.
#[derive(Debug)]
pub(crate) struct HostShared {
    pub(crate) owner_id: u32,
    pub(crate) pair_lines: u32,
    /// Address of our inbox's first `PairLine`.
    pub(crate) lines: usize,
    pub(crate) keep: Keepalive,
    pub(crate) pending: Mutex<Vec<Pending>>,
    pub(crate) has_pending: AtomicBool,
}

/// Pairs a process's outboxes with its inbox, so that small frames to and
/// from each local peer share one cache line (see [`PairLine`]). Cheap to
/// clone; get it from [`Inbox::pair_host`](crate::Inbox::pair_host).
#[derive(Debug, Clone)]
pub struct PairHost {
    pub(crate) shared: Arc<HostShared>,
}

/// Where an `Outbox`'s pair line is, as found on connect.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LineSite {
    /// No line (no owner ids, out of range, no fresh fastbox).
    None,
    /// In our own inbox, at the peer's index (we have the lower id).
    Ours,
    /// In the peer's inbox, at our index (we have the higher id).
    Theirs(*mut PairLine),
}

impl PairHost {
    /// Gives `out` (one of this process's outboxes) the pair line it shares
    /// with its receiver, and hands the receiving end to the inbox. Does
    /// nothing (and returns false) when there is no line for the pair: an
    /// id without a line, an outbox whose sender id is not the inbox's
    /// owner id, a peer on the shared queue, a fastbox taken over from a
    /// dead sender, or an outbox already paired.
    ///
    /// Once paired, `out` and the inbox both write this side's half of the
    /// line (acks): drive them from one thread at a time (the fabric does,
    /// under its engine lock), or an ack may be lost or go backwards.
    pub fn pair(&self, out: &mut crate::Outbox) -> bool {
        let h = &self.shared;
        let peer = out.receiver_id();
        if out.sender_id() != h.owner_id {
            return false;
        }
        let (site, keep_theirs) = out.line_site();
        let (line, side, keep_mine, keep_in) = match site {
            LineSite::None => return false,
            LineSite::Ours => {
                if peer >= h.pair_lines {
                    return false;
                }
                let line = (h.lines as *mut PairLine).wrapping_add(peer as usize);
                (line, 0, Some(h.keep.clone()), None)
            }
            LineSite::Theirs(line) => (line, 1, None, Some(keep_theirs)),
        };
        let local = Arc::new(Local {
            try_line: AtomicBool::new(true),
            ..Local::default()
        });
        // SAFETY: the line lies in a mapping kept alive by the keepalives
        // stored next to each end; half `side` is ours (the lower id owns
        // half 0), and each process pairs an outbox once (`set_line`
        // refuses a second line). `local` is held by both ends, and its
        // `my_ack` is used by this line only.
        let mem = unsafe { ShmLine::new(line, side, &local.my_ack) };
        let reader = LineReader::resume(&mem);
        local.consumed.store(reader.consumed(), Ordering::Relaxed);
        let sending = OutLine {
            mem,
            writer: LineWriter::resume(&mem),
            local: local.clone(),
            _keep: keep_mine,
        };
        if !out.set_line(sending) {
            return false;
        }
        let receiving = InLine {
            mem,
            reader,
            local,
            _keep: keep_in,
        };
        h.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Pending {
                peer,
                line: receiving,
            });
        // SYNC: a hint only, read Relaxed by the inbox's poll: the line itself is handed
        // over through `pending`'s lock, which the poll takes once it sees the hint.
        h.has_pending.store(true, Ordering::Release);
        true
    }
}

// SAFETY: the raw pointers of `ShmLine` are addresses in mappings kept alive
// by the keepalives held next to them; moving them to another thread is
// fine, and each end is used through `&mut` by one thread at a time.
unsafe impl Send for OutLine {}
// SAFETY: as above.
unsafe impl Send for InLine {}

#[cfg(test)]
mod tests {
    use super::copy_short;

    #[test]
    fn copy_short_copies_every_length_exactly() {
        let src: Vec<u8> = (1..=40).collect();
        for n in 0..=40 {
            let mut dst = [0xeeu8; 48];
            // SAFETY: both buffers hold at least `n` bytes and are distinct.
            unsafe { copy_short(src.as_ptr(), dst.as_mut_ptr(), n) };
            assert_eq!(&dst[..n], &src[..n], "n = {n}");
            assert!(
                dst[n..].iter().all(|&b| b == 0xee),
                "n = {n}: wrote past the end"
            );
        }
    }
}

//! The fastbox: a single-producer single-consumer ring of 64-byte slots.
//!
//! The ring logic ([`Producer`], [`Consumer`]) is written once against
//! [`RingMem`], which the shared-memory ring implements ([`ShmRing`]) and the
//! loom model implements with loom's checked atomics and cells.
//!
//! Protocol (positions are absolute slot counts, never wrapping in practice):
//!
//! - A frame of `len` bytes takes `k = ceil((8 + len) / 64)` slots starting
//!   at the producer's `head`. It never wraps: if it would, a skip record at
//!   `head` covers the rest of the ring and the frame starts the next lap.
//! - The producer writes the frame bytes, makes sure the slot right after
//!   the frame (where the consumer looks next) cannot pass for a published
//!   frame: only the producer writes ring memory, so it reads that slot's
//!   header word and clears it in the rare case that what it left there a
//!   lap or more ago (a header, or frame bytes) carries the tag that position
//!   will have. Then it stores the frame's header word `len | tag(pos) << 32`
//!   with Release, last. With a skip, the skip record's header is stored
//!   after the frame's. The consumer never writes ring memory, so reading a
//!   frame costs no coherence traffic beyond the lines it reads.
//! - It needs `skip + k + 1` free slots (the `+ 1` is the slot after), free
//!   meaning before `tail + slots`. It checks against a cached tail and only
//!   reloads the consumer's `tail` (Acquire) when the ring looks full.
//! - The consumer loads the header at `tail` (Acquire); a header whose tag is
//!   not `tag(tail)` (0, or a stale one) means nothing arrived. It hands the
//!   frame out, advances `tail` and publishes it (Release) every few slots
//!   and at the end of each batch.

use core::sync::atomic::Ordering;

use crate::layout::{
    fastbox_frame_slots, fastbox_header, fastbox_tag, FASTBOX_FRAME_HEADER_BYTES, FASTBOX_SKIP_LEN,
    FASTBOX_SLOT_BYTES,
};
#[cfg(test)]
use crate::pair::ShmLine;
use crate::pair::{LineMem, LineReader, Peek};

/// The memory of one fastbox ring and its control words.
///
/// # Safety
///
/// Implementations must make `slot < slots()` header words and the frame
/// bytes of any `slot` with `slot + fastbox_frame_slots(len) <= slots()`
/// accessible for the implementation's lifetime.
pub(crate) unsafe trait RingMem {
    /// Number of 64-byte slots, a power of two.
    fn slots(&self) -> u64;
    /// Loads the header word of `slot`.
    fn load_header(&self, slot: usize, order: Ordering) -> u64;
    /// Stores the header word of `slot`.
    fn store_header(&self, slot: usize, value: u64, order: Ordering);
    /// Loads the consumer's published tail.
    fn load_tail(&self, order: Ordering) -> u64;
    /// Publishes the consumer's tail.
    fn store_tail(&self, value: u64, order: Ordering);
    /// Records the producer's head (for a successor after a crash).
    fn store_head(&self, value: u64);
    /// Loads the recorded producer head.
    fn load_head(&self) -> u64;
    /// Writes `a ++ b` as the bytes of a frame starting at `slot`.
    ///
    /// # Safety
    ///
    /// The producer must own the slots `slot .. slot + fastbox_frame_slots(len)`
    /// (the consumer released them), and they must lie inside the ring.
    unsafe fn write_frame(&self, slot: usize, a: &[u8], b: &[u8]);
    /// Calls `f` with the `len` bytes of the frame starting at `slot`.
    ///
    /// # Safety
    ///
    /// The frame must be published (its header loaded with Acquire) and
    /// not yet released, and must lie inside the ring.
    unsafe fn read_frame<R>(&self, slot: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R;
}

/// The producer's private state of one fastbox.
#[derive(Debug)]
pub(crate) struct Producer {
    /// Next free slot position.
    head: u64,
    /// Last tail loaded from the consumer.
    tail_cache: u64,
    /// Frames published (skip records not counted).
    frames: u64,
    slots: u64,
    mask: u64,
    max_frame: usize,
}

impl Producer {
    /// A producer for an empty ring of `slots` slots (`head = tail = 0`).
    pub(crate) fn new(slots: u64, max_frame: usize) -> Producer {
        debug_assert!(slots.is_power_of_two() && slots >= 4);
        debug_assert!(fastbox_frame_slots(max_frame) < slots / 2);
        Producer {
            head: 0,
            tail_cache: 0,
            frames: 0,
            slots,
            mask: slots - 1,
            max_frame,
        }
    }

    /// A producer that takes over a ring from a previous one (detached or
    /// dead): starts at the recorded head and walks over frames the previous
    /// producer published without recording its head (it died between the
    /// two stores).
    pub(crate) fn resume<M: RingMem>(mem: &M, max_frame: usize) -> Producer {
        let mut p = Producer::new(mem.slots(), max_frame);
        // SYNC: pairs with the consumer's Release store of `tail` in `poll`.
        let tail = mem.load_tail(Ordering::Acquire);
        let mut head = mem.load_head();
        // Bounded: a lap holds at most `slots` frames.
        for _ in 0..=p.slots {
            let idx = head & p.mask;
            // SYNC: pairs with the Release header store in `try_send`.
            let w = mem.load_header(idx as usize, Ordering::Acquire);
            if (w >> 32) as u32 != fastbox_tag(head) {
                break;
            }
            let len = w as u32;
            if len == FASTBOX_SKIP_LEN {
                head += p.slots - idx;
            } else {
                head += fastbox_frame_slots(len as usize);
            }
        }
        p.head = head.max(tail);
        p.tail_cache = tail;
        p
    }

    /// Largest frame this producer sends.
    pub(crate) fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Frames published so far by this producer (a resumed one counts from
    /// 0; it has no pair line).
    #[inline(always)]
    pub(crate) fn frames(&self) -> u64 {
        self.frames
    }

    /// Sends `a ++ b` as one frame; false (nothing written) if the ring has
    /// no room for it.
    #[inline(always)]
    pub(crate) fn try_send<M: RingMem>(&mut self, mem: &M, a: &[u8], b: &[u8]) -> bool {
        let len = a.len() + b.len();
        assert!(
            len <= self.max_frame,
            "fastbox frame of {len} bytes exceeds max_frame {}",
            self.max_frame
        );
        let k = fastbox_frame_slots(len);
        let idx = self.head & self.mask;
        let skip = if idx + k > self.slots {
            self.slots - idx
        } else {
            0
        };
        // Free slots needed: the skip, the frame, and the slot after it.
        let end = self.head + skip + k + 1;
        if end - self.tail_cache > self.slots {
            // SYNC: pairs with the consumer's Release store of `tail` in
            // `Consumer::poll`: its reads of the released slots happen
            // before our writes to them.
            self.tail_cache = mem.load_tail(Ordering::Acquire);
            if end - self.tail_cache > self.slots {
                return false;
            }
        }
        let pos = self.head + skip;
        let slot = (pos & self.mask) as usize;
        // SAFETY: slots pos .. pos + k are free (checked against the
        // consumer's tail above) and inside the ring (no wrap by
        // construction of `skip`).
        unsafe { mem.write_frame(slot, a, b) };
        // The slot after the frame is where the consumer looks next. If what
        // it holds (written by us a lap or more ago: a header or frame bytes)
        // carries the tag that position will have, clear it. Relaxed: only
        // we write ring memory, and the Release store of the header below
        // orders the clearing before the consumer's view of that slot.
        let next = ((pos + k) & self.mask) as usize;
        if (mem.load_header(next, Ordering::Relaxed) >> 32) as u32 == fastbox_tag(pos + k) {
            mem.store_header(next, 0, Ordering::Relaxed);
        }
        // SYNC: pairs with the consumer's Acquire load of the header in
        // `Consumer::poll` (and in `Producer::resume`): publishes the frame.
        mem.store_header(slot, fastbox_header(pos, len as u32), Ordering::Release);
        if skip != 0 {
            // SYNC: pairs with the consumer's Acquire load of the header in
            // `Consumer::poll`; stored after the frame's header so that the
            // consumer, once past the skip, finds a published frame.
            mem.store_header(
                idx as usize,
                fastbox_header(self.head, FASTBOX_SKIP_LEN),
                Ordering::Release,
            );
        }
        self.head = pos + k;
        self.frames += 1;
        mem.store_head(self.head);
        true
    }
}

/// Why the consumer stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PollEnd {
    /// Nothing more has arrived, or the batch is done.
    Idle,
    /// The ring holds a header that cannot be valid: the producer is broken.
    /// The consumer does not advance past it.
    Corrupt {
        /// Slot position of the bad header.
        pos: u64,
        /// The header word.
        header: u64,
    },
    /// The pair line holds a frame that cannot be valid (an impossible
    /// length, or an order no ring frame can satisfy).
    CorruptLine {
        /// The line's frame word.
        word: u64,
    },
}

/// The consumer's private state of one fastbox.
#[derive(Debug)]
pub(crate) struct Consumer {
    /// Next slot position to read.
    tail: u64,
    /// Last tail published to the producer.
    released: u64,
    /// Frames consumed (skip records not counted).
    frames: u64,
    slots: u64,
    mask: u64,
    max_frame: usize,
    /// Publish the tail at least every this many slots within a batch.
    release_every: u64,
}

impl Consumer {
    /// A consumer for an empty ring of `slots` slots.
    pub(crate) fn new(slots: u64, max_frame: usize) -> Consumer {
        Consumer {
            tail: 0,
            released: 0,
            frames: 0,
            slots,
            mask: slots - 1,
            max_frame,
            release_every: (slots / 8).max(1),
        }
    }

    /// Whether no frame (nor skip record) is published at the next position:
    /// one Relaxed load, for spinning on.
    #[inline(always)]
    pub(crate) fn quiet<M: RingMem>(&self, mem: &M) -> bool {
        let idx = (self.tail & self.mask) as usize;
        // Relaxed: a hint; `poll_with` acquires what it delivers.
        (mem.load_header(idx, Ordering::Relaxed) >> 32) as u32 != fastbox_tag(self.tail)
    }

    /// Delivers up to `budget` frames, calling `f` with each; returns the
    /// number delivered and why it stopped.
    #[cfg(test)]
    pub(crate) fn poll<M: RingMem, F: FnMut(&[u8])>(
        &mut self,
        mem: &M,
        budget: usize,
        f: F,
    ) -> (usize, PollEnd) {
        self.poll_with(mem, None::<(&ShmLine, &mut LineReader)>, budget, f)
    }

    /// Delivers up to `budget` frames from the ring and, in the writer's
    /// order, from its pair line if there is one (see `crate::pair`),
    /// calling `f` with each; returns the number delivered and why it
    /// stopped.
    #[inline(always)]
    pub(crate) fn poll_with<M: RingMem, L: LineMem, F: FnMut(&[u8])>(
        &mut self,
        mem: &M,
        mut line: Option<(&L, &mut LineReader)>,
        budget: usize,
        mut f: F,
    ) -> (usize, PollEnd) {
        let mut n = 0;
        let mut end = PollEnd::Idle;
        if let Some((lm, lr)) = line.as_mut() {
            lr.ack(*lm);
        }
        while n < budget {
            let idx = self.tail & self.mask;
            // The line first (the common case of a conversation), then the ring.
            let mut peek = line.as_mut().map(|(lm, lr)| lr.peek(*lm, self.frames));
            let mut w = 0;
            let mut ready = false;
            if !matches!(peek, Some(Peek::Ready(_))) {
                // SYNC: pairs with the producer's Release store of the header in
                // `Producer::try_send`: the frame bytes are visible.
                w = mem.load_header(idx as usize, Ordering::Acquire);
                ready = (w >> 32) as u32 == fastbox_tag(self.tail);
                if ready || peek == Some(Peek::Later) {
                    // Again after the ring header: a line frame published before
                    // the ring frame just seen is seen now (and goes first).
                    peek = line.as_mut().map(|(lm, lr)| lr.peek(*lm, self.frames));
                }
            }
            if let Some((lm, lr)) = line.as_mut() {
                match peek {
                    Some(Peek::Ready(word)) => {
                        // SAFETY: `peek` just returned Ready for `word`.
                        if unsafe { lr.take(*lm, word, &mut f) }.is_err() {
                            end = PollEnd::CorruptLine { word };
                            break;
                        }
                        n += 1;
                        continue;
                    }
                    Some(Peek::Later) if !ready => {
                        // The ring frames it waits for were published before it,
                        // so the second ring load saw them unless the writer is
                        // broken.
                        end = PollEnd::CorruptLine {
                            word: lm.load_their_frame(Ordering::Relaxed),
                        };
                        break;
                    }
                    _ => {}
                }
            }
            if !ready {
                break;
            }
            let len = w as u32;
            if len == FASTBOX_SKIP_LEN && idx != 0 {
                self.tail += self.slots - idx;
                continue;
            }
            let k = fastbox_frame_slots(len as usize);
            if len as usize > self.max_frame || idx + k > self.slots {
                end = PollEnd::Corrupt {
                    pos: self.tail,
                    header: w,
                };
                break;
            }
            // SAFETY: the header was acquired, so the frame is published; it
            // lies inside the ring (checked above) and stays ours until we
            // publish a tail past it.
            unsafe { mem.read_frame(idx as usize, len as usize, &mut f) };
            self.tail += k;
            self.frames += 1;
            n += 1;
            if self.tail - self.released >= self.release_every {
                self.release(mem);
            }
        }
        if self.tail != self.released {
            self.release(mem);
        }
        (n, end)
    }

    #[inline(always)]
    fn release<M: RingMem>(&mut self, mem: &M) {
        // SYNC: pairs with the producer's Acquire load of `tail` in
        // `Producer::try_send`: our reads of the released slots happen
        // before its next writes to them.
        mem.store_tail(self.tail, Ordering::Release);
        self.released = self.tail;
    }
}

/// A fastbox ring inside a mapped inbox segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShmRing {
    /// First byte of the ring (64-byte aligned).
    ring: *mut u8,
    /// The fastbox's control block.
    ctl: *const crate::layout::FastboxCtl,
    slots: u64,
}

impl ShmRing {
    /// # Safety
    ///
    /// `ring` must point to `slots * 64` bytes and `ctl` to a `FastboxCtl`,
    /// both in a shared mapping that outlives every use of the returned
    /// value, 64- and 128-byte aligned respectively; `slots` a power of two.
    pub(crate) unsafe fn new(
        ring: *mut u8,
        ctl: *const crate::layout::FastboxCtl,
        slots: u64,
    ) -> ShmRing {
        ShmRing { ring, ctl, slots }
    }

    #[inline(always)]
    fn header(&self, slot: usize) -> &core::sync::atomic::AtomicU64 {
        debug_assert!((slot as u64) < self.slots);
        // SAFETY: `slot < slots` (callers in this module guarantee it), so
        // the word lies inside the ring, 64-byte aligned; it is an atomic
        // (interior mutability) in memory that outlives `self` (contract of
        // `ShmRing::new`).
        unsafe { &*self.ring.add(slot * FASTBOX_SLOT_BYTES).cast() }
    }

    #[inline(always)]
    fn ctl(&self) -> &crate::layout::FastboxCtl {
        // SAFETY: contract of `ShmRing::new`; all shared fields are atomics.
        unsafe { &*self.ctl }
    }
}

// SAFETY: `ShmRing::new`'s contract makes every slot of the ring and the
// control block accessible while the value is used.
unsafe impl RingMem for ShmRing {
    #[inline(always)]
    fn slots(&self) -> u64 {
        self.slots
    }
    #[inline(always)]
    fn load_header(&self, slot: usize, order: Ordering) -> u64 {
        self.header(slot).load(order)
    }
    #[inline(always)]
    fn store_header(&self, slot: usize, value: u64, order: Ordering) {
        self.header(slot).store(value, order)
    }
    #[inline(always)]
    fn load_tail(&self, order: Ordering) -> u64 {
        self.ctl().tail.load(order)
    }
    #[inline(always)]
    fn store_tail(&self, value: u64, order: Ordering) {
        self.ctl().tail.store(value, order)
    }
    #[inline(always)]
    fn store_head(&self, value: u64) {
        // Relaxed: only read by a successor producer, which synchronises
        // through the claim word (or finds the ring by walking headers).
        self.ctl().head.store(value, Ordering::Relaxed)
    }
    #[inline(always)]
    fn load_head(&self) -> u64 {
        // Relaxed: ordered by the successor's claim CAS (Acquire), which
        // pairs with the previous holder's Release detach in `Outbox::drop`.
        self.ctl().head.load(Ordering::Relaxed)
    }
    #[inline(always)]
    unsafe fn write_frame(&self, slot: usize, a: &[u8], b: &[u8]) {
        // SAFETY: the caller guarantees slots slot .. slot + k are ours and
        // inside the ring; the frame bytes start after the 8-byte header and
        // `8 + a.len() + b.len() <= k * 64`. Plain writes do not race: the
        // consumer reads these bytes only after acquiring the header we
        // store afterwards, and has released them before.
        unsafe {
            let dst = self
                .ring
                .add(slot * FASTBOX_SLOT_BYTES + FASTBOX_FRAME_HEADER_BYTES);
            core::ptr::copy_nonoverlapping(a.as_ptr(), dst, a.len());
            core::ptr::copy_nonoverlapping(b.as_ptr(), dst.add(a.len()), b.len());
        }
    }
    #[inline(always)]
    unsafe fn read_frame<R>(&self, slot: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        // SAFETY: the caller guarantees the frame is published, ours until
        // released (the producer does not write it meanwhile) and inside the
        // ring.
        let bytes = unsafe {
            core::slice::from_raw_parts(
                self.ring
                    .add(slot * FASTBOX_SLOT_BYTES + FASTBOX_FRAME_HEADER_BYTES),
                len,
            )
        };
        f(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::FastboxCtl;

    #[repr(C, align(64))]
    struct Line([u64; 8]);

    /// A heap-backed ring for single-thread tests of the protocol.
    struct HeapRing {
        ring: Vec<Line>,
        ctl: Box<FastboxCtl>,
    }

    impl HeapRing {
        fn new(slots: usize) -> HeapRing {
            // SAFETY: FastboxCtl is atomics and integers: all-zero is valid.
            let ctl: Box<FastboxCtl> = Box::new(unsafe { core::mem::zeroed() });
            HeapRing {
                ring: (0..slots).map(|_| Line([0; 8])).collect(),
                ctl,
            }
        }
        fn mem(&mut self) -> ShmRing {
            let slots = self.ring.len() as u64;
            // SAFETY: ring and ctl are aligned by their types and outlive
            // the returned ShmRing within each test.
            unsafe { ShmRing::new(self.ring.as_mut_ptr().cast(), &*self.ctl, slots) }
        }
    }

    fn frame(seq: u32, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (seq as usize).wrapping_mul(131).wrapping_add(i) as u8)
            .collect()
    }

    #[test]
    fn frames_of_every_size_wrap_and_skip() {
        let mut heap = HeapRing::new(64);
        let mem = heap.mem();
        let max = 64 * 64 / 4;
        let mut p = Producer::new(64, max);
        let mut c = Consumer::new(64, max);
        let (mut sent, mut got) = (0u32, 0u32);
        let consume = |c: &mut Consumer, got: &mut u32, budget| {
            let (n, end) = c.poll(&mem, budget, |b| {
                assert_eq!(b, &frame(*got, (*got as usize * 37) % (max + 1))[..]);
                *got += 1;
            });
            assert_eq!(end, PollEnd::Idle);
            n
        };
        for _ in 0..20_000 {
            let f = frame(sent, (sent as usize * 37) % (max + 1));
            let split = f.len() / 3;
            while !p.try_send(&mem, &f[..split], &f[split..]) {
                assert!(
                    consume(&mut c, &mut got, 3) > 0,
                    "full ring with nothing in it"
                );
            }
            sent += 1;
        }
        while consume(&mut c, &mut got, 64) > 0 {}
        assert_eq!(got, sent);
        assert!(p.head > 64 * 1000, "wrapped many times ({})", p.head);
    }

    #[test]
    fn full_ring_refuses_then_recovers() {
        let mut heap = HeapRing::new(64);
        let mem = heap.mem();
        let mut p = Producer::new(64, 1024);
        let mut c = Consumer::new(64, 1024);
        let mut n = 0;
        while p.try_send(&mem, &[1; 8], &[]) {
            n += 1;
        }
        assert_eq!(n, 63, "one slot stays free");
        assert_eq!(c.poll(&mem, 1, |b| assert_eq!(b, [1; 8])).0, 1);
        assert!(p.try_send(&mem, &[2; 8], &[]));
        assert!(!p.try_send(&mem, &[3; 8], &[]));
        assert_eq!(c.poll(&mem, 1000, |_| ()).0, 63);
    }

    #[test]
    fn resume_skips_frames_whose_head_was_not_recorded() {
        let mut heap = HeapRing::new(64);
        let mem = heap.mem();
        let mut p = Producer::new(64, 1024);
        for i in 0..10u8 {
            assert!(p.try_send(&mem, &[i; 100], &[]));
        }
        // A producer that died after publishing but before recording head.
        mem.store_head(2 * 9);
        let mut q = Producer::resume(&mem, 1024);
        assert_eq!(q.head, p.head);
        assert!(q.try_send(&mem, &[10; 100], &[]));
        let mut c = Consumer::new(64, 1024);
        let mut seen = Vec::new();
        c.poll(&mem, 100, |b| seen.push(b[0]));
        assert_eq!(seen, (0..=10).collect::<Vec<u8>>());
    }

    #[test]
    fn payload_that_looks_like_a_future_header_is_never_read_as_one() {
        let mut heap = HeapRing::new(64);
        let mem = heap.mem();
        let mut p = Producer::new(64, 1024);
        let mut c = Consumer::new(64, 1024);
        // Frame 0 spans slots 0 and 1; the bytes where slot 1's header word
        // lies are the header a frame at position 65 (slot 1, next lap)
        // would have.
        let mut a = vec![0xabu8; 100];
        a[56..64].copy_from_slice(&fastbox_header(65, 8).to_le_bytes());
        assert!(p.try_send(&mem, &a, &[]));
        let mut got = Vec::new();
        c.poll(&mem, 64, |b| got.push(b.to_vec()));
        // Fill the rest of the lap with one-slot frames, then one at 64.
        for i in 2..=64u8 {
            assert!(p.try_send(&mem, &[i; 8], &[]));
            c.poll(&mem, 64, |b| got.push(b.to_vec()));
        }
        // The consumer now waits at position 65, over the stale bytes.
        for _ in 0..3 {
            c.poll(&mem, 64, |b| got.push(b.to_vec()));
        }
        assert_eq!(got.len(), 64, "a stale payload was delivered as a frame");
        assert_eq!(got[0], a);
        assert_eq!(got[63], [64; 8]);
    }

    #[test]
    fn corrupt_header_stops_the_consumer() {
        let mut heap = HeapRing::new(64);
        let mem = heap.mem();
        mem.store_header(0, fastbox_header(0, 5000), Ordering::Release);
        let mut c = Consumer::new(64, 1024);
        let (n, end) = c.poll(&mem, 10, |_| panic!("delivered a corrupt frame"));
        assert_eq!(n, 0);
        assert!(matches!(end, PollEnd::Corrupt { pos: 0, .. }));
    }

    /// A pair line on the heap, seen from side 0 (writer) and side 1 (reader).
    #[allow(clippy::type_complexity)]
    fn heap_line() -> (
        Box<crate::layout::PairLine>,
        Box<[core::sync::atomic::AtomicU32; 2]>,
        ShmLine,
        ShmLine,
    ) {
        // SAFETY: atomics and bytes: all-zero is a valid, empty line.
        let mut line: Box<crate::layout::PairLine> = Box::new(unsafe { core::mem::zeroed() });
        let acks = Box::new([0, 0].map(core::sync::atomic::AtomicU32::new));
        let p: *mut crate::layout::PairLine = &mut *line;
        // SAFETY: the boxes outlive both views within each test; side 0 is
        // written through `w` only, side 1 through `r` only, each with its
        // own ack copy.
        let (w, r) = unsafe { (ShmLine::new(p, 0, &acks[0]), ShmLine::new(p, 1, &acks[1])) };
        (line, acks, w, r)
    }

    /// A writer that tries the line for short frames and falls back to the
    /// ring, and a reader polling both with random budgets: every frame
    /// arrives once, intact, in the order sent, and both paths are used.
    #[test]
    fn line_and_ring_frames_arrive_in_send_order() {
        use crate::pair::LineWriter;
        let mut heap = HeapRing::new(64);
        let mem = heap.mem();
        let (_line, _acks, wl, rl) = heap_line();
        let mut p = Producer::new(64, 1024);
        let mut c = Consumer::new(64, 1024);
        let mut w = LineWriter::resume(&wl);
        let mut r = LineReader::resume(&rl);
        r.listen(&rl, true);
        let len_of = |i: u32| match i % 7 {
            0 | 3 => 100,
            5 => 24,
            _ => (i % 17) as usize,
        };
        let (mut sent, mut got, mut by_line) = (0u32, 0u32, 0u32);
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        while got < 20_000 {
            if sent < 20_000 && rand() % 3 != 0 {
                let f = frame(sent, len_of(sent));
                let on_line = f.len() <= crate::layout::PAIR_FRAME_MAX
                    && rand() % 2 == 0
                    && w.try_send(&wl, &f[..f.len() / 2], &f[f.len() / 2..], p.frames(), 0);
                if on_line {
                    by_line += 1;
                    sent += 1;
                } else if p.try_send(&mem, &f, &[]) {
                    sent += 1;
                }
            } else {
                let budget = (rand() % 4) as usize + 1;
                let (_, end) = c.poll_with(&mem, Some((&rl, &mut r)), budget, |b| {
                    assert_eq!(b, &frame(got, len_of(got))[..], "frame {got}");
                    got += 1;
                });
                assert_eq!(end, PollEnd::Idle);
            }
        }
        assert_eq!(sent, got);
        assert!(
            by_line > 1000 && by_line < sent / 2,
            "{by_line} of {sent} by line"
        );
    }

    #[test]
    fn impossible_line_frame_stops_the_consumer() {
        let mut heap = HeapRing::new(64);
        let mem = heap.mem();
        let (_line, _acks, wl, rl) = heap_line();
        let mut c = Consumer::new(64, 1024);
        let mut r = LineReader::resume(&rl);
        // seq 1, length 200 (more than a line holds), after 0 ring frames.
        wl.store_my_frame(1 | 200 << 8, Ordering::Release);
        let (n, end) = c.poll_with(&mem, Some((&rl, &mut r)), 8, |_| panic!("delivered"));
        assert_eq!(n, 0);
        assert_eq!(end, PollEnd::CorruptLine { word: 1 | 200 << 8 });
        // A line frame that waits for a ring frame that never comes.
        let (_line, _acks, wl, rl) = heap_line();
        let mut r = LineReader::resume(&rl);
        wl.store_my_frame(1 | 8 << 8 | 5 << 16, Ordering::Release);
        let (n, end) = c.poll_with(&mem, Some((&rl, &mut r)), 8, |_| panic!("delivered"));
        assert_eq!(n, 0);
        assert!(matches!(end, PollEnd::CorruptLine { .. }), "{end:?}");
    }
}

/// A loom model of the publish/consume protocol: the real [`Producer`] and
/// [`Consumer`] over a ring made of loom atomics and cells. Run with
/// `RUSTFLAGS="--cfg loom" cargo test -p weft-shm --lib --release loom`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::AtomicU64;
    use loom::sync::Arc;

    const SLOTS: usize = 8;
    const BODY: usize = FASTBOX_SLOT_BYTES - FASTBOX_FRAME_HEADER_BYTES;

    /// The ring as loom sees it: each slot's first 8 bytes are an atomic
    /// word (a header, or frame bytes of a frame that spans the slot), the
    /// other 56 a checked cell.
    struct LoomRing {
        headers: Vec<AtomicU64>,
        bodies: Vec<UnsafeCell<[u8; BODY]>>,
        tail: AtomicU64,
        head: AtomicU64,
    }

    impl LoomRing {
        fn new() -> LoomRing {
            LoomRing {
                headers: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
                bodies: (0..SLOTS).map(|_| UnsafeCell::new([0; BODY])).collect(),
                tail: AtomicU64::new(0),
                head: AtomicU64::new(0),
            }
        }
    }

    // SAFETY: every slot below SLOTS exists; frames never pass the end.
    unsafe impl RingMem for LoomRing {
        fn slots(&self) -> u64 {
            SLOTS as u64
        }
        fn load_header(&self, slot: usize, order: Ordering) -> u64 {
            self.headers[slot].load(order)
        }
        fn store_header(&self, slot: usize, value: u64, order: Ordering) {
            self.headers[slot].store(value, order)
        }
        fn load_tail(&self, order: Ordering) -> u64 {
            self.tail.load(order)
        }
        fn store_tail(&self, value: u64, order: Ordering) {
            self.tail.store(value, order)
        }
        fn store_head(&self, value: u64) {
            self.head.store(value, Ordering::Relaxed)
        }
        fn load_head(&self) -> u64 {
            self.head.load(Ordering::Relaxed)
        }
        unsafe fn write_frame(&self, slot: usize, a: &[u8], b: &[u8]) {
            let bytes: Vec<u8> = a.iter().chain(b).copied().collect();
            let k = fastbox_frame_slots(bytes.len()) as usize;
            for s in 0..k {
                // Frame byte i lives at ring offset slot*64 + 8 + i.
                let first = (s * FASTBOX_SLOT_BYTES).saturating_sub(FASTBOX_FRAME_HEADER_BYTES);
                if s > 0 {
                    let mut w = self.headers[slot + s].load(Ordering::Relaxed).to_le_bytes();
                    for (j, byte) in w.iter_mut().enumerate() {
                        if let Some(v) = bytes.get(first + j) {
                            *byte = *v;
                        }
                    }
                    self.headers[slot + s].store(u64::from_le_bytes(w), Ordering::Relaxed);
                }
                let body_first = s * FASTBOX_SLOT_BYTES;
                if body_first < bytes.len() {
                    let end = bytes.len().min(body_first + BODY);
                    self.bodies[slot + s].with_mut(|p| {
                        // SAFETY: loom checks this access for races.
                        let body = unsafe { &mut *p };
                        body[..end - body_first].copy_from_slice(&bytes[body_first..end]);
                    });
                }
            }
        }
        unsafe fn read_frame<R>(&self, slot: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
            let mut bytes = vec![0u8; len];
            let k = fastbox_frame_slots(len) as usize;
            for s in 0..k {
                let first = (s * FASTBOX_SLOT_BYTES).saturating_sub(FASTBOX_FRAME_HEADER_BYTES);
                if s > 0 {
                    let w = self.headers[slot + s].load(Ordering::Relaxed).to_le_bytes();
                    for (j, v) in w.iter().enumerate() {
                        if let Some(byte) = bytes.get_mut(first + j) {
                            *byte = *v;
                        }
                    }
                }
                let body_first = s * FASTBOX_SLOT_BYTES;
                if body_first < len {
                    let end = len.min(body_first + BODY);
                    self.bodies[slot + s].with(|p| {
                        // SAFETY: loom checks this access for races.
                        let body = unsafe { &*p };
                        bytes[body_first..end].copy_from_slice(&body[..end - body_first]);
                    });
                }
            }
            f(&bytes)
        }
    }

    fn frame(i: usize, len: usize) -> Vec<u8> {
        (0..len).map(|j| (i * 31 + j) as u8 | 1).collect()
    }

    /// A pair line for loom: the words as loom atomics, the body a checked cell.
    #[derive(Default)]
    struct LoomHalf {
        frame: AtomicU64,
        ack: loom::sync::atomic::AtomicU32,
        body: UnsafeCell<[u8; crate::pair::BODY_BYTES]>,
    }

    struct LoomLine {
        halves: Arc<[LoomHalf; 2]>,
        side: usize,
    }

    // SAFETY: both halves live as long as the Arc; each side writes its own.
    unsafe impl crate::pair::LineMem for LoomLine {
        fn load_their_frame(&self, order: Ordering) -> u64 {
            self.halves[1 - self.side].frame.load(order)
        }
        fn load_their_ack(&self, order: Ordering) -> u32 {
            self.halves[1 - self.side].ack.load(order)
        }
        fn load_my_frame(&self) -> u64 {
            self.halves[self.side].frame.load(Ordering::Relaxed)
        }
        fn load_my_ack(&self) -> u32 {
            self.halves[self.side].ack.load(Ordering::Relaxed)
        }
        fn store_my_frame(&self, value: u64, order: Ordering) {
            self.halves[self.side].frame.store(value, order)
        }
        fn store_my_ack(&self, value: u32, order: Ordering) {
            self.halves[self.side].ack.store(value, order)
        }
        unsafe fn write_my_body(&self, body: &[u8; crate::pair::BODY_BYTES]) {
            // SAFETY: loom checks this access for races.
            self.halves[self.side]
                .body
                .with_mut(|p| unsafe { *p = *body });
        }
        unsafe fn read_their_body(&self, body: &mut [u8; crate::pair::BODY_BYTES]) {
            // SAFETY: loom checks this access for races.
            self.halves[1 - self.side]
                .body
                .with(|p| *body = unsafe { *p });
        }
    }

    /// Short frames that try the line first and go by the ring when it is
    /// busy, a long one by the ring: they arrive in order, with the line's
    /// ack stored lazily by the reader's next poll.
    #[test]
    fn loom_line_and_ring_keep_order() {
        const LENS: [usize; 4] = [8, 8, 100, 8];
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let ring = Arc::new(LoomRing::new());
            let halves = Arc::new([LoomHalf::default(), LoomHalf::default()]);
            let reader_line = LoomLine {
                halves: halves.clone(),
                side: 1,
            };
            let mut r = crate::pair::LineReader::resume(&reader_line);
            r.listen(&reader_line, true);
            let producer_ring = ring.clone();
            let producer = loom::thread::spawn(move || {
                let line = LoomLine { halves, side: 0 };
                let mut w = crate::pair::LineWriter::resume(&line);
                let mut p = Producer::new(SLOTS as u64, 128);
                for (i, &len) in LENS.iter().enumerate() {
                    let f = frame(i, len);
                    if len <= crate::layout::PAIR_FRAME_MAX
                        && w.try_send(&line, &f, &[], p.frames(), 0)
                    {
                        continue;
                    }
                    while !p.try_send(&*producer_ring, &f[..len / 2], &f[len / 2..]) {
                        loom::thread::yield_now();
                    }
                }
            });
            let mut c = Consumer::new(SLOTS as u64, 128);
            let mut got = 0;
            while got < LENS.len() {
                let (n, end) = c.poll_with(&*ring, Some((&reader_line, &mut r)), 2, |b| {
                    assert_eq!(
                        b,
                        &frame(got, LENS[got])[..],
                        "frame {got} out of order or torn"
                    );
                    got += 1;
                });
                assert_eq!(end, PollEnd::Idle);
                if n == 0 {
                    loom::thread::yield_now();
                }
            }
            producer.join().unwrap();
        });
    }

    /// Frames of 3, 1, 3 and 3 slots in an 8-slot ring: the last one needs
    /// a skip record and lands on slots the consumer must have released.
    #[test]
    fn loom_spsc_publish_consume() {
        const LENS: [usize; 4] = [128, 8, 128, 128];
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(5);
        builder.check(|| {
            let ring = Arc::new(LoomRing::new());
            let producer_ring = ring.clone();
            let producer = loom::thread::spawn(move || {
                let mut p = Producer::new(SLOTS as u64, 128);
                for (i, &len) in LENS.iter().enumerate() {
                    let f = frame(i, len);
                    while !p.try_send(&*producer_ring, &f[..len / 2], &f[len / 2..]) {
                        loom::thread::yield_now();
                    }
                }
            });
            let mut c = Consumer::new(SLOTS as u64, 128);
            let mut got = 0;
            while got < LENS.len() {
                let (n, end) = c.poll(&*ring, 2, |b| {
                    assert_eq!(b, &frame(got, LENS[got])[..], "frame {got} torn");
                    got += 1;
                });
                assert_eq!(end, PollEnd::Idle);
                if n == 0 {
                    loom::thread::yield_now();
                }
            }
            producer.join().unwrap();
            assert_eq!(c.poll(&*ring, 8, |_| panic!("extra frame")).0, 0);
        });
    }
}

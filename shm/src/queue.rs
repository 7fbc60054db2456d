//! The shared multi-producer single-consumer queue behind the fastboxes.
//!
//! A bounded array queue with per-slot sequence numbers (Vyukov style), one
//! frame per slot. A producer reserves ticket `t` by a CAS on the state word
//! of slot `t % slots`, from "free for lap `t - index`" to "busy, owner
//! `sender_id + 1`", then helps move the shared `enqueue_pos` hint past `t`,
//! writes the frame and stores "ready" (`seq + 1`, owner 0) with Release.
//! The single consumer takes tickets in order and stores "free for the next
//! lap" with Release after handing the frame out.
//!
//! Because the busy state names its owner, a producer that died between
//! reservation and publication (the window of one memcpy) does not stall the
//! queue forever: after the head slot stayed busy for a while the consumer
//! asks whether the owner still holds its sender lock (see
//! `crate::inbox`) and, if not, recycles the slot.

use core::sync::atomic::Ordering;

use crate::layout::{QueueProducerLine, QueueSlotHeader, QUEUE_SLOT_HEADER_BYTES};

/// The memory a queue's logic runs on: per slot a state word, the sender id and length
/// words and the frame bytes, and the producers' shared ticket hint. The shared-memory
/// queue implements it ([`ShmSlots`]), and the loom model with loom's checked atomics and
/// cells, so that both run the same [`Queue`] code.
///
/// # Safety
///
/// `slot` indices below `mask + 1` must be valid; [`write`](QueueMem::write) and
/// [`read`](QueueMem::read) may only be called by the slot's owner of the moment (the
/// producer that reserved it, the consumer after acquiring its ready state), within
/// `max_frame` bytes.
pub(crate) unsafe trait QueueMem {
    /// Slots minus one (slots are a power of two).
    fn mask(&self) -> u64;
    /// Largest frame a slot carries.
    fn max_frame(&self) -> usize;
    /// Loads slot `i`'s state word.
    fn state_load(&self, i: usize, o: Ordering) -> u64;
    /// Stores slot `i`'s state word.
    fn state_store(&self, i: usize, v: u64, o: Ordering);
    /// Compare-exchanges slot `i`'s state word (weak when `weak`).
    fn state_cas(
        &self,
        i: usize,
        cur: u64,
        new: u64,
        ok: Ordering,
        fail: Ordering,
        weak: bool,
    ) -> Result<u64, u64>;
    /// Stores slot `i`'s sender id and length (Relaxed: the state publishes them).
    fn set_meta(&self, i: usize, sender: u32, len: u32);
    /// Slot `i`'s sender id and length (Relaxed: read after acquiring its state).
    fn meta(&self, i: usize) -> (u32, u32);
    /// Loads the ticket hint.
    fn pos_load(&self, o: Ordering) -> u64;
    /// Compare-exchanges the ticket hint (Relaxed both ways: a hint).
    fn pos_cas(&self, cur: u64, new: u64);
    /// Writes `a ++ b` into slot `i`'s frame bytes.
    ///
    /// # Safety
    ///
    /// The caller owns the slot (reserved it), and `a.len() + b.len() <= max_frame`.
    unsafe fn write(&self, i: usize, a: &[u8], b: &[u8]);
    /// Hands slot `i`'s first `len` frame bytes to `f`.
    ///
    /// # Safety
    ///
    /// The caller acquired the slot's ready state, and `len <= max_frame`.
    unsafe fn read<R>(&self, i: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R;
}

/// The slots of a queue inside a mapped inbox segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShmSlots {
    /// First slot.
    base: *mut u8,
    /// The producers' shared line.
    producer: *const QueueProducerLine,
    slot_bytes: usize,
    mask: u64,
    max_frame: usize,
}

impl ShmSlots {
    #[inline(always)]
    fn header(&self, i: usize) -> &QueueSlotHeader {
        // SAFETY: i < slots (trait contract), so the slot lies inside the queue (contract
        // of `ShmQueue::new`); its header is 64-byte aligned and made of atomics.
        unsafe { &*self.base.add(i * self.slot_bytes).cast::<QueueSlotHeader>() }
    }

    #[inline(always)]
    fn data(&self, i: usize) -> *mut u8 {
        // SAFETY: as in `header`: the frame bytes follow the slot's header.
        unsafe { self.base.add(i * self.slot_bytes + QUEUE_SLOT_HEADER_BYTES) }
    }
}

// SAFETY: slots are within the mapping `ShmQueue::new`'s contract describes; `write` and
// `read` copy within `max_frame` bytes after the header, at the owner's call only.
unsafe impl QueueMem for ShmSlots {
    #[inline(always)]
    fn mask(&self) -> u64 {
        self.mask
    }
    #[inline(always)]
    fn max_frame(&self) -> usize {
        self.max_frame
    }
    #[inline(always)]
    fn state_load(&self, i: usize, o: Ordering) -> u64 {
        self.header(i).state.load(o)
    }
    #[inline(always)]
    fn state_store(&self, i: usize, v: u64, o: Ordering) {
        self.header(i).state.store(v, o)
    }
    #[inline(always)]
    fn state_cas(
        &self,
        i: usize,
        cur: u64,
        new: u64,
        ok: Ordering,
        fail: Ordering,
        weak: bool,
    ) -> Result<u64, u64> {
        let s = &self.header(i).state;
        if weak {
            s.compare_exchange_weak(cur, new, ok, fail)
        } else {
            s.compare_exchange(cur, new, ok, fail)
        }
    }
    #[inline(always)]
    fn set_meta(&self, i: usize, sender: u32, len: u32) {
        let h = self.header(i);
        h.sender.store(sender, Ordering::Relaxed);
        h.len.store(len, Ordering::Relaxed);
    }
    #[inline(always)]
    fn meta(&self, i: usize) -> (u32, u32) {
        let h = self.header(i);
        (
            h.sender.load(Ordering::Relaxed),
            h.len.load(Ordering::Relaxed),
        )
    }
    #[inline(always)]
    fn pos_load(&self, o: Ordering) -> u64 {
        // SAFETY: contract of `ShmQueue::new`; the field is an atomic.
        unsafe { &(*self.producer).enqueue_pos }.load(o)
    }
    #[inline(always)]
    fn pos_cas(&self, cur: u64, new: u64) {
        // SAFETY: as in `pos_load`.
        let pos = unsafe { &(*self.producer).enqueue_pos };
        let _ = pos.compare_exchange(cur, new, Ordering::Relaxed, Ordering::Relaxed);
    }
    #[inline(always)]
    unsafe fn write(&self, i: usize, a: &[u8], b: &[u8]) {
        let data = self.data(i);
        // SAFETY: the caller owns the slot and `a.len() + b.len() <= max_frame`, which
        // fits after the slot's header.
        unsafe {
            core::ptr::copy_nonoverlapping(a.as_ptr(), data, a.len());
            core::ptr::copy_nonoverlapping(b.as_ptr(), data.add(a.len()), b.len());
        }
    }
    #[inline(always)]
    unsafe fn read<R>(&self, i: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        // SAFETY: the caller acquired the ready state (the bytes are published, and no
        // producer writes the slot until it is freed); `len <= max_frame` stays inside
        // the slot.
        f(unsafe { core::slice::from_raw_parts(self.data(i), len) })
    }
}

/// The queue's logic over its memory `M`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queue<M> {
    mem: M,
}

/// The shared queue inside a mapped inbox segment.
pub(crate) type ShmQueue = Queue<ShmSlots>;

/// What the consumer found at the head of the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Head {
    /// Nothing is reserved.
    Empty,
    /// A producer (`sender_id`) has reserved the head slot and not published
    /// it yet.
    Busy {
        /// The owner's sender id.
        sender_id: u32,
    },
}

/// Ticket's lap base, as stored in the high half of a state word.
#[inline(always)]
fn lap(ticket: u64, mask: u64) -> u32 {
    (ticket & !mask) as u32
}

#[inline(always)]
fn state(seq: u32, owner: u32) -> u64 {
    (u64::from(seq) << 32) | u64::from(owner)
}

impl ShmQueue {
    /// # Safety
    ///
    /// `base` must point to `slots * slot_bytes` bytes and `producer` to a
    /// `QueueProducerLine`, in a shared mapping that outlives every use of
    /// the returned value; `base` 64-byte aligned, `slot_bytes` a multiple
    /// of 64 larger than the slot header, `slots` a power of two >= 2.
    pub(crate) unsafe fn new(
        base: *mut u8,
        producer: *const QueueProducerLine,
        slots: u64,
        slot_bytes: usize,
    ) -> ShmQueue {
        Queue {
            mem: ShmSlots {
                base,
                producer,
                slot_bytes,
                mask: slots - 1,
                max_frame: slot_bytes - QUEUE_SLOT_HEADER_BYTES,
            },
        }
    }
}

impl<M: QueueMem> Queue<M> {
    /// Largest frame a slot carries.
    pub(crate) fn max_frame(&self) -> usize {
        self.mem.max_frame()
    }

    #[inline(always)]
    fn idx(&self, ticket: u64) -> usize {
        (ticket & self.mem.mask()) as usize
    }

    /// Sends `a ++ b` from `sender_id`; false (nothing written) if the queue
    /// is full.
    #[inline]
    pub(crate) fn try_send(&self, sender_id: u32, a: &[u8], b: &[u8]) -> bool {
        let m = &self.mem;
        let len = a.len() + b.len();
        assert!(
            len <= m.max_frame(),
            "queue frame of {len} bytes exceeds max_frame {}",
            m.max_frame()
        );
        let owner = sender_id + 1;
        loop {
            // Relaxed: only a hint; the slot's state decides.
            let t = m.pos_load(Ordering::Relaxed);
            let i = self.idx(t);
            // SYNC: pairs with the consumer's Release store freeing the slot
            // in `poll` (and `recycle`): its reads happen before our writes.
            let s = m.state_load(i, Ordering::Acquire);
            let seq = (s >> 32) as u32;
            let diff = seq.wrapping_sub(lap(t, m.mask())) as i32;
            if diff == 0 && s as u32 == 0 {
                // SYNC: Acquire on success pairs with the consumer's Release
                // store that freed the slot (as for the load above).
                let reserved = m.state_cas(
                    i,
                    s,
                    state(seq, owner),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                    true,
                );
                if reserved.is_err() {
                    continue;
                }
                // A hint; failure means someone helped already.
                m.pos_cas(t, t + 1);
                m.set_meta(i, sender_id, len as u32);
                // SAFETY: we own the slot (reserved by the CAS above) and
                // `len <= max_frame`. The consumer reads the bytes only after
                // acquiring the ready state below.
                unsafe { m.write(i, a, b) };
                // SYNC: pairs with the consumer's Acquire load of the state
                // in `poll`: publishes sender, len and bytes.
                m.state_store(i, state(seq + 1, 0), Ordering::Release);
                return true;
            } else if diff < 0 {
                // The slot still holds the previous lap: full.
                return false;
            } else {
                // Ticket t is taken: reserved (busy), published, or already
                // consumed (the slot is on a later lap; e.g. its producer
                // died before moving the hint and the slot was recycled).
                // Help move the hint on (the slot states carry the data).
                m.pos_cas(t, t + 1);
            }
            spin();
        }
    }

    /// Whether the slot of ticket `head` is empty (no frame, no writer):
    /// one Relaxed load, for spinning on.
    #[inline(always)]
    pub(crate) fn quiet(&self, head: u64) -> bool {
        // Relaxed: a hint; `poll` acquires what it delivers.
        self.mem.state_load(self.idx(head), Ordering::Relaxed)
            == state(lap(head, self.mem.mask()), 0)
    }

    /// Delivers up to `budget` frames from ticket `*head` on, calling
    /// `f(sender_id, bytes)`; returns how many, and the head's state when it
    /// stopped early.
    #[inline]
    pub(crate) fn poll<F: FnMut(u32, &[u8])>(
        &self,
        head: &mut u64,
        budget: usize,
        mut f: F,
    ) -> (usize, Head) {
        let m = &self.mem;
        let mut n = 0;
        while n < budget {
            let t = *head;
            let i = self.idx(t);
            // SYNC: pairs with the producer's Release store of the ready
            // state in `try_send`.
            let s = m.state_load(i, Ordering::Acquire);
            let seq = lap(t, m.mask());
            if s != state(seq.wrapping_add(1), 0) {
                let owner = s as u32;
                if (s >> 32) as u32 == seq && owner != 0 {
                    return (
                        n,
                        Head::Busy {
                            sender_id: owner - 1,
                        },
                    );
                }
                return (n, Head::Empty);
            }
            let (sender, len) = m.meta(i);
            // A corrupt length is clamped: the slot bounds are never passed.
            let len = (len as usize).min(m.max_frame());
            // SAFETY: the ready state was acquired, so the bytes are
            // published; `len` is clamped to the slot, and no producer
            // writes the slot until we free it below.
            unsafe { m.read(i, len, |bytes| f(sender, bytes)) };
            // SYNC: pairs with the producers' Acquire load (and CAS) of the
            // state in `try_send`: our reads happen before their writes.
            m.state_store(
                i,
                state(seq.wrapping_add(m.mask() as u32 + 1), 0),
                Ordering::Release,
            );
            *head = t + 1;
            n += 1;
        }
        (n, Head::Empty)
    }

    /// Frees the busy head slot `*head` of a producer that died before
    /// publishing it, if it is still busy by `sender_id`; returns whether it
    /// did.
    pub(crate) fn recycle(&self, head: &mut u64, sender_id: u32) -> bool {
        let m = &self.mem;
        let t = *head;
        let seq = lap(t, m.mask());
        // SYNC: the CAS's Release pairs with the producers' Acquire load of
        // the state (as for the free store in `poll`).
        let freed = m
            .state_cas(
                self.idx(t),
                state(seq, sender_id + 1),
                state(seq.wrapping_add(m.mask() as u32 + 1), 0),
                Ordering::Release,
                Ordering::Relaxed,
                false,
            )
            .is_ok();
        if freed {
            *head = t + 1;
        }
        freed
    }

    /// Marks ticket `ticket`'s slot as reserved by `sender_id` and not
    /// published, as a producer that died mid-write leaves it.
    #[cfg(test)]
    pub(crate) fn reserve_for_test(&self, ticket: u64, sender_id: u32) {
        let seq = lap(ticket, self.mem.mask());
        let ok = self
            .mem
            .state_cas(
                self.idx(ticket),
                state(seq, 0),
                state(seq, sender_id + 1),
                Ordering::Acquire,
                Ordering::Relaxed,
                false,
            )
            .is_ok();
        assert!(ok, "slot of ticket {ticket} is not free");
    }

    /// The owner of ticket `ticket`'s slot if it is reserved and unpublished.
    #[cfg(test)]
    pub(crate) fn busy_owner(&self, ticket: u64) -> Option<u32> {
        let s = self.mem.state_load(self.idx(ticket), Ordering::Acquire);
        ((s >> 32) as u32 == lap(ticket, self.mem.mask()) && s as u32 != 0).then(|| s as u32 - 1)
    }
}

/// A pause in a producer's retry loop (a yield under loom, which must see threads
/// give way).
#[inline(always)]
fn spin() {
    #[cfg(all(test, loom))]
    loom::thread::yield_now();
    #[cfg(not(all(test, loom)))]
    core::hint::spin_loop();
}

/// A loom model of the queue: the real [`Queue`] logic over slots made of loom atomics
/// and checked cells (a frame's bytes read before their publication, or written while
/// the consumer reads them, is a reported race). Run with
/// `RUSTFLAGS="--cfg loom" cargo test -p weft-shm --lib --release loom`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicU32, AtomicU64};
    use loom::sync::Arc;

    const SLOTS: usize = 2;
    const MAX: usize = 4;

    struct LoomSlots {
        state: Vec<AtomicU64>,
        sender: Vec<AtomicU32>,
        len: Vec<AtomicU32>,
        data: Vec<UnsafeCell<[u8; MAX]>>,
        pos: AtomicU64,
    }

    fn queue() -> Queue<Arc<LoomSlots>> {
        Queue {
            mem: Arc::new(LoomSlots {
                state: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
                sender: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
                len: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
                data: (0..SLOTS).map(|_| UnsafeCell::new([0; MAX])).collect(),
                pos: AtomicU64::new(0),
            }),
        }
    }

    // SAFETY: indices below SLOTS; the cells check the owners' accesses.
    unsafe impl QueueMem for Arc<LoomSlots> {
        fn mask(&self) -> u64 {
            SLOTS as u64 - 1
        }
        fn max_frame(&self) -> usize {
            MAX
        }
        fn state_load(&self, i: usize, o: Ordering) -> u64 {
            self.state[i].load(o)
        }
        fn state_store(&self, i: usize, v: u64, o: Ordering) {
            self.state[i].store(v, o)
        }
        fn state_cas(
            &self,
            i: usize,
            cur: u64,
            new: u64,
            ok: Ordering,
            fail: Ordering,
            weak: bool,
        ) -> Result<u64, u64> {
            if weak {
                self.state[i].compare_exchange_weak(cur, new, ok, fail)
            } else {
                self.state[i].compare_exchange(cur, new, ok, fail)
            }
        }
        fn set_meta(&self, i: usize, sender: u32, len: u32) {
            self.sender[i].store(sender, Ordering::Relaxed);
            self.len[i].store(len, Ordering::Relaxed);
        }
        fn meta(&self, i: usize) -> (u32, u32) {
            (
                self.sender[i].load(Ordering::Relaxed),
                self.len[i].load(Ordering::Relaxed),
            )
        }
        fn pos_load(&self, o: Ordering) -> u64 {
            self.pos.load(o)
        }
        fn pos_cas(&self, cur: u64, new: u64) {
            let _ = self
                .pos
                .compare_exchange(cur, new, Ordering::Relaxed, Ordering::Relaxed);
        }
        unsafe fn write(&self, i: usize, a: &[u8], b: &[u8]) {
            // SAFETY: loom checks that this access does not race the consumer's.
            self.data[i].with_mut(|p| {
                // SAFETY: the cell's pointer is valid for the model's life.
                let d = unsafe { &mut *p };
                d[..a.len()].copy_from_slice(a);
                d[a.len()..a.len() + b.len()].copy_from_slice(b);
            })
        }
        unsafe fn read<R>(&self, i: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
            // SAFETY: loom checks that this access does not race a producer's.
            self.data[i].with(|p| {
                // SAFETY: the cell's pointer is valid for the model's life.
                let d = unsafe { &*p };
                f(&d[..len])
            })
        }
    }

    fn send(q: &Queue<Arc<LoomSlots>>, sender: u32, frame: &[u8]) {
        while !q.try_send(sender, &frame[..1], &frame[1..]) {
            loom::thread::yield_now();
        }
    }

    /// Receives `want` frames, yielding while none is there.
    fn receive(q: &Queue<Arc<LoomSlots>>, head: &mut u64, want: usize) -> Vec<(u32, Vec<u8>)> {
        let mut got = Vec::new();
        while got.len() < want {
            let (n, _) = q.poll(head, 4, |s, bytes| got.push((s, bytes.to_vec())));
            if n == 0 {
                loom::thread::yield_now();
            }
        }
        got
    }

    /// Two producers race for the slots: each frame arrives once, intact, from its
    /// sender, and nothing more.
    #[test]
    fn loom_two_producers_deliver_each_frame_once() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.check(|| {
            let q = queue();
            let (qa, qb) = (q.clone(), q.clone());
            let a = loom::thread::spawn(move || send(&qa, 0, &[0xa0, 1]));
            let b = loom::thread::spawn(move || send(&qb, 1, &[0xb0, 2, 3]));
            let mut head = 0;
            let mut got = receive(&q, &mut head, 2);
            a.join().unwrap();
            b.join().unwrap();
            got.sort();
            assert_eq!(got, [(0, vec![0xa0, 1]), (1, vec![0xb0, 2, 3])]);
            let (n, head_state) = q.poll(&mut head, 4, |_, _| {});
            assert_eq!((n, head_state), (0, Head::Empty), "nothing more");
        });
    }

    /// One producer sends three frames through two slots while the consumer takes them:
    /// a slot is reused only once consumed, and the frames arrive in order, intact.
    #[test]
    fn loom_slots_are_reused_in_order() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let q = queue();
            let qa = q.clone();
            let a = loom::thread::spawn(move || {
                send(&qa, 0, &[1, 1]);
                send(&qa, 0, &[2, 2, 2]);
                send(&qa, 0, &[3]);
            });
            let mut head = 0;
            let got = receive(&q, &mut head, 3);
            a.join().unwrap();
            assert_eq!(
                got,
                [(0, vec![1, 1]), (0, vec![2, 2, 2]), (0, vec![3])],
                "in order, intact"
            );
        });
    }

    /// A producer that died holding the head slot (reserved, never published, the hint
    /// not moved): a live producer skips it, the consumer sees it busy by the dead
    /// sender, recycles it, and then gets the live producer's frame.
    #[test]
    fn loom_a_dead_producers_slot_is_skipped_and_recycled() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let q = queue();
            q.reserve_for_test(0, 5);
            let qa = q.clone();
            let a = loom::thread::spawn(move || send(&qa, 0, &[0xa0, 7]));
            let mut head = 0;
            let mut got = Vec::new();
            let mut recycled = false;
            while got.is_empty() {
                let (n, h) = q.poll(&mut head, 4, |s, bytes| got.push((s, bytes.to_vec())));
                if h == (Head::Busy { sender_id: 5 }) {
                    assert!(!recycled, "the dead producer's slot came back");
                    recycled = q.recycle(&mut head, 5);
                    assert!(recycled, "a busy slot of the dead producer is recycled");
                } else if n == 0 {
                    loom::thread::yield_now();
                }
            }
            a.join().unwrap();
            assert!(recycled, "the dead producer's slot was recycled");
            assert_eq!(got, [(0, vec![0xa0, 7])]);
        });
    }
}

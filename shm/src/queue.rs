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

use core::sync::atomic::{AtomicU64, Ordering};

use crate::layout::{QueueProducerLine, QueueSlotHeader, QUEUE_SLOT_HEADER_BYTES};

/// The shared queue inside a mapped inbox segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShmQueue {
    /// First slot.
    base: *mut u8,
    /// The producers' shared line.
    producer: *const QueueProducerLine,
    slot_bytes: usize,
    mask: u64,
    max_frame: usize,
}

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
        ShmQueue {
            base,
            producer,
            slot_bytes,
            mask: slots - 1,
            max_frame: slot_bytes - QUEUE_SLOT_HEADER_BYTES,
        }
    }

    /// Largest frame a slot carries.
    pub(crate) fn max_frame(&self) -> usize {
        self.max_frame
    }

    #[inline(always)]
    fn slot(&self, ticket: u64) -> (&QueueSlotHeader, *mut u8) {
        let idx = (ticket & self.mask) as usize;
        // SAFETY: idx < slots, so the slot lies inside the queue (contract
        // of `new`); its header is 64-byte aligned and made of atomics.
        unsafe {
            let p = self.base.add(idx * self.slot_bytes);
            (
                &*p.cast::<QueueSlotHeader>(),
                p.add(QUEUE_SLOT_HEADER_BYTES),
            )
        }
    }

    #[inline(always)]
    fn enqueue_pos(&self) -> &AtomicU64 {
        // SAFETY: contract of `new`; the field is an atomic.
        unsafe { &(*self.producer).enqueue_pos }
    }

    /// Sends `a ++ b` from `sender_id`; false (nothing written) if the queue
    /// is full.
    #[inline]
    pub(crate) fn try_send(&self, sender_id: u32, a: &[u8], b: &[u8]) -> bool {
        let len = a.len() + b.len();
        assert!(
            len <= self.max_frame,
            "queue frame of {len} bytes exceeds max_frame {}",
            self.max_frame
        );
        let pos = self.enqueue_pos();
        let owner = sender_id + 1;
        loop {
            // Relaxed: only a hint; the slot's state decides.
            let t = pos.load(Ordering::Relaxed);
            let (slot, data) = self.slot(t);
            // SYNC: pairs with the consumer's Release store freeing the slot
            // in `poll` (and `recycle`): its reads happen before our writes.
            let s = slot.state.load(Ordering::Acquire);
            let seq = (s >> 32) as u32;
            let diff = seq.wrapping_sub(lap(t, self.mask)) as i32;
            if diff == 0 && s as u32 == 0 {
                // SYNC: Acquire on success pairs with the consumer's Release
                // store that freed the slot (as for the load above).
                if slot
                    .state
                    .compare_exchange_weak(
                        s,
                        state(seq, owner),
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_err()
                {
                    continue;
                }
                // Relaxed: a hint; failure means someone helped already.
                let _ = pos.compare_exchange(t, t + 1, Ordering::Relaxed, Ordering::Relaxed);
                slot.sender.store(sender_id, Ordering::Relaxed);
                slot.len.store(len as u32, Ordering::Relaxed);
                // SAFETY: we own the slot (reserved by the CAS above) and
                // `len <= max_frame` fits after its header. The consumer
                // reads the bytes only after acquiring the ready state below.
                unsafe {
                    core::ptr::copy_nonoverlapping(a.as_ptr(), data, a.len());
                    core::ptr::copy_nonoverlapping(b.as_ptr(), data.add(a.len()), b.len());
                }
                // SYNC: pairs with the consumer's Acquire load of the state
                // in `poll`: publishes sender, len and bytes.
                slot.state.store(state(seq + 1, 0), Ordering::Release);
                return true;
            } else if diff < 0 {
                // The slot still holds the previous lap: full.
                return false;
            } else {
                // Ticket t is taken: reserved (busy), published, or already
                // consumed (the slot is on a later lap; e.g. its producer
                // died before moving the hint and the slot was recycled).
                // Help move the hint on. Relaxed: the slot states carry the
                // data.
                let _ = pos.compare_exchange(t, t + 1, Ordering::Relaxed, Ordering::Relaxed);
            }
            core::hint::spin_loop();
        }
    }

    /// Whether the slot of ticket `head` is empty (no frame, no writer):
    /// one Relaxed load, for spinning on.
    #[inline(always)]
    pub(crate) fn quiet(&self, head: u64) -> bool {
        let (slot, _) = self.slot(head);
        // Relaxed: a hint; `poll` acquires what it delivers.
        slot.state.load(Ordering::Relaxed) == state(lap(head, self.mask), 0)
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
        let mut n = 0;
        while n < budget {
            let t = *head;
            let (slot, data) = self.slot(t);
            // SYNC: pairs with the producer's Release store of the ready
            // state in `try_send`.
            let s = slot.state.load(Ordering::Acquire);
            let seq = lap(t, self.mask);
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
            let sender = slot.sender.load(Ordering::Relaxed);
            // A corrupt length is clamped: the slot bounds are never passed.
            let len = (slot.len.load(Ordering::Relaxed) as usize).min(self.max_frame);
            // SAFETY: the ready state was acquired, so the bytes are
            // published; they lie inside the slot (len clamped) and no
            // producer writes the slot until we free it below.
            f(sender, unsafe { core::slice::from_raw_parts(data, len) });
            // SYNC: pairs with the producers' Acquire load (and CAS) of the
            // state in `try_send`: our reads happen before their writes.
            slot.state.store(
                state(seq.wrapping_add(self.mask as u32 + 1), 0),
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
        let t = *head;
        let (slot, _) = self.slot(t);
        let seq = lap(t, self.mask);
        // SYNC: the CAS's Release pairs with the producers' Acquire load of
        // the state (as for the free store in `poll`).
        let freed = slot
            .state
            .compare_exchange(
                state(seq, sender_id + 1),
                state(seq.wrapping_add(self.mask as u32 + 1), 0),
                Ordering::Release,
                Ordering::Relaxed,
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
        let (slot, _) = self.slot(ticket);
        let seq = lap(ticket, self.mask);
        let ok = slot
            .state
            .compare_exchange(
                state(seq, 0),
                state(seq, sender_id + 1),
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok();
        assert!(ok, "slot of ticket {ticket} is not free");
    }

    /// The owner of ticket `ticket`'s slot if it is reserved and unpublished.
    #[cfg(test)]
    pub(crate) fn busy_owner(&self, ticket: u64) -> Option<u32> {
        let (slot, _) = self.slot(ticket);
        let s = slot.state.load(Ordering::Acquire);
        ((s >> 32) as u32 == lap(ticket, self.mask) && s as u32 != 0).then(|| s as u32 - 1)
    }
}

//! Split-copy claims: who copies the second part of a large message that its receiver
//! and its sender copy together (the fabric's split single-copy rendezvous).
//!
//! The receiver opens a claim word in its inbox segment and tells the sender (slot and
//! generation); then whichever side takes the word first with one compare-and-swap copies
//! that part: the sender when it gets to it, or the receiver when the sender is late (busy
//! outside any call, stopped, gone). Neither waits for the other to agree, and the part is
//! never copied twice, so a late sender can never write into a buffer the receiver has
//! already handed back to its program.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::layout::{CLAIM_OPEN, CLAIM_RECEIVER, CLAIM_SENDER, CLAIM_SLOTS};
use crate::segment::Keepalive;

/// One open claim: its slot and generation (what the receiver sends the sender).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// Index of the claim word.
    pub slot: u32,
    /// Generation of this use of the word (62 bits, never 0).
    pub generation: u64,
}

impl Claim {
    fn word(self, state: u64) -> u64 {
        (self.generation << 2) | state
    }
}

/// The receiver's claim words (one table per inbox: it hands the words out).
pub struct ClaimTable {
    words: *const AtomicU64,
    _keep: Keepalive,
    free: Vec<u32>,
    gens: Vec<u64>,
}

// SAFETY: `words` points into the mapping `_keep` keeps alive, whatever the thread; the
// words are atomics, and the free list is plain owned data.
unsafe impl Send for ClaimTable {}

impl std::fmt::Debug for ClaimTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimTable")
            .field("free", &self.free.len())
            .finish_non_exhaustive()
    }
}

impl ClaimTable {
    /// # Safety
    ///
    /// `words` must point to [`CLAIM_SLOTS`] 8-byte aligned words inside the mapping
    /// `keep` holds.
    pub(crate) unsafe fn new(words: *const AtomicU64, keep: Keepalive) -> ClaimTable {
        ClaimTable {
            words,
            _keep: keep,
            free: (0..CLAIM_SLOTS as u32).rev().collect(),
            gens: vec![0; CLAIM_SLOTS],
        }
    }

    fn word(&self, slot: u32) -> &AtomicU64 {
        debug_assert!((slot as usize) < CLAIM_SLOTS);
        // SAFETY: slot < CLAIM_SLOTS (slots come from this table), inside the mapping
        // (contract of `new`), which `_keep` keeps alive.
        unsafe { &*self.words.add(slot as usize) }
    }

    /// Opens a claim, or `None` when every word is in use (the caller copies alone).
    pub fn open(&mut self) -> Option<Claim> {
        let slot = self.free.pop()?;
        let g = &mut self.gens[slot as usize];
        *g = (*g + 1) & ((1 << 62) - 1);
        if *g == 0 {
            *g = 1;
        }
        let c = Claim {
            slot,
            generation: *g,
        };
        // Release: published before the message that names it (which the sender reads
        // with Acquire through the transport).
        self.word(slot).store(c.word(CLAIM_OPEN), Ordering::Release);
        Some(c)
    }

    /// Takes `c` for the receiver: true if the sender had not taken it (the receiver
    /// copies), false if it had (the sender copies, or has copied).
    pub fn take(&self, c: Claim) -> bool {
        self.word(c.slot)
            .compare_exchange(
                c.word(CLAIM_OPEN),
                c.word(CLAIM_RECEIVER),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Gives the word back once the split is over (both parts accounted for).
    pub fn close(&mut self, c: Claim) {
        if (c.slot as usize) < CLAIM_SLOTS && !self.free.contains(&c.slot) {
            self.free.push(c.slot);
        }
    }
}

/// Takes claim word `slot` of generation `generation` for the sender (`words`: the
/// inbox's claim words): true if it was open, so the sender copies. A slot out of range
/// or a stale generation is false.
pub(crate) fn take_for_sender(words: *const AtomicU64, slot: u32, generation: u64) -> bool {
    if slot as usize >= CLAIM_SLOTS || generation == 0 || generation >= 1 << 62 {
        return false;
    }
    let c = Claim { slot, generation };
    // SAFETY: the caller passes the claim words of a mapped inbox; slot < CLAIM_SLOTS.
    let w = unsafe { &*words.add(slot as usize) };
    w.compare_exchange(
        c.word(CLAIM_OPEN),
        c.word(CLAIM_SENDER),
        Ordering::AcqRel,
        Ordering::Acquire,
    )
    .is_ok()
}

#[cfg(test)]
mod tests {
    use crate::{Inbox, InboxConfig, Outbox};

    #[test]
    fn exactly_one_side_takes_each_claim() {
        let name = format!("/weft-test-{}-claims", std::process::id());
        let inbox = Inbox::create(&name, &InboxConfig::default()).unwrap();
        let out = Outbox::connect(&name, 1).unwrap();
        let mut table = inbox.claim_table();
        // The sender first: the receiver then finds it taken.
        let a = table.open().unwrap();
        assert!(out.claim_for_sender(a.slot, a.generation));
        assert!(!table.take(a));
        assert!(!out.claim_for_sender(a.slot, a.generation), "taken twice");
        // The receiver first: the late sender finds it taken.
        let b = table.open().unwrap();
        assert_ne!(a.slot, b.slot);
        assert!(table.take(b));
        assert!(!out.claim_for_sender(b.slot, b.generation));
        // A reused word has a new generation: an answer to its last use is stale.
        table.close(a);
        table.close(b);
        let c = table.open().unwrap();
        assert_eq!(c.slot, b.slot);
        assert_ne!(c.generation, b.generation);
        assert!(
            !out.claim_for_sender(b.slot, b.generation),
            "stale generation"
        );
        assert!(!out.claim_for_sender(c.slot, 0));
        assert!(!out.claim_for_sender(crate::layout::CLAIM_SLOTS as u32, c.generation));
        assert!(out.claim_for_sender(c.slot, c.generation));
        // Every word handed out at once, then none left.
        let mut t2 = inbox.claim_table();
        let all: Vec<_> = std::iter::from_fn(|| t2.open()).collect();
        assert_eq!(all.len(), crate::layout::CLAIM_SLOTS);
    }
}

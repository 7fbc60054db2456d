//! The node-local collective segment: one per communicator whose members share a node.
//! Each member owns one 256-byte line ([`CollLine`]: per parity, in one 64-byte half, its
//! sequence number, a word and a small inline payload; then its two words of the
//! release/gather tree, [`CollSegment::up`] and [`CollSegment::down`]) and two cells of
//! [`COLL_CELL_BYTES`] for larger payloads. A member writes only its own line and cells;
//! the others read them after an Acquire load of its sequence number (one writer per
//! line, as Open MPI's coll/xhc and MPICH's release/gather collectives do).
//!
//! Each member also owns a ring of [`CollSegment::RING_SLOTS`] slots for small bcasts
//! it roots (see [`CollRingSlot`]): the root writes slot `k % RING_SLOTS` of operation `k`
//! and stamps it, the others read it and say so in their `done` word, so the root can
//! run ahead of members that wait for a CPU.
//!
//! The creator (member 0) creates and publishes the segment; the others open it once
//! they know it exists (the collective library tells them, with a message), and the
//! creator unlinks the name once every member has it mapped, so nothing is left behind
//! when a process dies. (The name lives under the job's segment prefix, so its server
//! removes it in the short window before that, too.)

use core::sync::atomic::Ordering;

use crate::layout::{
    coll_cells_offset, coll_rings_offset, coll_segment_bytes, CollHeader, CollLine, CollRingSlot,
    COLL_CELL_BYTES, COLL_HEADER_OFFSET, COLL_INLINE, COLL_LINES_OFFSET, COLL_RING_INLINE,
    COLL_RING_SLOTS,
};
use crate::segment::{SegmentError, SegmentKind, SharedSegment, WritableSegment};

/// The mapping held (created here, or opened).
#[derive(Debug)]
enum Held {
    Created(WritableSegment),
    Opened(SharedSegment),
}

/// A node-local collective segment, mapped read-write (see the module's documentation).
#[derive(Debug)]
pub struct CollSegment {
    held: Held,
    base: *mut u8,
    members: usize,
    me: usize,
}

// SAFETY: the mapping is plain shared memory, not tied to a thread; every access goes
// through atomics or through the one-writer protocol of the methods below.
unsafe impl Send for CollSegment {}
// SAFETY: as above; `&CollSegment` methods only load atomics, store this member's own
// line (one writer), or copy payloads under the protocol's happens-before edges.
unsafe impl Sync for CollSegment {}

impl CollSegment {
    /// Bytes a member may put inline in its line (per parity).
    pub const INLINE: usize = COLL_INLINE;
    /// Bytes of a member's cell (per parity).
    pub const CELL: usize = COLL_CELL_BYTES;
    /// Slots of a member's bcast ring.
    pub const RING_SLOTS: usize = COLL_RING_SLOTS;
    /// Payload bytes of a ring slot.
    pub const RING_INLINE: usize = COLL_RING_INLINE;
    /// The bit of a sequence word that says its member gave up (see [`Self::abort`]).
    pub const ABORTED: u64 = 1 << 63;

    /// Creates and publishes segment `name` for `members` (this process is member 0).
    pub fn create(name: &str, members: usize) -> Result<CollSegment, SegmentError> {
        let seg = WritableSegment::create(name, coll_segment_bytes(members), SegmentKind::COLL)?;
        let base = seg.as_ptr();
        // SAFETY: the header lies inside the fresh mapping (its size is at least
        // `coll_segment_bytes`), aligned (offset 64 of a page-aligned mapping), and no
        // other process maps the segment before `publish`.
        let hdr = unsafe { &*base.add(COLL_HEADER_OFFSET).cast::<CollHeader>() };
        // Relaxed: published by the Release store of `publish`. The lines start zeroed
        // (a fresh shm object reads as zeros).
        hdr.members.store(members as u32, Ordering::Relaxed);
        hdr.cell_bytes
            .store(COLL_CELL_BYTES as u64, Ordering::Relaxed);
        seg.publish();
        Ok(CollSegment {
            held: Held::Created(seg),
            base,
            members,
            me: 0,
        })
    }

    /// Opens segment `name` as member `me` of `members`, checking it was made for as many.
    pub fn open(name: &str, members: usize, me: usize) -> Result<CollSegment, SegmentError> {
        let seg = SharedSegment::open(name, SegmentKind::COLL)?;
        let bad = |reason: String| SegmentError::InvalidConfig {
            name: name.to_owned(),
            reason,
        };
        if seg.bytes() < coll_segment_bytes(members) || me >= members {
            return Err(bad(format!(
                "{} bytes for member {me} of {members} (needs {})",
                seg.bytes(),
                coll_segment_bytes(members)
            )));
        }
        let base = seg.as_ptr();
        // SAFETY: inside the validated mapping (checked size above), aligned.
        let hdr = unsafe { &*base.add(COLL_HEADER_OFFSET).cast::<CollHeader>() };
        // Relaxed: `SharedSegment::open` acquired the segment's published state.
        let (m, c) = (
            hdr.members.load(Ordering::Relaxed) as usize,
            hdr.cell_bytes.load(Ordering::Relaxed) as usize,
        );
        if m != members || c != COLL_CELL_BYTES {
            return Err(bad(format!(
                "made for {m} members with cells of {c} bytes, not {members} and {COLL_CELL_BYTES}"
            )));
        }
        Ok(CollSegment {
            held: Held::Opened(seg),
            base,
            members,
            me,
        })
    }

    /// Removes the segment's name (every member has it mapped): the memory lives until
    /// the last member unmaps it.
    pub fn unlink(&self) -> Result<(), SegmentError> {
        let name = match &self.held {
            Held::Created(s) => s.name(),
            Held::Opened(s) => s.name(),
        };
        crate::segment::unlink(name)
    }

    /// Members of the segment.
    pub fn members(&self) -> usize {
        self.members
    }

    fn line(&self, r: usize) -> &CollLine {
        assert!(r < self.members, "member {r} of {}", self.members);
        // SAFETY: line r lies inside the mapping (r < members, size checked at create or
        // open), 128-byte aligned (page-aligned base + 128 + r * 256); its fields are
        // atomics or only accessed by the protocol's methods.
        unsafe {
            &*self
                .base
                .add(COLL_LINES_OFFSET + r * core::mem::size_of::<CollLine>())
                .cast::<CollLine>()
        }
    }

    /// Member `r`'s sequence word of `parity`: the last stage it entered in an
    /// operation of that parity, with [`Self::ABORTED`] set once it gave up on the
    /// segment (Acquire: what it wrote before is visible).
    #[inline]
    pub fn seq(&self, r: usize, parity: u64) -> u64 {
        // SYNC: pairs with the Release stores in `enter` and `abort`.
        self.line(r).half[(parity & 1) as usize]
            .seq
            .load(Ordering::Acquire)
    }

    /// Member `r`'s word of `parity` (its payload length and whatever else the caller
    /// packs in it), read after seeing its [`seq`](Self::seq) pass the stage that
    /// published it.
    #[inline]
    pub fn word(&self, r: usize, parity: u64) -> u64 {
        // Relaxed: ordered by the Acquire load of `seq` before it.
        self.line(r).half[(parity & 1) as usize]
            .word
            .load(Ordering::Relaxed)
    }

    /// Sets this member's word of `parity`, published by the next
    /// [`enter`](Self::enter). The same protocol as [`put`](Self::put).
    #[inline]
    pub fn set_word(&self, parity: u64, word: u64) {
        // Relaxed: published by the Release store of `enter`.
        self.line(self.me).half[(parity & 1) as usize]
            .word
            .store(word, Ordering::Relaxed);
    }

    /// This member enters stage `seq` of an operation of `parity` (Release: its
    /// payload and word of that parity are visible to whoever sees it).
    #[inline]
    pub fn enter(&self, parity: u64, seq: u64) {
        // SYNC: pairs with the Acquire load in `seq`.
        self.line(self.me).half[(parity & 1) as usize]
            .seq
            .store(seq, Ordering::Release);
    }

    /// Marks this member as gone from the segment ([`Self::ABORTED`] in both sequence
    /// words and its tree words): whoever waits for it sees that instead of waiting.
    pub fn abort(&self) {
        let line = self.line(self.me);
        for w in [
            &line.half[0].seq,
            &line.half[1].seq,
            &line.tree.up,
            &line.tree.down,
        ] {
            // Relaxed: only this member writes its words.
            let s = w.load(Ordering::Relaxed);
            // SYNC: pairs with the Acquire loads in `seq`, `up` and `down`.
            w.store(s | Self::ABORTED, Ordering::Release);
        }
    }

    /// Member `r`'s gather word in the release/gather tree: the last stage by which it
    /// and its whole subtree had arrived, with [`Self::ABORTED`] once it gave up
    /// (Acquire: what they all wrote before is visible).
    #[inline]
    pub fn up(&self, r: usize) -> u64 {
        // SYNC: pairs with the Release stores in `set_up` and `abort`.
        self.line(r).tree.up.load(Ordering::Acquire)
    }

    /// Says that this member and its whole subtree arrived at `stage` (after seeing its
    /// children's [`up`](Self::up) reach it).
    #[inline]
    pub fn set_up(&self, stage: u64) {
        // SYNC: pairs with the Acquire load in `up`.
        self.line(self.me).tree.up.store(stage, Ordering::Release);
    }

    /// Member `r`'s release word: the last stage it saw released, with
    /// [`Self::ABORTED`] once it gave up (Acquire).
    #[inline]
    pub fn down(&self, r: usize) -> u64 {
        // SYNC: pairs with the Release stores in `set_down` and `abort`.
        self.line(r).tree.down.load(Ordering::Acquire)
    }

    /// Releases `stage` to this member's children (after the root's gather completed
    /// it, seen through this member's parent).
    #[inline]
    pub fn set_down(&self, stage: u64) {
        // SYNC: pairs with the Acquire load in `down`.
        self.line(self.me).tree.down.store(stage, Ordering::Release);
    }

    fn ring_slot(&self, r: usize, op: u64) -> &CollRingSlot {
        assert!(r < self.members, "member {r} of {}", self.members);
        let s = (op % COLL_RING_SLOTS as u64) as usize;
        // SAFETY: the slot lies inside the mapping (r < members, size checked at create
        // or open), 64-byte aligned (the rings' offset is 128 past a multiple of 256, and
        // slots are 256 bytes); its atomics are read by anyone, its payload written only
        // by member r under the ring's protocol.
        unsafe {
            &*self
                .base
                .add(
                    coll_rings_offset(self.members)
                        + (r * COLL_RING_SLOTS + s) * core::mem::size_of::<CollRingSlot>(),
                )
                .cast::<CollRingSlot>()
        }
    }

    /// Writes operation `op`'s bcast payload and word into this member's ring and stamps
    /// the slot (Release). The caller keeps the protocol: every other member returned
    /// from operation `op - RING_SLOTS` (its [`done`](Self::done) or its stage says so).
    pub fn ring_put(&self, op: u64, word: u64, data: &[u8]) {
        assert!(
            data.len() <= COLL_RING_INLINE,
            "ring payload of {} bytes",
            data.len()
        );
        let slot = self.ring_slot(self.me, op);
        // SAFETY: the payload has room (asserted); only this member writes its ring, and
        // by the protocol nobody reads this slot until the stamp below.
        unsafe {
            core::ptr::copy_nonoverlapping(
                data.as_ptr(),
                slot.payload.as_ptr().cast_mut(),
                data.len(),
            );
        }
        // Relaxed: published by the Release store of the stamp.
        slot.word.store(word, Ordering::Relaxed);
        // SYNC: pairs with the Acquire load in `ring_stamp`.
        slot.stamp.store(op + 1, Ordering::Release);
    }

    /// The stamp of member `r`'s ring slot for operation `op`: `op + 1` once it holds
    /// that operation (Acquire: its word and payload are visible then).
    #[inline]
    pub fn ring_stamp(&self, r: usize, op: u64) -> u64 {
        // SYNC: pairs with the Release store in `ring_put`.
        self.ring_slot(r, op).stamp.load(Ordering::Acquire)
    }

    /// Member `r`'s ring word for operation `op`, read after its stamp said `op + 1`.
    #[inline]
    pub fn ring_word(&self, r: usize, op: u64) -> u64 {
        // Relaxed: ordered by the Acquire load of the stamp before it.
        self.ring_slot(r, op).word.load(Ordering::Relaxed)
    }

    /// Member `r`'s ring payload for operation `op`, read after its stamp said `op + 1`
    /// (the root does not rewrite it before this member says it is done with it).
    pub fn ring_get(&self, r: usize, op: u64, out: &mut [u8]) {
        assert!(
            out.len() <= COLL_RING_INLINE,
            "ring payload of {} bytes",
            out.len()
        );
        let slot = self.ring_slot(r, op);
        // SAFETY: the payload holds `out.len()` bytes (asserted); written before the
        // stamp the caller acquired, and stable until the caller says it is done.
        unsafe {
            core::ptr::copy_nonoverlapping(slot.payload.as_ptr(), out.as_mut_ptr(), out.len());
        }
    }

    /// Member `r`'s done word: the operations whose ring slot it finished reading
    /// (Acquire: its reads came before).
    #[inline]
    pub fn done(&self, r: usize) -> u64 {
        // SYNC: pairs with the Release store in `set_done`.
        self.line(r).tree.done.load(Ordering::Acquire)
    }

    /// Says this member finished reading the ring slot of every operation before `ops`.
    #[inline]
    pub fn set_done(&self, ops: u64) {
        // SYNC: pairs with the Acquire load in `done`.
        self.line(self.me).tree.done.store(ops, Ordering::Release);
    }

    /// Where member `r`'s payload of `parity` lives: inline for up to [`Self::INLINE`]
    /// bytes, else its cell.
    fn payload(&self, r: usize, parity: u64, len: usize) -> *mut u8 {
        assert!(len <= COLL_CELL_BYTES, "payload of {len} bytes");
        let p = (parity & 1) as usize;
        if len <= COLL_INLINE {
            self.line(r).half[p].inline.as_ptr().cast_mut()
        } else {
            // SAFETY: the cell lies inside the mapping (r < members).
            unsafe {
                self.base
                    .add(coll_cells_offset(self.members) + (2 * r + p) * COLL_CELL_BYTES)
            }
        }
    }

    /// Writes this member's payload of `parity` (before [`enter`](Self::enter)). The
    /// caller keeps the protocol: it entered operation `seq - 1` and saw every member
    /// enter it, so nobody still reads this parity's payload of operation `seq - 2`.
    pub fn put(&self, parity: u64, data: &[u8]) {
        let dst = self.payload(self.me, parity, data.len());
        // SAFETY: `dst` has room for `data` (inline or cell, checked in `payload`); only
        // this member writes its payloads, and by the protocol no member reads this one
        // now.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
    }

    /// Member `r`'s payload of `parity`, read after seeing its [`seq`](Self::seq) reach
    /// the operation (so its writes are visible, and it will not rewrite them before
    /// this member enters the next operation).
    pub fn get(&self, r: usize, parity: u64, out: &mut [u8]) {
        let src = self.payload(r, parity, out.len());
        // SAFETY: `src` holds `out.len()` bytes (checked in `payload`); its writer
        // finished them before its Release store of `seq`, which the caller acquired,
        // and will not write them again before the caller enters its next operation.
        unsafe { core::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
    }

    /// Bytes `offset..offset + out.len()` of member `r`'s payload of `parity`, which
    /// holds `len` bytes (what decides inline or cell); as [`get`](Self::get).
    pub fn get_at(&self, r: usize, parity: u64, len: usize, offset: usize, out: &mut [u8]) {
        assert!(
            offset.checked_add(out.len()).is_some_and(|end| end <= len),
            "bytes {offset}+{} of a payload of {len}",
            out.len()
        );
        let src = self.payload(r, parity, len);
        // SAFETY: `src` holds `len` bytes (checked in `payload`) and the range lies
        // inside them (asserted above); published and stable as for `get`.
        unsafe { core::ptr::copy_nonoverlapping(src.add(offset), out.as_mut_ptr(), out.len()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_words_are_per_member_and_carry_the_abort_bit() {
        let name = format!("/weft-test-{}-colltree", std::process::id());
        let a = CollSegment::create(&name, 3).unwrap();
        let b = CollSegment::open(&name, 3, 2).unwrap();
        a.unlink().unwrap();
        assert_eq!((b.up(0), b.down(0), a.up(2)), (0, 0, 0));
        a.set_up(6);
        b.set_down(9);
        assert_eq!((b.up(0), b.down(0)), (6, 0), "member 0's words");
        assert_eq!((a.up(2), a.down(2)), (0, 9), "member 2's words");
        assert_eq!(
            a.seq(0, 0) | a.seq(0, 1),
            0,
            "the tree words are not the sequences"
        );
        b.abort();
        assert_eq!(a.up(2), CollSegment::ABORTED);
        assert_eq!(a.down(2), 9 | CollSegment::ABORTED);
        assert_eq!((a.up(1), a.down(1)), (0, 0), "member 1 untouched");
    }

    #[test]
    fn two_members_exchange_inline_and_cell_payloads_by_parity() {
        let name = format!("/weft-test-{}-coll", std::process::id());
        let a = CollSegment::create(&name, 2).unwrap();
        let b = CollSegment::open(&name, 2, 1).unwrap();
        a.unlink().unwrap();
        assert!(CollSegment::open(&name, 2, 1).is_err(), "unlinked");
        assert_eq!((a.seq(1, 1), b.seq(0, 1)), (0, 0));
        let big = vec![7u8; 1000];
        a.put(1, &big);
        a.set_word(1, 1000);
        a.enter(1, 1);
        b.put(1, b"hello");
        b.set_word(1, 5);
        b.enter(1, 1);
        assert_eq!((b.seq(0, 1), b.word(0, 1)), (1, 1000));
        assert_eq!((b.seq(0, 0), b.word(0, 0)), (0, 0));
        let mut got = vec![0u8; 1000];
        b.get(0, 1, &mut got);
        assert_eq!(got, big);
        let mut small = [0u8; 5];
        a.get(1, 1, &mut small);
        assert_eq!(&small, b"hello");
        // The other parity is untouched.
        a.get(1, 0, &mut small);
        assert_eq!(small, [0; 5]);
        let mut part = [0u8; 3];
        a.get_at(1, 1, 5, 2, &mut part);
        assert_eq!(&part, b"llo");
        b.get_at(0, 1, 1000, 997, &mut part);
        assert_eq!(part, [7; 3]);
        // Giving up shows in the sequence word, past any stage.
        b.abort();
        assert_eq!(a.seq(1, 1), 1 | CollSegment::ABORTED);
        assert_eq!(a.seq(1, 0), CollSegment::ABORTED);
    }

    #[test]
    fn ring_slots_carry_stamp_word_and_payload_per_member_and_operation() {
        let name = format!("/weft-test-{}-collring", std::process::id());
        let a = CollSegment::create(&name, 3).unwrap();
        let b = CollSegment::open(&name, 3, 2).unwrap();
        a.unlink().unwrap();
        assert_eq!((b.ring_stamp(0, 5), b.done(0)), (0, 0));
        a.ring_put(5, 0xabc, b"eight by");
        b.ring_put(5, 0xdef, &[9u8; CollSegment::RING_INLINE]);
        assert_eq!((b.ring_stamp(0, 5), b.ring_word(0, 5)), (6, 0xabc));
        let mut got = [0u8; 8];
        b.ring_get(0, 5, &mut got);
        assert_eq!(&got, b"eight by");
        // Member 2's ring is its own; the last byte of a full slot stays in it.
        let mut full = [0u8; CollSegment::RING_INLINE];
        a.ring_get(2, 5, &mut full);
        assert_eq!(
            (a.ring_word(2, 5), full),
            (0xdef, [9u8; CollSegment::RING_INLINE])
        );
        assert_eq!(
            a.ring_stamp(0, 5),
            6,
            "member 2 did not touch member 0's slot"
        );
        // Operation 5 + RING_SLOTS uses the same slot; another slot is untouched.
        let again = 5 + CollSegment::RING_SLOTS as u64;
        assert_eq!(b.ring_stamp(0, again), 6, "not yet rewritten");
        a.ring_put(again, 1, b"x");
        assert_eq!(b.ring_stamp(0, again), again + 1);
        assert_eq!(b.ring_stamp(0, 6), 0);
        b.set_done(7);
        assert_eq!((a.done(2), a.done(1), a.up(2), a.down(2)), (7, 0, 0, 0));
    }

    #[test]
    fn open_refuses_another_membership() {
        let name = format!("/weft-test-{}-coll-m", std::process::id());
        let _a = CollSegment::create(&name, 3).unwrap();
        assert!(CollSegment::open(&name, 2, 1).is_err());
        assert!(CollSegment::open(&name, 3, 3).is_err());
        assert!(CollSegment::open(&name, 3, 2).is_ok());
    }
}

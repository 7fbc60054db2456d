//! Every `#[repr(C)]` type that lives in shared memory, and the constants that
//! describe where it lives.
//!
//! This is the only file of the crate that defines shared-memory layout. Any
//! change to a type, size or offset here changes what other processes see, so
//! it must bump [`LAYOUT_VERSION`]. Sizes and offsets are pinned at compile
//! time below each type.
//!
//! All offsets stored in shared memory are byte offsets from the start of the
//! segment, never pointers (each process maps the segment at its own address).
//!
//! # Segment
//!
//! ```text
//! 0       SegmentHeader  (64 bytes; magic, layout_version, kind, state, total_bytes)
//! 64      kind-specific payload
//! ```
//!
//! # Datastore segment (`kind` = [`KIND_DATASTORE`])
//!
//! ```text
//! 0       SegmentHeader
//! 64      StoreHeader    (64 bytes; geometry of index and data area, overflow flag)
//! 128     index          (index_slots x u64 record offsets, 0 = empty slot)
//! data_offset (aligned to 64)
//!         data area      (append-only records, each aligned to 8)
//! data_end <= total_bytes
//! ```
//!
//! A record is a [`RecordHeader`] `{hash u64, key_len u32, val_len u32}`
//! followed by the key bytes and the value bytes, padded to a multiple of 8.
//! Published records are never modified.
//!
//! # Inbox segment (`kind` = [`KIND_INBOX`])
//!
//! One per receiving process, written by its local senders (see `crate::inbox`).
//!
//! ```text
//! 0            SegmentHeader
//! 64           InboxHeader       (64 bytes; geometry, receiver pid, claimed-fastbox count)
//! 128          QueueProducerLine (128 bytes; the queue's shared enqueue position)
//! 256          FastboxCtl[fastbox_peers]  (256 bytes each: producer half, consumer half)
//! ring_offset  (256 + 256 * fastbox_peers rounded up to 4096)
//!              fastbox rings: fastbox_peers x fastbox_bytes, each a power of two
//!              >= 4096, made of 64-byte slots
//! queue_offset (= ring_offset + fastbox_peers * fastbox_bytes)
//!              queue slots: queue_slots x queue_slot_bytes, each starting with a
//!              QueueSlotHeader (16 bytes)
//! claims_offset (= queue_offset + queue_slots * queue_slot_bytes)
//!              split-copy claim words: CLAIM_SLOTS x u64
//! total_bytes  (= claims_offset + CLAIM_SLOTS * 8)
//! ```
//!
//! A fastbox frame starts at a slot boundary with an 8-byte header word
//! `len | tag << 32` (see [`fastbox_header`]) followed by `len` bytes and
//! occupies `ceil((8 + len) / 64)` consecutive slots, never wrapping past the
//! end of the ring: when it would, the producer first writes a skip record
//! (`len` = [`FASTBOX_SKIP_LEN`]) that covers the rest of the ring. The tag is
//! derived from the frame's absolute slot position; before publishing a
//! frame, the producer clears the header word of the slot after it if what
//! that slot still holds (an old header, or frame bytes) would pass for the
//! next position's header. All-zero memory is an empty ring; only producers
//! write ring memory.
//!
//! A queue slot's `state` word is `seq << 32 | owner`: `seq` is the slot's
//! lap base (`ticket - index`, so all-zero memory is an empty queue), plus 1
//! once the frame is published; `owner` is `sender_id + 1` while a producer
//! writes the slot, else 0.

use core::mem::{align_of, offset_of, size_of};
use core::sync::atomic::{AtomicU32, AtomicU64};

/// Magic number at offset 0 of every Weft segment (`b"WEFT-SHM"`, little endian).
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"WEFT-SHM");

/// Version of the layout defined in this file; bump it on every change.
pub const LAYOUT_VERSION: u32 = 5;

/// Split-copy claim words at the end of an inbox segment: who copies the second part of
/// a large message split between its receiver and its sender (see `ClaimTable`). A word
/// is `gen << 2 | state`: the receiver opens it (state [`CLAIM_OPEN`], a fresh `gen`),
/// then the sender ([`CLAIM_SENDER`]) or the receiver ([`CLAIM_RECEIVER`]) takes it with
/// one compare-and-swap, and only the taker copies.
pub const CLAIM_SLOTS: usize = 256;
/// Bytes of the claim words.
pub const CLAIM_BYTES: usize = CLAIM_SLOTS * 8;
/// Claim state: nobody took it yet.
pub const CLAIM_OPEN: u64 = 0;
/// Claim state: the sender copies.
pub const CLAIM_SENDER: u64 = 1;
/// Claim state: the receiver copies.
pub const CLAIM_RECEIVER: u64 = 2;

/// [`SegmentHeader::state`]: the creator is still initialising the segment.
pub const STATE_INITIALIZING: u32 = 0;
/// [`SegmentHeader::state`]: the segment is initialised and may be used.
pub const STATE_READY: u32 = 1;

/// [`SegmentHeader::kind`] of the wire-up server's node-local datastore.
pub const KIND_DATASTORE: u32 = 1;
/// [`SegmentHeader::kind`] of a shared-memory transport inbox.
pub const KIND_INBOX: u32 = 2;

/// [`SegmentHeader::kind`] of a node-local collective segment ([`crate::CollSegment`]).
pub const KIND_COLL: u32 = 3;

/// Payload bytes a collective line carries inline, per parity.
pub const COLL_INLINE: usize = 48;
/// Bytes of a member's cell in a collective segment, per parity.
pub const COLL_CELL_BYTES: usize = 16384;

/// One parity of a member's line: everything a reader needs for one operation of that
/// parity in one 64-byte cache line (so the owner's next operation, of the other parity,
/// does not disturb readers still finishing this one).
///
/// The owner writes `inline` (or its cell of this parity) and `word` for an operation,
/// then stores `seq` (Release); a reader loads `seq` (Acquire) and reads the rest after.
/// Parities alternate, so a payload is rewritten two operations later, once every member
/// has finished the operation in between (and so finished reading it).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct CollHalf {
    /// The last stage this member entered in an operation of this parity (0: none), with
    /// bit 63 set once it gave up on the segment.
    pub seq: AtomicU64,
    /// The operation's word: what the member called, with which root and byte count.
    pub word: AtomicU64,
    /// Inline payload.
    pub inline: [u8; COLL_INLINE],
}

const _: () = assert!(size_of::<CollHalf>() == 64);
const _: () = assert!(offset_of!(CollHalf, seq) == 0);
const _: () = assert!(offset_of!(CollHalf, word) == 8);
const _: () = assert!(offset_of!(CollHalf, inline) == 16);

/// A member's words in the segment's release/gather tree (a barrier over a k-ary tree of
/// the members, for large node-local communicators): stages only grow, so one pair
/// serves every operation. On their own 128-byte pair of cache lines, away from the
/// payload lines readers poll.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct CollTree {
    /// The last stage by which this member and every member of its subtree had arrived
    /// (the gather), with bit 63 set once it gave up on the segment.
    pub up: AtomicU64,
    /// The last stage this member saw released (the root's gather complete), which its
    /// children wait for, with bit 63 set once it gave up.
    pub down: AtomicU64,
    /// Reserved, zero.
    pub _pad: [u64; 6],
    /// Operations this member has finished reading the ring of (see [`CollRingSlot`]):
    /// `k + 1` once it returned from operation `k` as a non-root of a ring bcast. On the
    /// second line of the pair, away from the tree words.
    pub done: AtomicU64,
    /// Reserved, zero.
    pub _pad2: [u64; 7],
}

const _: () = assert!(size_of::<CollTree>() == 128);
const _: () = assert!(offset_of!(CollTree, up) == 0);
const _: () = assert!(offset_of!(CollTree, down) == 8);
const _: () = assert!(offset_of!(CollTree, done) == 64);

/// Slots of a member's bcast ring.
pub const COLL_RING_SLOTS: usize = 64;
/// Payload bytes of a ring slot.
pub const COLL_RING_INLINE: usize = 240;

/// One slot of a member's bcast ring: small bcasts whose root is this member go through
/// its ring, slot `k % COLL_RING_SLOTS` for operation `k`, so that the root runs ahead of
/// the other members by up to that many operations (it rewrites a slot once every member
/// has returned from the operation that used it last). The root writes `word` and
/// `payload`, then stores `stamp` (`k + 1`, Release); a reader waits for that stamp
/// (Acquire) and reads the rest after it.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct CollRingSlot {
    /// `k + 1` once the slot holds operation `k`'s payload (0: never written).
    pub stamp: AtomicU64,
    /// The operation's word, as [`CollHalf::word`].
    pub word: AtomicU64,
    /// The payload.
    pub payload: [u8; COLL_RING_INLINE],
}

const _: () = assert!(size_of::<CollRingSlot>() == 256);
const _: () = assert!(offset_of!(CollRingSlot, stamp) == 0);
const _: () = assert!(offset_of!(CollRingSlot, word) == 8);
const _: () = assert!(offset_of!(CollRingSlot, payload) == 16);

/// One member's line of a collective segment (one [`CollHalf`] per parity, then its tree
/// words): written by that member only, read by the others.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct CollLine {
    /// Parity 0 and parity 1.
    pub half: [CollHalf; 2],
    /// The release/gather tree's words.
    pub tree: CollTree,
}

const _: () = assert!(size_of::<CollLine>() == 256);
const _: () = assert!(align_of::<CollLine>() == 128);
const _: () = assert!(offset_of!(CollLine, tree) == 128);

/// Header of a collective segment, right after the [`SegmentHeader`].
#[repr(C)]
#[derive(Debug)]
pub struct CollHeader {
    /// Members (lines).
    pub members: AtomicU32,
    /// Reserved, zero.
    pub _pad: u32,
    /// Bytes of a cell per parity ([`COLL_CELL_BYTES`] when created).
    pub cell_bytes: AtomicU64,
}

const _: () = assert!(size_of::<CollHeader>() == 16);
const _: () = assert!(offset_of!(CollHeader, members) == 0);
const _: () = assert!(offset_of!(CollHeader, cell_bytes) == 8);

/// Offset of the [`CollHeader`].
pub const COLL_HEADER_OFFSET: usize = SEGMENT_HEADER_BYTES;
/// Offset of the first [`CollLine`] (member 0's); member r's is `r * 256` further.
pub const COLL_LINES_OFFSET: usize = 128;
const _: () = assert!(COLL_HEADER_OFFSET + size_of::<CollHeader>() <= COLL_LINES_OFFSET);
const _: () = assert!(COLL_LINES_OFFSET % align_of::<CollLine>() == 0);

/// Offset of the cells of a segment of `members`: member r's cell of parity p is at
/// `cells + (2 r + p) * COLL_CELL_BYTES`.
pub const fn coll_cells_offset(members: usize) -> usize {
    COLL_LINES_OFFSET + members * size_of::<CollLine>()
}

/// Offset of the bcast rings of a segment of `members`, after the cells: member r's
/// slot s is at `rings + (r * COLL_RING_SLOTS + s) * 256`.
pub const fn coll_rings_offset(members: usize) -> usize {
    coll_cells_offset(members) + members * 2 * COLL_CELL_BYTES
}

/// Total bytes of a collective segment of `members`.
pub const fn coll_segment_bytes(members: usize) -> usize {
    coll_rings_offset(members) + members * COLL_RING_SLOTS * size_of::<CollRingSlot>()
}

/// Header at offset 0 of every Weft shared-memory segment.
///
/// The creator writes every field, then stores [`STATE_READY`] into `state`
/// with `Release` ordering, last. Every mapper loads `state` with `Acquire`
/// semantics before trusting any other byte of the segment.
#[repr(C)]
#[derive(Debug)]
pub struct SegmentHeader {
    /// [`SEGMENT_MAGIC`].
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`] of the creator.
    pub layout_version: AtomicU32,
    /// What the segment holds, e.g. [`KIND_DATASTORE`].
    pub kind: AtomicU32,
    /// [`STATE_INITIALIZING`] or [`STATE_READY`].
    pub state: AtomicU32,
    /// Reserved, zero.
    pub _pad: u32,
    /// Size of the segment in bytes, as created.
    pub total_bytes: AtomicU64,
    /// Reserved, zero.
    pub _reserved: [u64; 4],
}

const _: () = assert!(size_of::<SegmentHeader>() == 64);
const _: () = assert!(align_of::<SegmentHeader>() == 8);
const _: () = assert!(offset_of!(SegmentHeader, magic) == 0);
const _: () = assert!(offset_of!(SegmentHeader, layout_version) == 8);
const _: () = assert!(offset_of!(SegmentHeader, kind) == 12);
const _: () = assert!(offset_of!(SegmentHeader, state) == 16);
const _: () = assert!(offset_of!(SegmentHeader, total_bytes) == 24);
const _: () = assert!(offset_of!(SegmentHeader, _reserved) == 32);

/// Size in bytes of [`SegmentHeader`]; the kind-specific payload starts here.
pub const SEGMENT_HEADER_BYTES: usize = size_of::<SegmentHeader>();

/// Header of a datastore segment, right after the [`SegmentHeader`].
///
/// The geometry fields (`index_offset`, `index_slots`, `data_offset`,
/// `data_end`) are written once before the segment is published and never
/// change. `data_used` and `entries` are informational mirrors of the writer's
/// state (readers never trust them). `overflowed` is set once by the writer.
#[repr(C)]
#[derive(Debug)]
pub struct StoreHeader {
    /// Offset of the index (an array of `index_slots` little-endian `u64`).
    pub index_offset: AtomicU64,
    /// Number of index slots, a power of two.
    pub index_slots: AtomicU64,
    /// Offset of the first byte of the data area.
    pub data_offset: AtomicU64,
    /// Offset one past the last usable byte of the data area.
    pub data_end: AtomicU64,
    /// Offset one past the last record written (informational).
    pub data_used: AtomicU64,
    /// Number of distinct keys (informational).
    pub entries: AtomicU64,
    /// Non-zero once the store stopped being complete ("ask the server").
    pub overflowed: AtomicU32,
    /// Reserved, zero.
    pub _pad: u32,
    /// Reserved, zero.
    pub _reserved: u64,
}

const _: () = assert!(size_of::<StoreHeader>() == 64);
const _: () = assert!(align_of::<StoreHeader>() == 8);
const _: () = assert!(offset_of!(StoreHeader, index_offset) == 0);
const _: () = assert!(offset_of!(StoreHeader, index_slots) == 8);
const _: () = assert!(offset_of!(StoreHeader, data_offset) == 16);
const _: () = assert!(offset_of!(StoreHeader, data_end) == 24);
const _: () = assert!(offset_of!(StoreHeader, data_used) == 32);
const _: () = assert!(offset_of!(StoreHeader, entries) == 40);
const _: () = assert!(offset_of!(StoreHeader, overflowed) == 48);

/// Offset of the [`StoreHeader`] in a datastore segment.
pub const STORE_HEADER_OFFSET: usize = SEGMENT_HEADER_BYTES;
/// Offset of the index in a datastore segment.
pub const STORE_INDEX_OFFSET: usize = STORE_HEADER_OFFSET + size_of::<StoreHeader>();
/// Size in bytes of one index slot (a record offset, 0 = empty).
pub const INDEX_SLOT_BYTES: usize = size_of::<AtomicU64>();
/// Alignment of the start of the data area.
pub const DATA_ALIGN: usize = 64;

const _: () = assert!(STORE_HEADER_OFFSET == 64);
const _: () = assert!(STORE_INDEX_OFFSET == 128);
const _: () = assert!(STORE_INDEX_OFFSET % align_of::<AtomicU64>() == 0);
const _: () = assert!(INDEX_SLOT_BYTES == 8);

/// Header of one immutable datastore record; key and value bytes follow.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// Hash of the key (see `store::key_hash`).
    pub hash: u64,
    /// Length of the key in bytes.
    pub key_len: u32,
    /// Length of the value in bytes.
    pub val_len: u32,
}

const _: () = assert!(size_of::<RecordHeader>() == 16);
const _: () = assert!(align_of::<RecordHeader>() == 8);
const _: () = assert!(offset_of!(RecordHeader, hash) == 0);
const _: () = assert!(offset_of!(RecordHeader, key_len) == 8);
const _: () = assert!(offset_of!(RecordHeader, val_len) == 12);

/// Size in bytes of [`RecordHeader`].
pub const RECORD_HEADER_BYTES: usize = size_of::<RecordHeader>();
/// Alignment of every record (and so of every record offset).
pub const RECORD_ALIGN: usize = 8;

const _: () = assert!(RECORD_ALIGN >= align_of::<RecordHeader>());
const _: () = assert!(DATA_ALIGN % RECORD_ALIGN == 0);

// ---------------------------------------------------------------------------
// Inbox segment
// ---------------------------------------------------------------------------

/// Header of an inbox segment, right after the [`SegmentHeader`].
///
/// Every field but `fastbox_claimed` is written once by the receiver before
/// the segment is published and never changes.
#[repr(C)]
#[derive(Debug)]
pub struct InboxHeader {
    /// Number of fastboxes.
    pub fastbox_peers: AtomicU32,
    /// Bytes of each fastbox ring (a power of two, at least 4096).
    pub fastbox_bytes: AtomicU32,
    /// Number of slots of the shared queue (a power of two, at least 2).
    pub queue_slots: AtomicU32,
    /// Bytes of each queue slot (a multiple of 64), header included.
    pub queue_slot_bytes: AtomicU32,
    /// Number of claimed fastboxes. Claims are made in index order, so the
    /// claimed fastboxes are exactly `0..fastbox_claimed`. Senders raise it
    /// (`fetch_max`, Release) after claiming; the receiver loads it (Acquire)
    /// to learn which fastboxes to poll.
    pub fastbox_claimed: AtomicU32,
    /// Process id of the receiver (informational, for inspection).
    pub receiver_pid: AtomicU32,
    /// Offset of the `FastboxCtl` array.
    pub ctl_offset: AtomicU64,
    /// Offset of the first fastbox ring (page aligned).
    pub ring_offset: AtomicU64,
    /// Offset of the first queue slot.
    pub queue_offset: AtomicU64,
    /// Sender id of the inbox's owner ([`NO_OWNER`] when it has none): where
    /// pair lines live (see [`PairLine`]).
    pub owner_id: AtomicU32,
    /// Number of [`PairLine`]s: one per sender id below it.
    pub pair_lines: AtomicU32,
    /// Offset of the [`PairLine`] array.
    pub pair_offset: AtomicU64,
}

const _: () = assert!(size_of::<InboxHeader>() == 64);
const _: () = assert!(align_of::<InboxHeader>() == 8);
const _: () = assert!(offset_of!(InboxHeader, fastbox_peers) == 0);
const _: () = assert!(offset_of!(InboxHeader, fastbox_bytes) == 4);
const _: () = assert!(offset_of!(InboxHeader, queue_slots) == 8);
const _: () = assert!(offset_of!(InboxHeader, queue_slot_bytes) == 12);
const _: () = assert!(offset_of!(InboxHeader, fastbox_claimed) == 16);
const _: () = assert!(offset_of!(InboxHeader, receiver_pid) == 20);
const _: () = assert!(offset_of!(InboxHeader, ctl_offset) == 24);
const _: () = assert!(offset_of!(InboxHeader, ring_offset) == 32);
const _: () = assert!(offset_of!(InboxHeader, queue_offset) == 40);
const _: () = assert!(offset_of!(InboxHeader, owner_id) == 48);
const _: () = assert!(offset_of!(InboxHeader, pair_lines) == 52);
const _: () = assert!(offset_of!(InboxHeader, pair_offset) == 56);

/// [`InboxHeader::owner_id`] of an inbox created without an owner id.
pub const NO_OWNER: u32 = u32::MAX;

/// Offset of the [`InboxHeader`] in an inbox segment.
pub const INBOX_HEADER_OFFSET: usize = SEGMENT_HEADER_BYTES;

/// The shared queue's producer-side word, alone on a 128-byte block (two
/// cache lines, so the adjacent-line prefetcher does not couple it with its
/// neighbours).
#[repr(C, align(128))]
#[derive(Debug)]
pub struct QueueProducerLine {
    /// Next ticket to hand out (a hint: producers reserve a ticket by a CAS
    /// on its slot's state and help advance this word).
    pub enqueue_pos: AtomicU64,
    /// Reserved, zero.
    pub _pad: [u64; 15],
}

const _: () = assert!(size_of::<QueueProducerLine>() == 128);
const _: () = assert!(offset_of!(QueueProducerLine, enqueue_pos) == 0);

/// Offset of the [`QueueProducerLine`] in an inbox segment.
pub const QUEUE_PRODUCER_OFFSET: usize = INBOX_HEADER_OFFSET + size_of::<InboxHeader>();
const _: () = assert!(QUEUE_PRODUCER_OFFSET == 128);

/// Control block of one fastbox: a producer-owned half and a consumer-owned
/// half, 128 bytes each (two cache lines, against adjacent-line prefetch).
#[repr(C, align(128))]
#[derive(Debug)]
pub struct FastboxCtl {
    /// 0 = free; else `sender_id + 1` in bits 0..32, [`CLAIM_ATTACHED`] while
    /// an `Outbox` uses it, and a generation (bumped by every attach) in bits
    /// 33..64. Written by senders only (CAS).
    pub claim: AtomicU64,
    /// Producer's next free slot position (absolute, in slots), stored after
    /// every published frame so that a successor can resume the ring.
    pub head: AtomicU64,
    /// Reserved, zero.
    pub _producer_pad: [u64; 14],
    /// Consumer's next slot position (absolute, in slots): every slot before
    /// it is free. Written by the receiver only.
    pub tail: AtomicU64,
    /// Reserved, zero.
    pub _consumer_pad: [u64; 15],
}

const _: () = assert!(size_of::<FastboxCtl>() == 256);
const _: () = assert!(align_of::<FastboxCtl>() == 128);
const _: () = assert!(offset_of!(FastboxCtl, claim) == 0);
const _: () = assert!(offset_of!(FastboxCtl, head) == 8);
const _: () = assert!(offset_of!(FastboxCtl, tail) == 128);

/// Offset of the first [`FastboxCtl`] in an inbox segment.
pub const FASTBOX_CTL_OFFSET: usize = QUEUE_PRODUCER_OFFSET + size_of::<QueueProducerLine>();
/// Size in bytes of one [`FastboxCtl`].
pub const FASTBOX_CTL_BYTES: usize = size_of::<FastboxCtl>();
const _: () = assert!(FASTBOX_CTL_OFFSET == 256);
const _: () = assert!(FASTBOX_CTL_OFFSET % align_of::<FastboxCtl>() == 0);

/// [`FastboxCtl::claim`]: set while an `Outbox` is attached.
pub const CLAIM_ATTACHED: u64 = 1 << 32;
/// [`FastboxCtl::claim`]: one step of the attach generation.
pub const CLAIM_GENERATION_ONE: u64 = 1 << 33;
/// [`FastboxCtl::claim`]: the bits holding `sender_id + 1`.
pub const CLAIM_SENDER_MASK: u64 = 0xffff_ffff;

/// Alignment of the fastbox rings and of the queue.
pub const RING_ALIGN: usize = 4096;

/// Size in bytes of one fastbox slot (one cache line).
pub const FASTBOX_SLOT_BYTES: usize = 64;
/// Size in bytes of a fastbox frame header (`len u32 | tag u32 << 32`).
pub const FASTBOX_FRAME_HEADER_BYTES: usize = 8;
/// Frame length marking a skip record (the rest of the ring is unused).
pub const FASTBOX_SKIP_LEN: u32 = u32::MAX;
/// Smallest fastbox ring.
pub const FASTBOX_MIN_BYTES: u32 = 4096;

/// One fastbox slot as it looks when a frame starts in it. The payload goes
/// on into the following slots (which then hold no header) when longer than
/// 56 bytes.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct FastboxSlot {
    /// Frame header, see [`fastbox_header`]; stored last, with Release.
    pub header: AtomicU64,
    /// The first 56 bytes of the frame.
    pub bytes: [u8; 56],
}

const _: () = assert!(size_of::<FastboxSlot>() == FASTBOX_SLOT_BYTES);
const _: () = assert!(offset_of!(FastboxSlot, header) == 0);
const _: () = assert!(offset_of!(FastboxSlot, bytes) == FASTBOX_FRAME_HEADER_BYTES);
const _: () = assert!(RING_ALIGN % FASTBOX_SLOT_BYTES == 0);

/// Tag of a frame (or skip record) starting at absolute slot position `pos`:
/// odd, so never 0 (an empty slot), and different for the same slot on
/// consecutive laps (rings have fewer than 2^31 slots).
#[inline(always)]
pub const fn fastbox_tag(pos: u64) -> u32 {
    ((pos as u32) << 1) | 1
}

/// Header word of a frame of `len` bytes (or [`FASTBOX_SKIP_LEN`]) at
/// absolute slot position `pos`.
#[inline(always)]
pub const fn fastbox_header(pos: u64, len: u32) -> u64 {
    ((fastbox_tag(pos) as u64) << 32) | len as u64
}

/// Number of slots a frame of `len` bytes occupies.
#[inline(always)]
pub const fn fastbox_frame_slots(len: usize) -> u64 {
    ((FASTBOX_FRAME_HEADER_BYTES + len).div_ceil(FASTBOX_SLOT_BYTES)) as u64
}

/// One side's half of a [`PairLine`]: written only by that side's process.
///
/// `frame` is the side's latest frame to the other: `seq u8 | len u8 << 8 |
/// ring u16 << 16 | the frame's first 4 bytes << 32`, stored last with
/// Release; `body` holds the frame's bytes 4..24. `ack` is what the side
/// read of the other's frames: `seq u8` of the last one consumed, plus
/// [`PAIR_LISTENING`] while the side polls the other's half.
#[repr(C, align(32))]
#[derive(Debug)]
pub struct PairHalf {
    /// The frame word, see above.
    pub frame: AtomicU64,
    /// The ack word, see above.
    pub ack: AtomicU32,
    /// Frame bytes 4..24.
    pub body: [u8; 20],
}

const _: () = assert!(size_of::<PairHalf>() == 32);
const _: () = assert!(offset_of!(PairHalf, frame) == 0);
const _: () = assert!(offset_of!(PairHalf, ack) == 8);
const _: () = assert!(offset_of!(PairHalf, body) == 12);

/// The cache line two local processes share for their small frames in both
/// directions: half 0 belongs to the lower sender id, half 1 to the higher.
/// It lives in the lower one's inbox, at index = the higher one's sender id.
///
/// One line for both directions is the point: a reply written into the line
/// the request arrived in costs one cache-line transfer, where a reply into
/// another line costs an ownership request on top (measured 0.066 against
/// 0.14 us one way). Each side has at most one unconsumed frame in its half;
/// `ring` orders it among the side's fastbox frames.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct PairLine {
    /// Half 0 (lower sender id) and half 1 (higher).
    pub halves: [PairHalf; 2],
}

const _: () = assert!(size_of::<PairLine>() == 64);
const _: () = assert!(offset_of!(PairLine, halves) == 0);

/// Size in bytes of one [`PairLine`].
pub const PAIR_LINE_BYTES: usize = size_of::<PairLine>();
/// Largest frame a pair line carries.
pub const PAIR_FRAME_MAX: usize = 24;
/// [`PairHalf::ack`]: the side polls the other's half.
pub const PAIR_LISTENING: u32 = 1 << 8;

/// Header of one queue slot; the frame bytes follow.
#[repr(C)]
#[derive(Debug)]
pub struct QueueSlotHeader {
    /// `seq << 32 | owner`, see the module docs.
    pub state: AtomicU64,
    /// Sender id of the frame.
    pub sender: AtomicU32,
    /// Length of the frame in bytes.
    pub len: AtomicU32,
}

const _: () = assert!(size_of::<QueueSlotHeader>() == 16);
const _: () = assert!(offset_of!(QueueSlotHeader, state) == 0);
const _: () = assert!(offset_of!(QueueSlotHeader, sender) == 8);
const _: () = assert!(offset_of!(QueueSlotHeader, len) == 12);

/// Size in bytes of [`QueueSlotHeader`]; the frame starts here in its slot.
pub const QUEUE_SLOT_HEADER_BYTES: usize = size_of::<QueueSlotHeader>();
/// Queue slots are a multiple of this many bytes.
pub const QUEUE_SLOT_ALIGN: usize = 64;
const _: () = assert!(QUEUE_SLOT_ALIGN % align_of::<QueueSlotHeader>() == 0);

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

use core::mem::{align_of, offset_of, size_of};
use core::sync::atomic::{AtomicU32, AtomicU64};

/// Magic number at offset 0 of every Weft segment (`b"WEFT-SHM"`, little endian).
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"WEFT-SHM");

/// Version of the layout defined in this file; bump it on every change.
pub const LAYOUT_VERSION: u32 = 1;

/// [`SegmentHeader::state`]: the creator is still initialising the segment.
pub const STATE_INITIALIZING: u32 = 0;
/// [`SegmentHeader::state`]: the segment is initialised and may be used.
pub const STATE_READY: u32 = 1;

/// [`SegmentHeader::kind`] of the wire-up server's node-local datastore.
pub const KIND_DATASTORE: u32 = 1;

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

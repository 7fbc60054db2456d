//! The wire-up server's node-local datastore: one writer, many lock-free
//! readers in other processes.
//!
//! The segment (layout in [`crate::layout`]) holds an open-addressing index
//! of record offsets (linear probing, 0 = empty) and an append-only data area
//! of immutable records. The writer appends a record, then stores its offset
//! into the key's slot with `Release` ordering; a reader loads the slot and
//! synchronises with an `Acquire` fence before reading the record. A
//! replacement appends a new record and swaps the slot's offset, so a reader
//! sees either the old or the new value, never a mix. Old records are never
//! reclaimed.
//!
//! Readers bounds-check every offset and length read from shared memory, so a
//! corrupt segment yields `None` or a [`SegmentError`], never a crash.

use core::fmt;
use core::slice;
use core::sync::atomic::{fence, AtomicU64, Ordering};

use crate::layout::{
    RecordHeader, StoreHeader, DATA_ALIGN, INDEX_SLOT_BYTES, RECORD_ALIGN, RECORD_HEADER_BYTES,
    STORE_HEADER_OFFSET, STORE_INDEX_OFFSET,
};
use crate::segment::{ReadOnlySegment, SegmentError, SegmentKind, WritableSegment};

/// The datastore cannot take this insert: its data area or its index is full.
///
/// Nothing of the failed insert is visible to readers; earlier keys stay
/// readable.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
#[error("datastore segment is full (data area or index)")]
pub struct StoreFull;

/// Largest index load the writer accepts, as a fraction `NUM / DEN`.
const MAX_LOAD_NUM: usize = 3;
const MAX_LOAD_DEN: usize = 4;

const HASH_SEED: u64 = 0x2d35_8dcc_aa6c_78a5;
const HASH_P0: u64 = 0xa076_1d64_78bd_642f;
const HASH_P1: u64 = 0xe703_7ed1_a0b4_28db;

/// 64x64 -> 128 bit multiply, folded to 64 bits.
#[inline(always)]
fn fold_mul(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

#[inline(always)]
fn le_u64(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(w)
}

/// The key hash (wyhash-style), stored in every record and used to pick the
/// index slot. It is part of the shared-memory format: changing it requires a
/// new [`crate::layout::LAYOUT_VERSION`].
#[inline]
fn key_hash(key: &[u8]) -> u64 {
    let mut seed = HASH_SEED;
    let mut rest = key;
    while rest.len() > 16 {
        seed = fold_mul(le_u64(&rest[..8]) ^ HASH_P1, le_u64(&rest[8..16]) ^ seed);
        rest = &rest[16..];
    }
    let mut tail = [0u8; 16];
    tail[..rest.len()].copy_from_slice(rest);
    seed = fold_mul(le_u64(&tail[..8]) ^ HASH_P1, le_u64(&tail[8..]) ^ seed);
    fold_mul(seed ^ HASH_P0, (key.len() as u64) ^ HASH_P1)
}

/// Rounds `n` up to a multiple of the power of two `align`.
fn align_up(n: usize, align: usize) -> Option<usize> {
    Some(n.checked_add(align - 1)? & !(align - 1))
}

/// A validated view of a datastore's index and data area.
///
/// Invariant (established by [`Table::new`]): `base .. base + data_end` is a
/// readable mapping that lives as long as the owner of this `Table`;
/// `base` is page-aligned; `index_offset` is a multiple of 8;
/// `index_offset + slots * 8 <= data_offset <= data_end`; `slots` is a power
/// of two.
#[derive(Clone, Copy)]
struct Table {
    base: *const u8,
    index_offset: usize,
    slots: usize,
    data_offset: usize,
    data_end: usize,
}

/// A record found in the data area, borrowed from the mapping.
struct Record<'a> {
    hash: u64,
    key: &'a [u8],
    value: &'a [u8],
}

/// Outcome of probing the index for a key.
enum Probe<'a> {
    /// The key is in `slot`, currently with `value`.
    Found { slot: usize, value: &'a [u8] },
    /// The key is absent; `slot` is the first empty slot of its probe chain.
    Vacant { slot: usize },
    /// The key is absent and the chain has no empty slot.
    Exhausted,
}

impl Table {
    /// Reads and validates the geometry in the store header of the mapping
    /// at `base`, which is `bytes` long and at least `STORE_INDEX_OFFSET`.
    fn new(name: &str, base: *const u8, bytes: usize) -> Result<Table, SegmentError> {
        let corrupt = |what: String| SegmentError::Corrupt {
            name: name.to_owned(),
            what,
        };
        if bytes < STORE_INDEX_OFFSET {
            return Err(corrupt(format!(
                "segment of {bytes} bytes is smaller than the datastore headers \
                 ({STORE_INDEX_OFFSET} bytes)"
            )));
        }
        // SAFETY: the mapping is at least STORE_INDEX_OFFSET bytes (checked
        // above), page-aligned, so the StoreHeader at STORE_HEADER_OFFSET is in
        // bounds and aligned; its fields are atomics, and the reference does
        // not outlive this function.
        let sh = unsafe { &*base.add(STORE_HEADER_OFFSET).cast::<StoreHeader>() };
        // Relaxed: these were published with the segment state, which the
        // caller acquired when opening (or wrote itself).
        let field = |a: &AtomicU64, what: &str| {
            let v = a.load(Ordering::Relaxed);
            usize::try_from(v).map_err(|_| corrupt(format!("{what} {v} exceeds the address space")))
        };
        let index_offset = field(&sh.index_offset, "index offset")?;
        let slots = field(&sh.index_slots, "index slot count")?;
        let data_offset = field(&sh.data_offset, "data offset")?;
        let data_end = field(&sh.data_end, "data end")?;
        if index_offset < STORE_INDEX_OFFSET || index_offset % INDEX_SLOT_BYTES != 0 {
            return Err(corrupt(format!("index offset {index_offset} is invalid")));
        }
        if !slots.is_power_of_two() {
            return Err(corrupt(format!(
                "index slot count {slots} is not a power of two"
            )));
        }
        let index_end = slots
            .checked_mul(INDEX_SLOT_BYTES)
            .and_then(|b| b.checked_add(index_offset));
        if index_end.is_none_or(|end| end > data_offset) {
            return Err(corrupt(format!(
                "index of {slots} slots at offset {index_offset} overlaps the data area at \
                 {data_offset}"
            )));
        }
        if data_offset % RECORD_ALIGN != 0 || data_offset > data_end || data_end > bytes {
            return Err(corrupt(format!(
                "data area {data_offset}..{data_end} does not fit the {bytes}-byte segment"
            )));
        }
        Ok(Table {
            base,
            index_offset,
            slots,
            data_offset,
            data_end,
        })
    }

    /// The index slot `i` (< `slots`).
    #[inline(always)]
    fn slot(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < self.slots);
        // SAFETY: by the Table invariant the index (slots * 8 bytes at the
        // 8-aligned index_offset) lies in the live mapping; `i < slots`
        // (masked by callers); AtomicU64 allows shared access to memory other
        // processes write.
        unsafe {
            &*self
                .base
                .add(self.index_offset + i * INDEX_SLOT_BYTES)
                .cast::<AtomicU64>()
        }
    }

    /// The record at `off`, if it lies entirely inside the data area.
    ///
    /// Only call this with an offset that was acquired from a slot (or
    /// written by this process): the record is then fully written and
    /// immutable.
    #[inline(always)]
    fn record(&self, off: u64) -> Option<Record<'_>> {
        let off = usize::try_from(off).ok()?;
        if off < self.data_offset || off % RECORD_ALIGN != 0 {
            return None;
        }
        let body = off.checked_add(RECORD_HEADER_BYTES)?;
        if body > self.data_end {
            return None;
        }
        // SAFETY: off .. off + 16 lies in the data area of the live mapping
        // (checked above) and is 8-aligned (base is page-aligned, off % 8 ==
        // 0); the record is published and never modified (see caller
        // contract), so a plain read does not race.
        let hdr = unsafe { self.base.add(off).cast::<RecordHeader>().read() };
        let key_len = hdr.key_len as usize;
        let val_len = hdr.val_len as usize;
        let key_end = body.checked_add(key_len)?;
        let val_end = key_end.checked_add(val_len)?;
        if val_end > self.data_end {
            return None;
        }
        // SAFETY: body .. val_end lies in the data area of the live mapping
        // (checked above); those bytes are published and immutable; the
        // slices borrow `self`, which the mapping outlives.
        let (key, value) = unsafe {
            (
                slice::from_raw_parts(self.base.add(body), key_len),
                slice::from_raw_parts(self.base.add(key_end), val_len),
            )
        };
        Some(Record {
            hash: hdr.hash,
            key,
            value,
        })
    }

    /// Looks `key` (with hash `hash`) up; lock-free, no syscall, no allocation.
    #[inline]
    fn probe(&self, key: &[u8], hash: u64) -> Probe<'_> {
        let mask = self.slots - 1;
        let mut i = (hash as usize) & mask;
        // Bounded, so a corrupt index without empty slots cannot loop forever.
        for _ in 0..self.slots {
            // Relaxed load plus fence: Acquire loads are not guaranteed on
            // read-only mappings; Relaxed ones of this size are.
            let off = self.slot(i).load(Ordering::Relaxed);
            if off == 0 {
                return Probe::Vacant { slot: i };
            }
            // SYNC: pairs with the Release store of the slot in
            // `StoreWriter::insert`; makes the record at `off` visible.
            fence(Ordering::Acquire);
            if let Some(rec) = self.record(off) {
                if rec.hash == hash && rec.key == key {
                    return Probe::Found {
                        slot: i,
                        value: rec.value,
                    };
                }
            }
            i = (i + 1) & mask;
        }
        Probe::Exhausted
    }

    #[inline]
    fn get(&self, key: &[u8]) -> Option<&[u8]> {
        match self.probe(key, key_hash(key)) {
            Probe::Found { value, .. } => Some(value),
            Probe::Vacant { .. } | Probe::Exhausted => None,
        }
    }

    fn store_header(&self) -> &StoreHeader {
        // SAFETY: `Table::new` checked the mapping holds the StoreHeader at
        // its aligned offset; the mapping outlives `self`; fields are atomics.
        unsafe { &*self.base.add(STORE_HEADER_OFFSET).cast::<StoreHeader>() }
    }
}

/// The single writer of a datastore segment (the wire-up server).
///
/// Dropping it unmaps the segment and unlinks its name; readers that already
/// mapped it keep working.
pub struct StoreWriter {
    seg: WritableSegment,
    table: Table,
    /// Offset one past the last record.
    used: usize,
    /// Number of distinct keys.
    entries: usize,
    /// Most distinct keys the index takes (75% load).
    max_entries: usize,
    /// Keys and data bytes that only [`StoreWriter::insert_vital`] may take.
    reserve: (usize, usize),
}

// SAFETY: `table.base` points into `seg`'s mapping, which is owned by the
// writer and not tied to a thread; moving the writer moves sole write access.
unsafe impl Send for StoreWriter {}

impl fmt::Debug for StoreWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreWriter")
            .field("name", &self.seg.name())
            .field("bytes", &self.seg.bytes())
            .field("index_slots", &self.table.slots)
            .field("entries", &self.entries)
            .field("bytes_used", &self.bytes_used())
            .finish()
    }
}

impl StoreWriter {
    /// Creates the POSIX shm object `name` (e.g. `"/weft-job1-n0-ds"`;
    /// `O_CREAT|O_EXCL`, mode 0600) of `bytes` bytes (sparse on tmpfs) with an
    /// index of `index_slots` slots (a power of two; at most 75% of them are
    /// used), followed by the data area. The segment is published (readers
    /// can open it) when this returns.
    pub fn create(
        name: &str,
        bytes: usize,
        index_slots: usize,
    ) -> Result<StoreWriter, SegmentError> {
        let invalid = |reason: String| SegmentError::InvalidConfig {
            name: name.to_owned(),
            reason,
        };
        if !index_slots.is_power_of_two() {
            return Err(invalid(format!(
                "index slot count {index_slots} is not a power of two"
            )));
        }
        let data_offset = index_slots
            .checked_mul(INDEX_SLOT_BYTES)
            .and_then(|b| b.checked_add(STORE_INDEX_OFFSET))
            .and_then(|end| align_up(end, DATA_ALIGN))
            .filter(|&d| {
                d.checked_add(RECORD_HEADER_BYTES)
                    .is_some_and(|e| e <= bytes)
            })
            .ok_or_else(|| {
                invalid(format!(
                    "{bytes} bytes cannot hold the headers, an index of {index_slots} slots \
                     and a data area"
                ))
            })?;
        let data_end = bytes & !(RECORD_ALIGN - 1);

        let seg = WritableSegment::create(name, bytes, SegmentKind::DATASTORE)?;
        // SAFETY: the mapping is `bytes` >= data_offset + 16 > STORE_INDEX_OFFSET
        // bytes long, page-aligned, and lives in `seg`; StoreHeader fields are
        // atomics; the reference does not outlive this block.
        let sh = unsafe { &*seg.as_ptr().add(STORE_HEADER_OFFSET).cast::<StoreHeader>() };
        // Relaxed: published by the Release store in `seg.publish()` below.
        sh.index_offset
            .store(STORE_INDEX_OFFSET as u64, Ordering::Relaxed);
        sh.index_slots.store(index_slots as u64, Ordering::Relaxed);
        sh.data_offset.store(data_offset as u64, Ordering::Relaxed);
        sh.data_end.store(data_end as u64, Ordering::Relaxed);
        sh.data_used.store(data_offset as u64, Ordering::Relaxed);
        let table = Table::new(name, seg.as_ptr().cast_const(), seg.bytes())?;
        seg.publish();
        Ok(StoreWriter {
            seg,
            table,
            used: data_offset,
            entries: 0,
            max_entries: index_slots / MAX_LOAD_DEN * MAX_LOAD_NUM
                + index_slots % MAX_LOAD_DEN * MAX_LOAD_NUM / MAX_LOAD_DEN,
            reserve: (0, 0),
        })
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        self.seg.name()
    }

    /// Inserts `key` with `value`, or replaces the key's value.
    ///
    /// If the key already has an identical value, nothing is written.
    /// Published records are never modified: a replacement appends a new
    /// record and atomically swaps the slot's offset, so concurrent readers
    /// see the old or the new value. On `Err(StoreFull)` (data area full, or
    /// the index would exceed 75% load) nothing was published.
    /// Inserts leave the [reserve](Self::set_reserve) untouched.
    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreFull> {
        self.insert_with(key, value, self.reserve)
    }

    /// Keeps `keys` distinct keys and `bytes` bytes of the data area (both capped at what
    /// the store has) for [`insert_vital`](Self::insert_vital): once ordinary inserts
    /// filled the rest, records that must stay readable still fit (a process's end, which
    /// readers look up without a fallback).
    pub fn set_reserve(&mut self, keys: usize, bytes: usize) {
        self.reserve = (keys.min(self.max_entries), bytes.min(self.data_capacity()));
    }

    /// [`insert`](Self::insert) that may take the reserve.
    pub fn insert_vital(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreFull> {
        self.insert_with(key, value, (0, 0))
    }

    fn insert_with(
        &mut self,
        key: &[u8],
        value: &[u8],
        (keys_kept, bytes_kept): (usize, usize),
    ) -> Result<(), StoreFull> {
        let hash = key_hash(key);
        let key_len = u32::try_from(key.len()).map_err(|_| StoreFull)?;
        let val_len = u32::try_from(value.len()).map_err(|_| StoreFull)?;
        let (slot, is_new) = match self.table.probe(key, hash) {
            Probe::Found { value: old, .. } if old == value => return Ok(()),
            Probe::Found { slot, .. } => (slot, false),
            Probe::Vacant { slot } if self.entries + keys_kept < self.max_entries => (slot, true),
            Probe::Vacant { .. } | Probe::Exhausted => return Err(StoreFull),
        };
        let size = RECORD_HEADER_BYTES
            .checked_add(key.len())
            .and_then(|n| n.checked_add(value.len()))
            .and_then(|n| align_up(n, RECORD_ALIGN))
            .ok_or(StoreFull)?;
        let off = self.used;
        let end = off.checked_add(size).ok_or(StoreFull)?;
        if end > self.table.data_end - bytes_kept {
            return Err(StoreFull);
        }
        let dst = self.seg.as_ptr();
        // SAFETY: off .. end lies in the data area of our live read-write
        // mapping (checked above); it is past every published record, so no
        // reader reads it until the Release store below; `off` is 8-aligned
        // (data_offset and every record size are multiples of 8); `key` and
        // `value` are caller slices that cannot overlap this unpublished range
        // (nothing borrowed from the mapping points past `used`). Padding
        // bytes are still zero from ftruncate.
        unsafe {
            dst.add(off).cast::<RecordHeader>().write(RecordHeader {
                hash,
                key_len,
                val_len,
            });
            let body = dst.add(off + RECORD_HEADER_BYTES);
            core::ptr::copy_nonoverlapping(key.as_ptr(), body, key.len());
            core::ptr::copy_nonoverlapping(value.as_ptr(), body.add(key.len()), value.len());
        }
        // SYNC: pairs with the Acquire fence in `Table::probe` (readers);
        // publishes the record bytes written above.
        self.table.slot(slot).store(off as u64, Ordering::Release);
        self.used = end;
        if is_new {
            self.entries += 1;
        }
        let sh = self.table.store_header();
        // Relaxed: informational mirrors, readers never rely on them.
        sh.data_used.store(end as u64, Ordering::Relaxed);
        sh.entries.store(self.entries as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The current value of `key`.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.table.get(key)
    }

    /// Marks the store as no longer complete: readers that miss a key must
    /// ask the server. Stays set for the life of the segment.
    pub fn set_overflowed(&mut self) {
        // SYNC: pairs with the Acquire fence in `StoreReader::overflowed`.
        self.table
            .store_header()
            .overflowed
            .store(1, Ordering::Release);
    }

    /// Whether [`set_overflowed`](Self::set_overflowed) was called.
    pub fn overflowed(&self) -> bool {
        // Relaxed: only this writer stores the flag.
        self.table.store_header().overflowed.load(Ordering::Relaxed) != 0
    }

    /// Bytes of the data area taken by records (including replaced ones).
    pub fn bytes_used(&self) -> usize {
        self.used - self.table.data_offset
    }

    /// Size of the data area in bytes.
    pub fn data_capacity(&self) -> usize {
        self.table.data_end - self.table.data_offset
    }

    /// Number of distinct keys stored.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Whether no key is stored.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Most distinct keys the index accepts (75% of its slots).
    pub fn key_capacity(&self) -> usize {
        self.max_entries
    }
}

/// A read-only, lock-free view of a datastore segment (a client process).
pub struct StoreReader {
    seg: ReadOnlySegment,
    table: Table,
}

// SAFETY: `table.base` points into `seg`'s read-only mapping, owned by the
// reader and not tied to a thread.
unsafe impl Send for StoreReader {}
// SAFETY: every `&self` method only reads the mapping (atomics for the index
// and flags, immutable published records for the data).
unsafe impl Sync for StoreReader {}

impl fmt::Debug for StoreReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreReader")
            .field("name", &self.seg.name())
            .field("bytes", &self.seg.bytes())
            .field("index_slots", &self.table.slots)
            .finish()
    }
}

impl StoreReader {
    /// Opens the datastore segment `name` read-only (`O_RDONLY`,
    /// `PROT_READ`) and validates magic, layout version, kind, state ready,
    /// and that every recorded size fits the mapping.
    pub fn open(name: &str) -> Result<StoreReader, SegmentError> {
        let seg = ReadOnlySegment::open(name, SegmentKind::DATASTORE)?;
        let table = Table::new(name, seg.as_ptr(), seg.bytes())?;
        Ok(StoreReader { seg, table })
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        self.seg.name()
    }

    /// The current value of `key`: lock-free, no syscall, no allocation.
    #[inline]
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.table.get(key)
    }

    /// Whether the writer marked the store as no longer complete (a missing
    /// key may then exist on the server).
    pub fn overflowed(&self) -> bool {
        // Relaxed load plus fence: Acquire loads are not guaranteed on
        // read-only mappings.
        let set = self.table.store_header().overflowed.load(Ordering::Relaxed) != 0;
        // SYNC: pairs with the Release store in `StoreWriter::set_overflowed`.
        fence(Ordering::Acquire);
        set
    }
}

#[cfg(test)]
mod tests;

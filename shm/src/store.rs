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
    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreFull> {
        let hash = key_hash(key);
        let key_len = u32::try_from(key.len()).map_err(|_| StoreFull)?;
        let val_len = u32::try_from(value.len()).map_err(|_| StoreFull)?;
        let (slot, is_new) = match self.table.probe(key, hash) {
            Probe::Found { value: old, .. } if old == value => return Ok(()),
            Probe::Found { slot, .. } => (slot, false),
            Probe::Vacant { slot } if self.entries < self.max_entries => (slot, true),
            Probe::Vacant { .. } | Probe::Exhausted => return Err(StoreFull),
        };
        let size = RECORD_HEADER_BYTES
            .checked_add(key.len())
            .and_then(|n| n.checked_add(value.len()))
            .and_then(|n| align_up(n, RECORD_ALIGN))
            .ok_or(StoreFull)?;
        let off = self.used;
        let end = off.checked_add(size).ok_or(StoreFull)?;
        if end > self.table.data_end {
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
mod tests {
    use super::*;
    use crate::layout::{SegmentHeader, SEGMENT_MAGIC};
    use core::mem::offset_of;
    use core::sync::atomic::{AtomicBool, AtomicUsize};
    use std::collections::HashMap;
    use std::fs::File;
    use std::path::PathBuf;

    use proptest::collection::vec;
    use proptest::prelude::*;

    /// A segment name unique to this process, test and call.
    fn test_name(test: &str) -> String {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        format!("/weft-test-{}-{test}-{seq}", std::process::id())
    }

    fn dev_shm_path(name: &str) -> PathBuf {
        PathBuf::from("/dev/shm").join(&name[1..])
    }

    /// A separate read-write mapping of an existing segment, to corrupt it.
    fn raw_map(name: &str) -> (File, memmap2::MmapMut) {
        let fd =
            rustix::shm::open(name, rustix::shm::OFlags::RDWR, rustix::fs::Mode::empty()).unwrap();
        let file = File::from(fd);
        // SAFETY: test-only mapping of a segment this test created; the
        // test thread is the only one touching it while the mapping is used.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.unwrap();
        (file, map)
    }

    fn put_u64(map: &mut [u8], at: usize, v: u64) {
        map[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    fn get_u64(map: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(map[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn hash_depends_on_every_byte_and_length() {
        let mut seen = std::collections::HashSet::new();
        for len in 0..40usize {
            assert!(seen.insert(key_hash(&vec![0u8; len])), "zero key len {len}");
        }
        let base = [7u8; 37];
        for i in 0..base.len() {
            let mut k = base;
            k[i] ^= 1;
            assert!(seen.insert(key_hash(&k)), "flip at {i}");
        }
        // Low bits (slot choice) spread over sequential keys.
        let mut buckets = [0u32; 64];
        for i in 0..64_000u32 {
            buckets[(key_hash(format!("rank.{i}.card").as_bytes()) & 63) as usize] += 1;
        }
        assert!(
            buckets.iter().all(|&b| (700..1300).contains(&b)),
            "{buckets:?}"
        );
    }

    #[test]
    fn insert_get_replace_identical_skip() {
        let name = test_name("basic");
        let mut w = StoreWriter::create(&name, 1 << 20, 64).unwrap();
        assert_eq!(w.name(), name);
        let r = StoreReader::open(&name).unwrap();
        assert_eq!(r.get(b"a"), None);
        assert!(w.is_empty());

        w.insert(b"a", b"one").unwrap();
        w.insert(b"", b"empty key").unwrap();
        w.insert(b"c", b"").unwrap();
        assert_eq!(w.get(b"a"), Some(&b"one"[..]));
        assert_eq!(r.get(b"a"), Some(&b"one"[..]));
        assert_eq!(r.get(b""), Some(&b"empty key"[..]));
        assert_eq!(r.get(b"c"), Some(&b""[..]));
        assert_eq!(r.get(b"b"), None);
        assert_eq!(w.len(), 3);

        let used = w.bytes_used();
        w.insert(b"a", b"one").unwrap();
        assert_eq!(w.bytes_used(), used, "identical value must not append");

        let old = r.get(b"a").unwrap();
        w.insert(b"a", b"two!").unwrap();
        assert!(w.bytes_used() > used);
        assert_eq!(w.len(), 3, "replacement is not a new key");
        assert_eq!(r.get(b"a"), Some(&b"two!"[..]));
        assert_eq!(w.get(b"a"), Some(&b"two!"[..]));
        // The old record is immutable: a borrowed old value stays intact.
        assert_eq!(old, b"one");
        // Record sizes: header + key + value, padded to 8.
        assert_eq!(used, 24 + 32 + 24);
        assert_eq!(w.bytes_used(), used + 24);
        assert!(format!("{w:?}").contains(&name));
        assert!(format!("{r:?}").contains(&name));
    }

    #[test]
    fn data_full_leaves_earlier_keys_readable() {
        let name = test_name("data-full");
        let mut w = StoreWriter::create(&name, 4096, 64).unwrap();
        let r = StoreReader::open(&name).unwrap();
        let value = [0xabu8; 200];
        let mut n = 0u32;
        let err = loop {
            match w.insert(&n.to_le_bytes(), &value) {
                Ok(()) => n += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(err, StoreFull);
        assert!(n > 5, "only {n} records fit");
        let used = w.bytes_used();
        assert!(used <= w.data_capacity());
        // The failed key is not visible, earlier keys are.
        assert_eq!(r.get(&n.to_le_bytes()), None);
        assert_eq!(w.get(&n.to_le_bytes()), None);
        for i in 0..n {
            assert_eq!(r.get(&i.to_le_bytes()), Some(&value[..]));
        }
        // A replacement that does not fit fails and keeps the old value.
        assert_eq!(w.insert(&0u32.to_le_bytes(), &[1u8; 300]), Err(StoreFull));
        assert_eq!(r.get(&0u32.to_le_bytes()), Some(&value[..]));
        assert_eq!(w.bytes_used(), used);
        // Small records may still fit, and identical re-inserts always do.
        assert_eq!(w.insert(&0u32.to_le_bytes(), &value), Ok(()));

        assert!(!r.overflowed());
        w.set_overflowed();
        assert!(r.overflowed());
        assert!(w.overflowed());
    }

    #[test]
    fn index_full_at_75_percent() {
        let name = test_name("index-full");
        let mut w = StoreWriter::create(&name, 1 << 16, 8).unwrap();
        assert_eq!(w.key_capacity(), 6);
        let r = StoreReader::open(&name).unwrap();
        for i in 0..6u8 {
            w.insert(&[i], &[i; 3]).unwrap();
        }
        let used = w.bytes_used();
        assert_eq!(w.insert(&[6], b"x"), Err(StoreFull));
        assert_eq!(w.bytes_used(), used);
        assert_eq!(r.get(&[6]), None);
        // Replacing an existing key needs no new slot.
        w.insert(&[3], b"new").unwrap();
        for i in 0..6u8 {
            let want: &[u8] = if i == 3 { b"new" } else { &[i; 3] };
            assert_eq!(r.get(&[i]), Some(want));
        }
    }

    #[test]
    fn create_rejects_bad_geometry() {
        let name = test_name("geometry");
        for (bytes, slots) in [
            (1 << 20, 0),
            (1 << 20, 3),
            (256, 64),
            (1 << 20, usize::MAX / 4 + 1),
        ] {
            assert!(
                matches!(
                    StoreWriter::create(&name, bytes, slots),
                    Err(SegmentError::InvalidConfig { .. })
                ),
                "{bytes} {slots}"
            );
        }
        assert!(!dev_shm_path(&name).exists());
    }

    /// Value `generation` of key `k`: its own generation, key id, and a
    /// pattern derived from both, of a length that varies with `generation`.
    fn patterned_value(k: u8, generation: u64) -> Vec<u8> {
        let len = 512 + (generation % 512) as usize;
        let mut v = Vec::with_capacity(len);
        v.extend_from_slice(&generation.to_le_bytes());
        v.push(k);
        let mut x = generation.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(k);
        while v.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.push(x as u8);
        }
        v
    }

    #[test]
    fn concurrent_reader_never_sees_torn_values() {
        const KEYS: u8 = 4;
        const GENERATIONS: u64 = 5_000;
        let name = test_name("torn");
        let mut w = StoreWriter::create(&name, 64 << 20, 64).unwrap();
        for k in 0..KEYS {
            w.insert(&[b'k', k], &patterned_value(k, 0)).unwrap();
        }
        let r = StoreReader::open(&name).unwrap();
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let done = &done;
            s.spawn(move || {
                for g in 1..=GENERATIONS {
                    for k in 0..KEYS {
                        w.insert(&[b'k', k], &patterned_value(k, g)).unwrap();
                    }
                }
                // SYNC: pairs with the Acquire load in the reader loop below.
                done.store(true, Ordering::Release);
                drop(w);
            });
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    let r = &r;
                    s.spawn(move || {
                        let mut last = [0u64; KEYS as usize];
                        let mut changes = 0u64;
                        loop {
                            // SYNC: pairs with the Release store after the writer's last insert.
                            let finished = done.load(Ordering::Acquire);
                            for k in 0..KEYS {
                                let v = r.get(&[b'k', k]).expect("key vanished");
                                let g = u64::from_le_bytes(v[..8].try_into().unwrap());
                                assert_eq!(v, patterned_value(k, g), "torn value");
                                assert!(g >= last[k as usize], "value went backwards");
                                changes += u64::from(g != last[k as usize]);
                                last[k as usize] = g;
                            }
                            if finished {
                                assert_eq!(last, [GENERATIONS; KEYS as usize]);
                                return changes;
                            }
                        }
                    })
                })
                .collect();
            for h in readers {
                let changes = h.join().unwrap();
                assert!(changes > 0);
            }
        });
        // The writer dropped (name unlinked) but our mapping still reads.
        assert!(!dev_shm_path(&name).exists());
        assert_eq!(
            r.get(&[b'k', 0]),
            Some(&patterned_value(0, GENERATIONS)[..])
        );
    }

    #[test]
    fn open_missing_segment() {
        let name = test_name("missing");
        match StoreReader::open(&name) {
            Err(SegmentError::NotFound { name: n }) => assert_eq!(n, name),
            other => panic!("expected NotFound, got {other:?}"),
        }
        crate::unlink(&name).unwrap();
    }

    #[test]
    fn open_wrong_magic_and_layout_version() {
        let name = test_name("magic");
        let mut w = StoreWriter::create(&name, 1 << 16, 16).unwrap();
        w.insert(b"k", b"v").unwrap();
        let (_file, mut map) = raw_map(&name);

        put_u64(&mut map, offset_of!(SegmentHeader, magic), 0x1234);
        match StoreReader::open(&name) {
            Err(e @ SegmentError::BadMagic { found: 0x1234, .. }) => {
                assert!(e.to_string().contains(&name), "{e}")
            }
            other => panic!("expected BadMagic, got {other:?}"),
        }
        put_u64(&mut map, offset_of!(SegmentHeader, magic), SEGMENT_MAGIC);
        StoreReader::open(&name).unwrap();

        let at = offset_of!(SegmentHeader, layout_version);
        map[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
        match StoreReader::open(&name) {
            Err(SegmentError::LayoutVersion {
                found: 99,
                expected: crate::layout::LAYOUT_VERSION,
                name: n,
            }) => assert_eq!(n, name),
            other => panic!("expected LayoutVersion, got {other:?}"),
        }
        map[at..at + 4].copy_from_slice(&crate::layout::LAYOUT_VERSION.to_le_bytes());

        let at = offset_of!(SegmentHeader, kind);
        map[at..at + 4].copy_from_slice(&5u32.to_le_bytes());
        assert!(matches!(
            StoreReader::open(&name),
            Err(SegmentError::WrongKind { found: 5, .. })
        ));
        map[at..at + 4].copy_from_slice(&crate::layout::KIND_DATASTORE.to_le_bytes());

        let at = offset_of!(SegmentHeader, state);
        map[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(
            StoreReader::open(&name),
            Err(SegmentError::NotReady { state: 0, .. })
        ));
        map[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(StoreReader::open(&name).unwrap().get(b"k"), Some(&b"v"[..]));
    }

    #[test]
    fn open_truncated_segment() {
        let name = test_name("truncated");
        let _w = StoreWriter::create(&name, 1 << 20, 16).unwrap();
        let fd = rustix::shm::open(
            name.as_str(),
            rustix::shm::OFlags::RDWR,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        match StoreReader::open(&name) {
            Err(SegmentError::Truncated {
                file_bytes: 4096,
                needed_bytes,
                ..
            }) => assert_eq!(needed_bytes, 1 << 20),
            other => panic!("expected Truncated, got {other:?}"),
        }
        rustix::fs::ftruncate(&fd, 10).unwrap();
        assert!(matches!(
            StoreReader::open(&name),
            Err(SegmentError::Truncated {
                file_bytes: 10,
                needed_bytes: 64,
                ..
            })
        ));
        rustix::fs::ftruncate(&fd, 0).unwrap();
        assert!(matches!(
            StoreReader::open(&name),
            Err(SegmentError::Truncated { file_bytes: 0, .. })
        ));
    }

    #[test]
    fn open_rejects_corrupt_geometry() {
        let name = test_name("geometry-corrupt");
        let _w = StoreWriter::create(&name, 1 << 16, 16).unwrap();
        let (_file, mut map) = raw_map(&name);
        let field = |f: usize| STORE_HEADER_OFFSET + f;
        let cases = [
            (field(offset_of!(StoreHeader, index_slots)), 12u64),
            (field(offset_of!(StoreHeader, index_slots)), 1 << 40),
            (field(offset_of!(StoreHeader, index_offset)), 8),
            (field(offset_of!(StoreHeader, index_offset)), 129),
            (field(offset_of!(StoreHeader, data_offset)), 130),
            (field(offset_of!(StoreHeader, data_end)), (1 << 16) + 8),
            (field(offset_of!(StoreHeader, data_end)), u64::MAX),
        ];
        for (at, bad) in cases {
            let good = get_u64(&map, at);
            put_u64(&mut map, at, bad);
            match StoreReader::open(&name) {
                Err(SegmentError::Corrupt { name: n, .. }) => assert_eq!(n, name),
                other => panic!("offset {at} = {bad}: expected Corrupt, got {other:?}"),
            }
            put_u64(&mut map, at, good);
        }
        StoreReader::open(&name).unwrap();
    }

    #[test]
    fn corrupt_offsets_and_lengths_read_as_absent() {
        let name = test_name("corrupt-records");
        let mut w = StoreWriter::create(&name, 1 << 16, 16).unwrap();
        w.insert(b"key", b"value").unwrap();
        let r = StoreReader::open(&name).unwrap();
        let (_file, mut map) = raw_map(&name);
        let slot_at = (0..16)
            .map(|i| STORE_INDEX_OFFSET + 8 * i)
            .find(|&at| get_u64(&map, at) != 0)
            .unwrap();
        let rec = get_u64(&map, slot_at);
        let data_end = get_u64(
            &map,
            STORE_HEADER_OFFSET + offset_of!(StoreHeader, data_end),
        );
        for bad in [u64::MAX - 7, rec + 3, 8, data_end - 8, data_end] {
            put_u64(&mut map, slot_at, bad);
            assert_eq!(r.get(b"key"), None, "slot = {bad}");
        }
        put_u64(&mut map, slot_at, rec);
        assert_eq!(r.get(b"key"), Some(&b"value"[..]));

        // Lengths that run past the data area.
        let lens_at = rec as usize + offset_of!(RecordHeader, key_len);
        let lens = get_u64(&map, lens_at);
        put_u64(&mut map, lens_at, u64::MAX);
        assert_eq!(r.get(b"key"), None);
        put_u64(&mut map, lens_at, lens);

        // An index with no empty slot and garbage everywhere terminates.
        for i in 0..16 {
            put_u64(&mut map, STORE_INDEX_OFFSET + 8 * i, rec + 8);
        }
        assert_eq!(r.get(b"key"), None);
        assert_eq!(r.get(b"other"), None);
    }

    #[test]
    fn segment_is_gone_after_writer_drops() {
        let name = test_name("gone");
        let w = StoreWriter::create(&name, 256 << 20, 1 << 16).unwrap();
        let path = dev_shm_path(&name);
        assert!(path.exists());
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 256 << 20);
        {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            assert_eq!(meta.permissions().mode() & 0o777, 0o600);
            // Sparse: only the touched header/index pages are allocated.
            assert!(meta.blocks() * 512 < 1 << 20, "{} blocks", meta.blocks());
        }
        assert!(matches!(
            StoreWriter::create(&name, 1 << 16, 16),
            Err(SegmentError::Create { .. })
        ));
        drop(w);
        assert!(!path.exists());
        assert!(matches!(
            StoreReader::open(&name),
            Err(SegmentError::NotFound { .. })
        ));
    }

    /// Hostile input: a datastore segment corrupted at random (header, index, records)
    /// under a reader opened before and one opened after: no panic, every lookup ends.
    #[test]
    fn fuzz_readers_of_corrupted_segments() {
        let name = test_name("fuzz");
        let mut w = StoreWriter::create(&name, 1 << 16, 64).unwrap();
        let keys: Vec<Vec<u8>> = (0..40).map(|i| format!("key{i}").into_bytes()).collect();
        for (i, k) in keys.iter().enumerate() {
            w.insert(k, &vec![i as u8; i * 3]).unwrap();
        }
        let early = StoreReader::open(&name).unwrap();
        let (_file, mut map) = raw_map(&name);
        let pristine = map.to_vec();
        let end = STORE_HEADER_OFFSET + offset_of!(StoreHeader, data_end);
        let used = (get_u64(&map, end) as usize + 64).min(map.len());
        let mut found = 0u64;
        crate::fuzz::run("store-reader", 4, |m| {
            map.copy_from_slice(&pristine);
            m.corrupt(&mut map, used, 8);
            for r in [Some(&early), StoreReader::open(&name).ok().as_ref()]
                .into_iter()
                .flatten()
            {
                for k in &keys {
                    found += u64::from(r.get(k).is_some());
                }
                let _ = r.get(b"absent");
                let _ = r.overflowed();
            }
        });
        map.copy_from_slice(&pristine);
        println!("fuzz store-reader: {found} lookups found their key");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn matches_hashmap_model(
            pool in vec(vec(any::<u8>(), 0..24), 1..16),
            ops in vec(
                (any::<prop::sample::Index>(), vec(any::<u8>(), 0..48), any::<bool>()),
                0..80,
            ),
        ) {
            let name = test_name("model");
            let mut w = StoreWriter::create(&name, 1 << 20, 32).unwrap();
            let r = StoreReader::open(&name).unwrap();
            let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
            for (idx, value, repeat) in ops {
                let key = idx.get(&pool).clone();
                let before = w.bytes_used();
                let identical = model.get(&key) == Some(&value);
                w.insert(&key, &value).unwrap();
                if identical {
                    prop_assert_eq!(w.bytes_used(), before);
                } else {
                    prop_assert!(w.bytes_used() > before);
                }
                if repeat {
                    let after = w.bytes_used();
                    w.insert(&key, &value).unwrap();
                    prop_assert_eq!(w.bytes_used(), after, "identical re-insert appended");
                }
                model.insert(key, value);
                prop_assert_eq!(w.len(), model.len());
                for k in &pool {
                    prop_assert_eq!(r.get(k), model.get(k).map(Vec::as_slice));
                }
            }
            for k in &pool {
                prop_assert_eq!(w.get(k), model.get(k).map(Vec::as_slice));
            }
        }
    }
}

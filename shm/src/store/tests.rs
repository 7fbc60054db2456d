//! Unit tests of `store`.

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
    let fd = rustix::shm::open(name, rustix::shm::OFlags::RDWR, rustix::fs::Mode::empty()).unwrap();
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
    weft_fuzz::run("store-reader", 4, |m| {
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

#[test]
fn a_reserve_keeps_keys_and_bytes_for_vital_inserts() {
    let name = test_name("reserve");
    let mut w = StoreWriter::create(&name, 1 << 16, 16).unwrap();
    assert_eq!(w.key_capacity(), 12);
    w.set_reserve(4, 1024);
    let r = StoreReader::open(&name).unwrap();
    for i in 0..8u8 {
        w.insert(&[i], &[i; 3]).unwrap();
    }
    // Ordinary inserts stop short of the reserved keys ...
    assert_eq!(w.insert(&[8], b"x"), Err(StoreFull));
    // ... vital ones take them, up to the index's own limit.
    for i in 8..12u8 {
        w.insert_vital(&[i], b"gone").unwrap();
    }
    assert_eq!(w.insert_vital(&[12], b"gone"), Err(StoreFull));
    for i in 8..12u8 {
        assert_eq!(r.get(&[i]), Some(&b"gone"[..]));
    }

    // The reserved bytes: a record that fits only into them is vital or refused.
    let name = test_name("reserve-bytes");
    let mut w = StoreWriter::create(&name, 8192, 64).unwrap();
    let free = w.data_capacity() - w.bytes_used();
    w.set_reserve(0, free - 512);
    assert_eq!(w.insert(b"big", &[1u8; 1024]), Err(StoreFull));
    w.insert(b"small", &[1u8; 100]).unwrap();
    w.insert_vital(b"big", &[1u8; 1024]).unwrap();
    assert_eq!(w.get(b"big").map(<[u8]>::len), Some(1024));
}

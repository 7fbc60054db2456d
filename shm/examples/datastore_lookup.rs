//! Measures `StoreReader::get` of a 16-byte key with a 1 KiB value.
//!
//! `cargo run --release -p weft-shm --example datastore_lookup`

use std::hint::black_box;
use std::time::Instant;

use weft_shm::{StoreReader, StoreWriter};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const KEYS: u64 = 10_000;
    const LOOKUPS: u64 = 10_000_000;
    let name = format!("/weft-example-lookup-{}", std::process::id());
    let mut writer = StoreWriter::create(&name, 256 << 20, 1 << 16)?;
    let value = vec![0x5a_u8; 1024];
    let key = |i: u64| {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&i.to_le_bytes());
        k[8..].copy_from_slice(b"rankcard");
        k
    };
    for i in 0..KEYS {
        writer.insert(&key(i), &value)?;
    }
    let reader = StoreReader::open(&name)?;
    let keys: Vec<[u8; 16]> = (0..KEYS).map(key).collect();
    let start = Instant::now();
    let mut sum = 0usize;
    for i in 0..LOOKUPS {
        let v = reader.get(black_box(&keys[(i % KEYS) as usize]));
        sum += v.map_or(0, |v| v.len());
    }
    let elapsed = start.elapsed();
    assert_eq!(sum as u64, LOOKUPS * 1024);
    println!(
        "# weft-shm datastore lookup: {KEYS} keys of 16 B, values of 1 KiB\n\
         {:>12} {:>12}\n{:>12} {:>12.1}",
        "lookups",
        "ns/lookup",
        LOOKUPS,
        elapsed.as_nanos() as f64 / LOOKUPS as f64
    );
    Ok(())
}

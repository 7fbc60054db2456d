//! README.md, "Messaging": a ring step, blocking then non-blocking in a request scope
//! (a 1 MiB buffer, so the rendezvous path). Run with `weft run -n 4 [--nodes 2]
//! target/debug/examples/readme_messaging`; every rank prints what it got.

// The README's blocks keep their layout here (tests/readme.rs compares them).
#[rustfmt::skip]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rank: u32 = std::env::var("WEFT_RANK")?.parse()?;
    let big: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    // README: messaging
    use weft::prelude::*;

    let fabric = Fabric::init()?;              // wire-up + this process's shared-memory inbox
    let world = fabric.world();                // context id = the world group's PGCID
    let right = (world.rank() + 1) % world.size();
    world.send(&[world.rank() as u64], right, Tag(7))?;
    let mut got = [0u64; 1];
    let status = world.recv(&mut got, Source::Any, Tag(7))?;   // Source::Any, Tag::ANY wildcards
    let mut from_left = vec![0u8; big.len()];
    world.scope(|s| {                                          // non-blocking ops borrow buffers
        let r = s.irecv(&mut from_left, Source::Any, Tag(8))?; // in a scope that completes them
        let w = s.isend(&big, right, Tag(8))?;
        wait_all(vec![r, w])                                   // also test, wait, wait_any
    })?;                                                       // (probe, iprobe on the comm)
    fabric.finalize()?;
    // README end
    let left = status.source();
    println!(
        "rank {rank} got {got:?} from {left}, big intact: {}",
        from_left == big
    );
    Ok(())
}

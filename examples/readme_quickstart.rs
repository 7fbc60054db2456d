//! README.md, "Quickstart": the whole `src/main.rs` of a new crate that depends on Weft (a
//! ring step and an allreduce). Run with `weft run -n 4 [--nodes 2]
//! target/debug/examples/readme_quickstart`; every rank prints what it got and the sum.

// README: quickstart
use weft::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fabric = Fabric::init()?; // wire-up, then shared memory, verbs or TCP per peer
    let world = fabric.world();
    let (rank, size) = (world.rank(), world.size());
    world.send(&[rank as u64], (rank + 1) % size, Tag(7))?;
    let mut got = [0u64; 1];
    world.recv(&mut got, Source::Any, Tag(7))?;
    let mut sum = [0u64; 1];
    world.allreduce(&[rank as u64], &mut sum, Op::Sum)?;
    println!("rank {rank} of {size}: got {got:?} from the left, sum {sum:?}");
    fabric.finalize()?;
    Ok(())
}
// README end

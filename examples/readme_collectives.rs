//! README.md, "Collectives": allreduce, bcast, barrier, split, split_type, dup, a scan
//! with an associative non-commutative user operation, a non-blocking allreduce. Run with
//! `weft run -n 4 [--nodes 2] target/debug/examples/readme_collectives` (or `-n 8`): every
//! rank prints its node's size, the total and its scan (1, 11, 111, ... in rank order
//! within each half).

// The README's blocks keep their layout here (tests/readme.rs compares them).
#[rustfmt::skip]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    // README: collectives
    use weft::prelude::*; // Collectives, NonBlocking, Op, SplitType, Loc, CollError

    let fabric = Fabric::init()?;
    let world = fabric.world();                        // or any communicator
    let mut sum = [0.0f64; 4];
    world.allreduce(&[1.0; 4], &mut sum, Op::Sum)?;    // every member gets 4 x size
    world.bcast(&mut sum, 0)?;
    world.barrier()?;
    let half = world.split(Some(world.rank() % 2), 0)?.expect("a color was given");
    let node = world.split_type(SplitType::Shared, 0)?; // the processes of this node
    let dup = world.dup()?;                             // same members, new context id
    // A user operation must be associative; a non-commutative one is applied in rank order.
    // Decimal concatenation on (value, 10^digits) pairs: member r of `half` gets r+1 ones.
    let concat = Op::user(|a: &[[u64; 2]], b: &mut [[u64; 2]]| {
        for (a, b) in a.iter().zip(b) { *b = [a[0] * b[1] + b[0], a[1] * b[1]]; }
    }, false);
    let mut seq = [[0u64; 2]];
    half.scan(&[[1, 10]], &mut seq, concat)?;           // 1, 11, 111, 1111, ...
    // Non-blocking, in a request scope, mixed with point-to-point.
    let (mine, mut total) = ([1u64], [0u64]);
    dup.scope(|s| {
        let r = s.iallreduce(&mine, &mut total, Op::Sum)?;
        r.wait()?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    println!("rank {} of a node of {}: total {}, scan {}", world.rank(), node.size(), total[0], seq[0][0]);
    fabric.finalize()?;
    // README end
    println!("sum {sum:?}");
    Ok(())
}

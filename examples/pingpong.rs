//! Ping-pong between ranks 0 and 1: run with `weft run -n 2 .../examples/pingpong`.
//!
//! For each size (`--sizes 8,65536,...`, default 0 to 4 MiB by powers of 4) rank 0 sends,
//! rank 1 returns the data changed, rank 0 checks it; prints the mean round trip per size.

use std::time::Instant;

use weft::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut sizes: Vec<usize> = std::iter::once(0)
        .chain((0..12).map(|i| 1usize << (2 * i)))
        .collect();
    let mut iters = 100u32;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--sizes" => {
                sizes = args
                    .next()
                    .ok_or("--sizes LIST")?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--iters" => iters = args.next().ok_or("--iters N")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let fabric = Fabric::init()?;
    let world = fabric.world();
    if world.size() < 2 {
        return Err("pingpong needs 2 processes".into());
    }
    let rank = world.rank();
    for &n in &sizes {
        let mut buf = vec![0u8; n];
        let t0 = Instant::now();
        for it in 0..iters {
            match rank {
                0 => {
                    buf.iter_mut()
                        .enumerate()
                        .for_each(|(i, b)| *b = (i as u32 ^ it) as u8);
                    world.send(&buf, 1, Tag(0))?;
                    world.recv(&mut buf, Source::Rank(1), Tag(0))?;
                    if buf
                        .iter()
                        .enumerate()
                        .any(|(i, &b)| b != ((i as u32 ^ it) as u8).wrapping_add(1))
                    {
                        return Err(format!("size {n} iteration {it}: reply corrupted").into());
                    }
                }
                1 => {
                    world.recv(&mut buf, Source::Rank(0), Tag(0))?;
                    buf.iter_mut().for_each(|b| *b = b.wrapping_add(1));
                    world.send(&buf, 0, Tag(0))?;
                }
                _ => {}
            }
        }
        if rank == 0 {
            println!(
                "{n:>9} bytes: {:.3} us round trip",
                t0.elapsed().as_secs_f64() * 1e6 / f64::from(iters)
            );
        }
    }
    if rank == 0 {
        println!("pingpong ok");
    }
    fabric.finalize()?;
    Ok(())
}

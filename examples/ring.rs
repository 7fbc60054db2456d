//! Ring pass over the world communicator: run with `weft run -n 4 .../examples/ring`.
//!
//! A token goes around the ring `--laps` times (default 3), each rank adding its rank; a
//! large buffer (`--bytes`, default 1 MiB, so the rendezvous path is used) follows it.
//! Rank 0 checks the sums and the data, prints `ring ok`, and every rank exits 0.

use weft::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut laps = 3u64;
    let mut bytes = 1usize << 20;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--laps" => laps = args.next().ok_or("--laps N")?.parse()?,
            "--bytes" => bytes = args.next().ok_or("--bytes N")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let fabric = Fabric::init()?;
    let world = fabric.world();
    let (rank, size) = (world.rank(), world.size());
    let right = (rank + 1) % size;
    let left = (rank + size - 1) % size;
    let mut big = vec![0u8; bytes];
    for lap in 0..laps {
        let mut token = [0u64];
        if rank == 0 {
            big.iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (i as u64 * 7 + lap) as u8);
            world.send(&[lap * 1000], right, Tag(1))?;
            world.send(&big, right, Tag(2))?;
            world.recv(&mut token, Source::Rank(left), Tag(1))?;
            let mut back = vec![0u8; bytes];
            let st = world.recv(&mut back, Source::Rank(left), Tag(2))?;
            let want = lap * 1000 + u64::from(size) * u64::from(size - 1) / 2;
            if token[0] != want || back != big || st.count != bytes {
                return Err(format!(
                    "lap {lap}: token {} (want {want}), data intact: {}",
                    token[0],
                    back == big
                )
                .into());
            }
        } else {
            world.recv(&mut token, Source::Rank(left), Tag(1))?;
            world.recv(&mut big, Source::Rank(left), Tag(2))?;
            world.send(&[token[0] + u64::from(rank)], right, Tag(1))?;
            world.send(&big, right, Tag(2))?;
        }
    }
    if rank == 0 {
        println!("ring ok: {laps} laps over {size} ranks with {bytes}-byte payloads");
    }
    fabric.finalize()?;
    Ok(())
}

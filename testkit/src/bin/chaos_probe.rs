//! The program `ci/chaos.sh` runs under `weft run`: ITER rounds of fences in every mode
//! with cards whose values it knows, gets of other ranks' cards, communicators made from
//! groups (a PGCID each), and point-to-point rings among the processes of each node and
//! around the whole job, across nodes (eager and rendezvous sizes, checked byte for byte). Prints `rank R ok` at the end;
//! on any error prints `rank R error: ...` (the error names whom it lost) and exits 1.
//! Every round also runs collectives on the world (allreduce, bcast, barrier, allgather),
//! their results checked.
//!
//! `CHAOS_END=R:I:HOW` makes rank R end cleanly at round I, just before its collectives:
//! HOW is `exit0` (exit status 0 without finalizing) or `finalize` (finalize the session,
//! then linger 1 s and exit 0); it prints `rank R ended: HOW` first. The others must then
//! fail, naming it, never hang.
//!
//!   weft run --nodes 2 -n 6 target/debug/chaos_probe [ITER]

use std::time::Duration;

use weft::prelude::*;

type Res = Result<(), Box<dyn std::error::Error>>;

/// Wire-up waits are bounded: a process that stops answering is named within this.
const WAIT: Duration = Duration::from_secs(10);

fn main() {
    let iters: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let rank = std::env::var("WEFT_RANK").unwrap_or_default();
    if let Err(e) = run(iters) {
        println!("rank {rank} error: {e}");
        std::process::exit(1);
    }
    println!("rank {rank} ok");
}

/// The value rank `r` publishes in round `i`.
fn card(r: u32, i: u64) -> String {
    format!(
        "card-{r}-{i}-{}",
        (u64::from(r) * 7919 + i * 104_729) % 1_000_003
    )
}

fn run(iters: u64) -> Res {
    let session = Session::init(Info::new(), ErrHandler::Return)?;
    let fabric = session.fabric();
    let wire = fabric.wire();
    let (me, size) = (wire.rank(), wire.size());
    let world = session.group_from_pset("weft://world")?;
    // This node's processes, in rank order: rings among them use shared memory.
    let local: Vec<u32> = wire.local_peers().to_vec();
    let node_group = world.incl(&local)?;
    let world_comm = fabric.world();
    let end = std::env::var("CHAOS_END").ok();
    let end: Option<(u32, u64, String)> = end.as_deref().and_then(|e| {
        let mut f = e.split(':');
        Some((
            f.next()?.parse().ok()?,
            f.next()?.parse().ok()?,
            f.next()?.to_string(),
        ))
    });
    for i in 0..iters {
        // A key per round: a peer may publish its next round before this one reads.
        let key = format!("card.{i}");
        wire.put(Scope::Global, &key, card(me, i))?;
        wire.commit()?;
        let mode = [FenceMode::Full, FenceMode::Sparse, FenceMode::SyncOnly][(i % 3) as usize];
        wire.fence(Procs::All, mode, Some(WAIT))?;
        for peer in [(me + 1) % size, (me + 1 + i as u32) % size] {
            let v = wire.get(peer, &key, GetOpts::default().timeout(WAIT))?;
            if v.as_str() != Some(card(peer, i).as_str()) {
                return Err(format!(
                    "round {i}: card of rank {peer} is {v:?}, not {:?}",
                    card(peer, i)
                )
                .into());
            }
        }
        if i % 4 == 1 {
            let comm = Communicator::create_from_group(
                &node_group,
                &format!("chaos.{i}"),
                ErrHandler::Return,
            )?;
            ring(&comm, i, 8)?;
            comm.disconnect()?;
        }
        if let Some((r, at, how)) = &end {
            if *r == me && *at == i {
                println!("rank {me} ended: {how}");
                if how == "finalize" {
                    drop((world_comm, node_group, world));
                    session.finalize()?;
                    std::thread::sleep(Duration::from_secs(1));
                }
                std::process::exit(0);
            }
        }
        collectives(&world_comm, i)?;
        // Eager and rendezvous sizes among this node's processes.
        let bytes = [8usize, 4096, 100_000][(i % 3) as usize];
        let pos = local
            .iter()
            .position(|&r| r == me)
            .ok_or("not among the local peers")?;
        if local.len() > 1 {
            let right = local[(pos + 1) % local.len()];
            let left = local[(pos + local.len() - 1) % local.len()];
            exchange(&world_comm, i, bytes, right, left)?;
        }
        // And around the whole job: across nodes (verbs or TCP) as well.
        if i % 2 == 0 && size > 1 {
            exchange(
                &world_comm,
                i + (1 << 20),
                bytes,
                (me + 1) % size,
                (me + size - 1) % size,
            )?;
        }
    }
    wire.fence(Procs::All, FenceMode::SyncOnly, Some(WAIT))?;
    session.finalize()?;
    Ok(())
}

/// Round `i`'s collectives on `comm`, their results checked.
fn collectives(comm: &Communicator, i: u64) -> Res {
    let (me, n) = (u64::from(comm.rank()), u64::from(comm.size()));
    let mut sum = [0u64; 2];
    comm.allreduce(&[me, i], &mut sum, Op::Sum)?;
    if sum != [n * (n - 1) / 2, i * n] {
        return Err(format!("round {i}: allreduce gave {sum:?}").into());
    }
    let root = (i % n) as u32;
    let mut b = [if u64::from(root) == me { i * 3 + 1 } else { 0 }; 4];
    comm.bcast(&mut b, root)?;
    if b != [i * 3 + 1; 4] {
        return Err(format!("round {i}: bcast from rank {root} gave {b:?}").into());
    }
    comm.barrier()?;
    let mut all = vec![0u64; n as usize];
    comm.allgather(&[me * 1000 + i], &mut all)?;
    if (0..n).any(|r| all[r as usize] != r * 1000 + i) {
        return Err(format!("round {i}: allgather gave {all:?}").into());
    }
    Ok(())
}

/// A ring on `comm`: send to the right, receive from the left, check the bytes.
fn ring(comm: &Communicator, i: u64, bytes: usize) -> Res {
    let (r, n) = (comm.rank(), comm.size());
    if n < 2 {
        return Ok(());
    }
    exchange(comm, i, bytes, (r + 1) % n, (r + n - 1) % n)
}

fn exchange(comm: &Communicator, i: u64, bytes: usize, right: u32, left: u32) -> Res {
    let fill = |from: u32| -> Vec<u8> {
        (0..bytes)
            .map(|k| (k as u64 * 31 + i * 7 + u64::from(from)) as u8)
            .collect()
    };
    let out = fill(comm.rank());
    let mut got = vec![0u8; bytes];
    comm.scope(|s| -> Result<(), P2pError> {
        let r = s.irecv(&mut got, Source::Rank(left), Tag(i as u32))?;
        let w = s.isend(&out, right, Tag(i as u32))?;
        wait_all(vec![r, w]).map(|_| ())
    })?;
    if got != fill(left) {
        return Err(format!("round {i}: {bytes} bytes from rank {left} arrived changed").into());
    }
    Ok(())
}

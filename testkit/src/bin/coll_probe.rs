//! Collective scenarios the tests run under `weft run` (each prints what it saw; the test
//! judges):
//!
//! - `die BYTES STAMP [OP] [HOW]`: collectives OP (`allreduce` of BYTES, the default;
//!   `barrier`; `bcast` of BYTES from rank 0; `allgather` of BYTES each) in a loop on the
//!   world; at its 20th the last rank ends, having written the time to the file STAMP:
//!   HOW is `kill` (SIGKILL itself, the default), `exit3` (exit status 3), `exit0`
//!   (exit status 0 without finalizing) or `finalize` (finalize the fabric, then linger
//!   3 s and exit 0). Survivors print `rank R: <error> [<variant> <rank>] after N ms`
//!   (from that time to the error; the variant of `CollError` and the rank it names),
//!   then `rank R: then on a dup: <error> [<variant> <rank>]` for an allreduce on a dup
//!   of the world made before, or `rank R: no error` and exit 3.
//! - `run-ahead`: after a barrier the last rank sleeps 600 ms, then every rank runs 200
//!   bcasts of 8 bytes from rank 0 (the i-th carries i, checked by every member); rank 0
//!   prints `rank 0 run-ahead first 32 in X ms, all 200 in Y ms` (from the barrier), the
//!   others `rank R run-ahead ok`; then a bcast where rank 0 names rank 1 the root and
//!   the others rank 0: `rank R roots: <error>` (or `no error`), then a barrier and
//!   `rank R after the roots ok`.
//! - `mismatch [COUNT]`: an allreduce of COUNT u64s (default 8) where rank 1 gives one
//!   element more; every rank prints `rank R: <error>` (or `rank R: no error`), then
//!   `rank R: barrier after the mismatch ok`.
//! - `mismatch-bcast [ROOT LAST]`, `mismatch-gather`: a bcast of ROOT bytes (100) from
//!   rank 0 where the last rank expects LAST (ROOT + 1), or a gather to rank 0 of 4 bytes each where rank 1 sends 5; every
//!   rank prints `rank R: ok` (its data checked), `rank R: mismatch: <error>`,
//!   `rank R: aborted: <error>` or `rank R: other: <error>`, then
//!   `rank R: barrier after the mismatch ok`.
//! - `order`: rank 0 calls an allreduce where the others call a bcast, then a reduce
//!   where ranks 0 and 1 each name themselves the root: `rank R: <error>` (or
//!   `rank R: no error`) for each, then `rank R: barrier after the disorder ok`.
//! - `bad-root`: a bcast with a root outside the communicator: `rank R: <error>`.
//! - `ids CYCLES`: CYCLES rounds of dup, split and free, checking every context id is
//!   new, then a family past its depth limit and one past its count limit (the root
//!   server hands out the ids beyond): prints `rank R ids ok N` with the number of
//!   distinct ids, or the duplicate.
//! - `overlap`: concurrent splits of overlapping parents on two threads, then collectives
//!   on all of them: `rank R overlap ok`.
//! - `threads`: four threads, each running collectives on its own dup of the world:
//!   `rank R threads ok`.
//! - `barrier [ROUNDS]`: ROUNDS barriers on the world (default 200), one member arriving
//!   late in each (a different one each round, by up to 2 ms); each member notes when it
//!   entered and left each barrier (the machine's monotonic clock, which all processes
//!   of a node share), then an allgather of the notes: nobody left a barrier before the
//!   last one entered it. Prints `rank R barrier ok` or the round that failed.
//! - `self`: a message to oneself: `rank R self ok in N ms`.
//! - `exchange [ITERS]`: two ranks swap 8 bytes ITERS times (irecv, send, wait), the
//!   point-to-point core of a two-member barrier or allreduce, without any collective:
//!   `rank R exchange X us` (average per swap).
//! - `fence`: three rounds of put (Local, Remote, Global) + commit + a fabric fence
//!   (`Collectives::fence`) on the world, a server fence between rounds 2 and 3, then a
//!   fabric fence on each half of a split; after each, every rank reads every other's
//!   cards that its scope lets it see from this process alone (`GetOpts::local_only`:
//!   no server is asked) and checks the values of that round: `rank R fence ok`.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use weft::prelude::*;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// The `fence` scenario (see the module's documentation).
fn fence_rounds(fabric: &Fabric, world: &Communicator) -> Res<()> {
    let wire = fabric.wire();
    let me = world.rank();
    let card = |scope: &str, r: u32, round: u32| format!("{scope}{r}-{round}");
    let check = |c: &Communicator, round: u32| -> Res<()> {
        for i in 0..c.size() {
            let r = c.job_rank(i);
            if r == me {
                continue;
            }
            let same = wire.job().node_of(r) == Some(wire.node());
            for (scope, key, visible) in [
                ("L", "f.local", same),
                ("R", "f.remote", !same),
                ("G", "f.global", true),
            ] {
                let got = wire.get(r, key, GetOpts::default().local_only());
                match (visible, got) {
                    (true, Ok(Value::Str(v))) if v == card(scope, r, round) => {}
                    (false, Err(_)) => {}
                    // An older round's copy of an invisible key is not possible either:
                    // none was ever delivered.
                    (v, g) => {
                        return Err(format!(
                            "round {round}: {key} of rank {r} (visible: {v}): got {g:?}"
                        )
                        .into())
                    }
                }
            }
        }
        Ok(())
    };
    let put_round = |round: u32| -> Res<()> {
        wire.put(Scope::Local, "f.local", card("L", me, round))?;
        wire.put(Scope::Remote, "f.remote", card("R", me, round))?;
        wire.put(Scope::Global, "f.global", card("G", me, round))?;
        wire.commit()?;
        Ok(())
    };
    for round in 1..=3 {
        put_round(round)?;
        world.fence()?;
        check(world, round)?;
        if round == 2 {
            // A server fence in between: the servers' copies take over.
            wire.fence(Procs::All, FenceMode::Full, None)?;
            check(world, round)?;
            // (Nobody puts round 3 before everyone read round 2 from the servers' copies.)
            world.barrier()?;
        }
    }
    // Each half fences alone: its members see each other's round 4.
    let half = world
        .split(Some(me % 2), 0)?
        .ok_or("split with a color gave no communicator")?;
    put_round(4)?;
    half.fence()?;
    check(&half, 4)?;
    world.barrier()?;
    println!("rank {me} fence ok");
    Ok(())
}

/// CLOCK_MONOTONIC in nanoseconds (the same clock in every process of the machine).
fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rank = std::env::var("WEFT_RANK").unwrap_or_default();
    if let Err(e) = run(&args) {
        println!("rank {rank} failed: {e}");
        std::process::exit(1);
    }
}

fn run(args: &[String]) -> Res<()> {
    let fabric = Fabric::init()?;
    let world = fabric.world();
    let me = world.rank();
    let arg = |i: usize| args.get(i).map(String::as_str);
    match arg(0) {
        Some("die") => {
            let bytes: usize = arg(1).ok_or("die BYTES")?.parse()?;
            let stamp = arg(2).ok_or("die BYTES STAMP")?;
            let victim = world.size() - 1;
            let n = bytes / 8;
            let mine = vec![u64::from(me); n.max(1)];
            let mut out = vec![0u64; n.max(1)];
            let mut all = vec![0u64; n.max(1) * world.size() as usize];
            let dup = world.dup()?;
            for i in 0.. {
                if me == victim && i == 20 {
                    std::fs::write(stamp, now_ms().to_string())?;
                    match arg(4).unwrap_or("kill") {
                        "kill" => rustix::process::kill_process(
                            rustix::process::getpid(),
                            rustix::process::Signal::KILL,
                        )?,
                        "exit3" => std::process::exit(3),
                        "exit0" => std::process::exit(0),
                        "finalize" => {
                            drop((world, dup));
                            fabric.finalize()?;
                            std::thread::sleep(Duration::from_secs(3));
                            std::process::exit(0);
                        }
                        how => return Err(format!("die: unknown HOW {how}").into()),
                    }
                }
                let r = match arg(3).unwrap_or("allreduce") {
                    "barrier" => world.barrier(),
                    "bcast" => {
                        out.copy_from_slice(&mine);
                        world.bcast(&mut out, 0)
                    }
                    "allgather" => world.allgather(&mine, &mut all),
                    "allreduce" => world.allreduce(&mine, &mut out, Op::Sum),
                    op => return Err(format!("die: unknown OP {op}").into()),
                };
                if let Err(e) = r {
                    let died: u128 = std::fs::read_to_string(stamp)?.trim().parse()?;
                    let after = now_ms().saturating_sub(died);
                    let (variant, rank) = match &e {
                        CollError::MemberGone { rank, .. } => ("member-gone", *rank),
                        CollError::Aborted { rank, .. } => ("aborted", *rank),
                        CollError::Mismatch { .. } => ("mismatch", me),
                        _ => ("other", me),
                    };
                    println!("rank {me}: {e} [{variant} {rank}] after {after} ms");
                    // A communicator made before the end fails the same way.
                    if let Err(e) = dup.allreduce(&mine, &mut out, Op::Sum) {
                        let (variant, rank) = match &e {
                            CollError::MemberGone { rank, .. } => ("member-gone", *rank),
                            CollError::Aborted { rank, .. } => ("aborted", *rank),
                            _ => ("other", me),
                        };
                        println!("rank {me}: then on a dup: {e} [{variant} {rank}]");
                    }
                    std::process::exit(0);
                }
                if i > 100_000 {
                    break;
                }
            }
            println!("rank {me}: no error");
            std::process::exit(3);
        }
        Some("barrier") => {
            let rounds: usize = arg(1).map_or(Ok(200), str::parse)?;
            let n = world.size() as usize;
            let mut notes = vec![0u64; 2 * rounds];
            for r in 0..rounds {
                if r % n == me as usize {
                    std::thread::sleep(Duration::from_micros(200 + (r as u64 % 10) * 180));
                }
                notes[2 * r] = mono_ns();
                world.barrier()?;
                notes[2 * r + 1] = mono_ns();
            }
            let mut all = vec![0u64; 2 * rounds * n];
            world.allgather(&notes, &mut all)?;
            for r in 0..rounds {
                let last_in = (0..n)
                    .map(|p| all[p * 2 * rounds + 2 * r])
                    .max()
                    .unwrap_or(0);
                let first_out = (0..n)
                    .map(|p| all[p * 2 * rounds + 2 * r + 1])
                    .min()
                    .unwrap_or(0);
                if first_out < last_in {
                    return Err(format!(
                        "barrier round {r}: a member left {} ns before the last one entered",
                        last_in - first_out
                    )
                    .into());
                }
            }
            println!("rank {me} barrier ok");
        }
        Some("run-ahead") => {
            let n = world.size();
            world.barrier()?;
            let t = Instant::now();
            if me == n - 1 {
                std::thread::sleep(Duration::from_millis(600));
            }
            let mut first = Duration::ZERO;
            for i in 0..200u64 {
                let mut buf = if me == 0 { i } else { u64::MAX }.to_le_bytes();
                world.bcast(&mut buf, 0)?;
                if u64::from_le_bytes(buf) != i {
                    return Err(format!("rank {me}: bcast {i} gave {buf:?}").into());
                }
                if i == 31 {
                    first = t.elapsed();
                }
            }
            if me == 0 {
                println!(
                    "rank 0 run-ahead first 32 in {} ms, all 200 in {} ms",
                    first.as_millis(),
                    t.elapsed().as_millis()
                );
            } else {
                println!("rank {me} run-ahead ok");
            }
            // Then rank 0 names rank 1 the root, the others rank 0: nobody stamps.
            let mut buf = [0u8; 8];
            match world.bcast(&mut buf, u32::from(me == 0)) {
                Ok(()) => println!("rank {me} roots: no error"),
                Err(e) => println!("rank {me} roots: {e}"),
            }
            world.barrier()?;
            println!("rank {me} after the roots ok");
        }
        Some("mismatch-bcast") | Some("mismatch-gather") => {
            // bcast: the last rank expects one byte more than the root's 100 (or LAST
            // bytes where the others send and expect ROOT); gather: rank 1 sends 5 bytes
            // where the others (and the root) count 4 each.
            let n = world.size() as usize;
            let r = if arg(0) == Some("mismatch-bcast") {
                let root_len: usize = arg(1).map_or(Ok(100), str::parse)?;
                let last_len: usize = arg(2).map_or(Ok(root_len + 1), str::parse)?;
                let len = if me as usize == n - 1 {
                    last_len
                } else {
                    root_len
                };
                let mut buf = vec![if me == 0 { 7u8 } else { 0 }; len];
                let r = world.bcast(&mut buf, 0);
                if r.is_ok() && buf.iter().any(|&b| b != 7) {
                    return Err(format!("rank {me}: bcast gave wrong data").into());
                }
                r
            } else {
                let mine = vec![me as u8; 4 + usize::from(me == 1)];
                let mut all = vec![0u8; if me == 0 { 4 * n } else { 0 }];
                let r = world.gather(&mine, &mut all, 0);
                if r.is_ok() && me == 0 && (0..4 * n).any(|i| all[i] != (i / 4) as u8) {
                    return Err(format!("rank {me}: gather gave wrong data").into());
                }
                r
            };
            match r {
                Ok(()) => println!("rank {me}: ok"),
                Err(e @ CollError::Mismatch { .. }) => println!("rank {me}: mismatch: {e}"),
                Err(e @ CollError::Aborted { .. }) => println!("rank {me}: aborted: {e}"),
                Err(e) => println!("rank {me}: other: {e}"),
            }
            world.barrier()?;
            println!("rank {me}: barrier after the mismatch ok");
        }
        Some("mismatch") => {
            let count: usize = arg(1).map_or(Ok(8), str::parse)?;
            let n = count + usize::from(me == 1);
            let mine = vec![1u64; n];
            let mut out = vec![0u64; n];
            match world.allreduce(&mine, &mut out, Op::Sum) {
                Ok(()) => println!("rank {me}: no error"),
                Err(e) => println!("rank {me}: {e}"),
            }
            // The world stays usable for the next operation.
            world.barrier()?;
            println!("rank {me}: barrier after the mismatch ok");
        }
        Some("order") => {
            let report = |r: Result<(), CollError>| match r {
                Ok(()) => println!("rank {me}: no error"),
                Err(e) => println!("rank {me}: {e}"),
            };
            let mut buf = [1u64; 4];
            let mut out = [0u64; 4];
            report(if me == 0 {
                world.allreduce(&buf, &mut out, Op::Sum)
            } else {
                world.bcast(&mut buf, 0)
            });
            let root = u32::from(me != 0);
            report(world.reduce(&buf, &mut out, Op::Sum, root));
            world.barrier()?;
            println!("rank {me}: barrier after the disorder ok");
        }
        Some("bad-root") => {
            let mut buf = [0u8; 4];
            match world.bcast(&mut buf, world.size()) {
                Ok(()) => println!("rank {me}: no error"),
                Err(e) => println!("rank {me}: {e}"),
            }
        }
        Some("ids") => {
            let cycles: u32 = arg(1).ok_or("ids CYCLES")?.parse()?;
            let mut seen = HashSet::new();
            seen.insert(world.context_id());
            let mut fresh = |c: &Communicator, what: &str| -> Res<()> {
                let id = c.context_id();
                if !seen.insert(id) {
                    return Err(format!("{what}: context id {id:#x} seen before").into());
                }
                Ok(())
            };
            for i in 0..cycles {
                let d = world.dup()?;
                fresh(&d, &format!("dup {i}"))?;
                if i % 16 == 0 {
                    // Every member gets one id per color; split's children share none.
                    let s = world.split(Some(me % 2), 0)?.ok_or("no split")?;
                    fresh(&s, &format!("split {i}"))?;
                    s.barrier()?;
                    s.free()?;
                }
                d.free()?;
            }
            // A family down to its depth and count limits: deeper children come from the
            // server instead, and still work.
            let mut c = world.dup()?;
            fresh(&c, "chain")?;
            for depth in 0..6 {
                let next = c.dup()?;
                fresh(&next, &format!("chain depth {depth}"))?;
                c = next;
            }
            // 300 children of a grandchild of the world, whose level holds 255.
            let g = world.dup()?.dup()?;
            fresh(&g, "grandchild")?;
            let mut last = g.dup()?;
            fresh(&last, "wide")?;
            for k in 0..300 {
                let d = g.dup()?;
                fresh(&d, &format!("wide {k}"))?;
                last = d;
            }
            let mut x = [u64::from(me)];
            last.allreduce_in_place(&mut x, Op::Sum)?;
            let want = u64::from(world.size()) * u64::from(world.size() - 1) / 2;
            if x[0] != want {
                return Err(
                    format!("allreduce on the last child gave {}, not {want}", x[0]).into(),
                );
            }
            world.barrier()?;
            println!("rank {me} ids ok {}", seen.len());
        }
        Some("overlap") => {
            // Two overlapping parents (the world and a dup), each split on its own thread
            // at the same time; then collectives on every child.
            let dup = world.dup()?;
            let (a, b) = std::thread::scope(|s| -> Res<_> {
                let t = s.spawn(|| world.split(Some(me % 2), 0).map_err(|e| e.to_string()));
                let b = dup.split(Some(u32::from(me < world.size() / 2)), -(me as i32))?;
                let a = t.join().map_err(|_| "thread panicked")??;
                Ok((a.ok_or("no split")?, b.ok_or("no split")?))
            })?;
            let ids = [
                world.context_id(),
                dup.context_id(),
                a.context_id(),
                b.context_id(),
            ];
            let distinct: HashSet<u64> = ids.iter().copied().collect();
            if distinct.len() != ids.len() {
                return Err(format!("context ids collide: {ids:x?}").into());
            }
            std::thread::scope(|s| -> Res<()> {
                let t = s.spawn(|| -> Result<(), String> {
                    for _ in 0..200 {
                        let mut x = [1u32];
                        a.allreduce_in_place(&mut x, Op::Sum)
                            .map_err(|e| e.to_string())?;
                        if x[0] != a.size() {
                            return Err(format!("sum on a: {}", x[0]));
                        }
                    }
                    Ok(())
                });
                for _ in 0..200 {
                    let mut x = [1u32];
                    b.allreduce_in_place(&mut x, Op::Sum)?;
                    if x[0] != b.size() {
                        return Err(format!("sum on b: {}", x[0]).into());
                    }
                }
                t.join().map_err(|_| "thread panicked")??;
                Ok(())
            })?;
            world.barrier()?;
            println!("rank {me} overlap ok");
        }
        Some("threads") => {
            let comms: Vec<Communicator> = (0..4).map(|_| world.dup()).collect::<Result<_, _>>()?;
            std::thread::scope(|s| -> Res<()> {
                let hs: Vec<_> = comms
                    .iter()
                    .enumerate()
                    .map(|(t, c)| {
                        s.spawn(move || -> Result<(), String> {
                            let n = 1 + t * 1000;
                            for i in 0..100u64 {
                                let mine = vec![i + t as u64; n];
                                let mut out = vec![0u64; n];
                                c.allreduce(&mine, &mut out, Op::Sum)
                                    .map_err(|e| e.to_string())?;
                                let want = (i + t as u64) * u64::from(c.size());
                                if out.iter().any(|&x| x != want) {
                                    return Err(format!(
                                        "thread {t} iteration {i}: {} not {want}",
                                        out[0]
                                    ));
                                }
                                let mut b = vec![i; n];
                                c.bcast(&mut b, (i % u64::from(c.size())) as u32)
                                    .map_err(|e| e.to_string())?;
                                c.barrier().map_err(|e| e.to_string())?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                for h in hs {
                    h.join().map_err(|_| "thread panicked")??;
                }
                Ok(())
            })?;
            world.barrier()?;
            println!("rank {me} threads ok");
        }
        Some("self") => {
            // A send to oneself (a communicator of one, say): no card, no connection.
            let t = Instant::now();
            world.send(&[7u64], me, Tag(1))?;
            let mut got = [0u64];
            world.recv(&mut got, Source::Rank(me), Tag(1))?;
            if got[0] != 7 {
                return Err(format!("got {} from myself", got[0]).into());
            }
            println!("rank {me} self ok in {} ms", t.elapsed().as_millis());
        }
        Some("fence") => fence_rounds(&fabric, &world)?,
        Some("exchange") => {
            let iters: u32 = arg(1).map_or(Ok(10_000), str::parse)?;
            if world.size() != 2 {
                return Err("exchange needs 2 ranks".into());
            }
            let peer = 1 - me;
            let warm = iters / 10 + 1;
            let mut got = [0u64];
            let mut t = std::time::Instant::now();
            for i in 0..warm + iters {
                if i == warm {
                    world.barrier()?;
                    t = std::time::Instant::now();
                }
                world.scope(|s| {
                    let r = s.irecv(&mut got, Source::Rank(peer), Tag(5))?;
                    world.send(&[u64::from(i)], peer, Tag(5))?;
                    r.wait()
                })?;
                if got[0] != u64::from(i) {
                    return Err(format!("swap {i}: got {}", got[0]).into());
                }
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
            println!("rank {me} exchange {us:.2} us");
        }
        other => return Err(format!("unknown scenario {other:?}").into()),
    }
    fabric.finalize()?;
    Ok(())
}

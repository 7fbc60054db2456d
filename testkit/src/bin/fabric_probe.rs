//! The program the fabric's multi-process tests run under `weft run`, one scenario per
//! first argument; prints facts for the test and exits 1 on any surprise.

use std::io::Write;
use std::time::{Duration, Instant};

use weft::prelude::*;
use weft_wireup::{FenceMode, Procs};

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let out = match scenario.as_str() {
        "dead-peer" => dead_peer(),
        "dead-peer-rendezvous" => dead_peer_rendezvous(),
        "wildcard-cause" => wildcard_cause(),
        "dead-receiver-mid-transfer" => dead_mid_transfer(1),
        "flow-control" => flow_control(),
        "dead-sender-mid-transfer" => dead_mid_transfer(0),
        "errors" => errors(),
        "all-to-all" => all_to_all(),
        "cma" => cma(false),
        "cma-refused" => cma(true),
        "cma-split-refused" => cma_split_refused(),
        "split-busy-sender" => split_busy_sender(),
        "first-send-to-a-fencing-peer" => first_send_to_a_fencing_peer(),
        "first-send-to-a-getting-peer" => first_send_to_a_getting_peer(),
        "first-send-to-a-busy-peer" => first_send_to_a_busy_peer(),
        "slow-peer" => slow_peer(false),
        "busy-peer" => slow_peer(true),
        "wait-forever" => wait_forever(std::env::args().nth(2).as_deref().unwrap_or("recv")),
        other => Err(format!("unknown scenario {other:?}").into()),
    };
    if let Err(e) = out {
        eprintln!("fabric_probe {scenario}: {e}");
        std::process::exit(1);
    }
}

fn die() -> ! {
    let _ = std::io::stdout().flush();
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    std::thread::sleep(Duration::from_secs(60));
    std::process::exit(99)
}

/// Rank 1 dies while rank 0 waits to receive from it.
fn dead_peer() -> Res {
    let f = Fabric::init()?;
    let w = f.world();
    let mut x = [0u64];
    if w.rank() == 1 {
        w.send(&[1u64], 0, Tag(1))?;
        std::thread::sleep(Duration::from_millis(200));
        println!("rank 1 killing itself");
        die();
    }
    if w.rank() == 0 {
        w.recv(&mut x, Source::Rank(1), Tag(1))?;
        let t0 = Instant::now();
        match w.recv(&mut x, Source::Rank(1), Tag(2)) {
            Err(P2pError::PeerGone { rank: 1, reason }) => {
                println!(
                    "rank 0 saw rank 1 gone after {} ms: {reason}",
                    t0.elapsed().as_millis()
                );
            }
            other => return Err(format!("expected PeerGone naming rank 1, got {other:?}").into()),
        }
        // A wildcard receive fails too: with rank 1 gone no sender is left.
        match w.recv(&mut x, Source::Any, Tag::ANY) {
            Err(P2pError::PeerGone { rank: 1, .. }) => {
                println!("rank 0: wildcard receive failed too")
            }
            other => {
                return Err(format!("wildcard receive: expected PeerGone, got {other:?}").into())
            }
        }
    }
    // Exit 0 without finalizing, so that the launcher reports the killed rank as the
    // first failure (a non-zero exit here could race with it).
    std::process::exit(0);
}

/// Run with 3 ranks and `--keep-going`: rank 1 is terminated (SIGTERM, as the runtime
/// ends the rest of a failed job), then rank 2 exits with code 5. Rank 0's wildcard
/// receive fails once both are gone, naming the cause: rank 2.
fn wildcard_cause() -> Res {
    let f = Fabric::init()?;
    let w = f.world();
    let mut x = [0u64];
    match w.rank() {
        1 => {
            let _ = std::io::stdout().flush();
            let me = rustix::process::getpid();
            let _ = rustix::process::kill_process(me, rustix::process::Signal::TERM);
            std::thread::sleep(Duration::from_secs(60));
            std::process::exit(99)
        }
        2 => {
            while f.wire().gone_reason(1).is_none() {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::process::exit(5)
        }
        _ => match w.recv(&mut x, Source::Any, Tag::ANY) {
            Err(P2pError::PeerGone { rank, reason }) => {
                println!("rank 0: wildcard receive failed naming rank {rank}: {reason}")
            }
            other => return Err(format!("expected PeerGone, got {other:?}").into()),
        },
    }
    std::process::exit(0);
}

/// Rank 1 dies with a large send of rank 0's still waiting for it to be received. The
/// two meet first (a small message), so that the time reported is the survivor's alone:
/// under emulation one process can start, or finish its init, over a second after the other.
fn dead_peer_rendezvous() -> Res {
    let f = Fabric::init()?;
    let w = f.world();
    if w.rank() == 1 {
        w.recv(&mut [0u64], Source::Rank(0), Tag(2))?;
        std::thread::sleep(Duration::from_millis(300));
        println!("rank 1 killing itself");
        die();
    }
    if w.rank() == 0 {
        let big = vec![7u8; 4 << 20];
        w.send(&[1u64], 1, Tag(2))?;
        let t0 = Instant::now();
        match w.send(&big, 1, Tag(1)) {
            Err(P2pError::PeerGone { rank: 1, reason }) => {
                println!(
                    "rank 0 saw rank 1 gone after {} ms: {reason}",
                    t0.elapsed().as_millis()
                );
            }
            other => return Err(format!("expected PeerGone naming rank 1, got {other:?}").into()),
        }
    }
    // Exit 0 without finalizing, so that the launcher reports the killed rank as the
    // first failure (a non-zero exit here could race with it).
    std::process::exit(0);
}

/// Rank `victim` is killed while rank 0 sends rank 1 a 512 MiB message (the receive is
/// posted and the payload is moving): the survivor's wait fails naming the dead rank,
/// and a receive that fails was not handed a half-written buffer as complete.
fn dead_mid_transfer(victim: u32) -> Res {
    const LEN: usize = 512 << 20;
    let f = Fabric::init()?;
    let w = f.world();
    let me = w.rank();
    let mut big = vec![if me == 0 { 7u8 } else { 0 }; if me < 2 { LEN } else { 0 }];
    // Both ranks are up, their buffers ready (the first message also connects them).
    if me == 0 {
        w.send(&[1u8], 1, Tag(1))?;
    } else if me == 1 {
        w.recv(&mut [0u8], Source::Rank(0), Tag(1))?;
    }
    if me == victim {
        // Killed from another thread while the transfer runs.
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(40));
            println!("rank {victim} killing itself mid-transfer");
            die();
        });
    }
    let t0 = Instant::now();
    let r = if me == 0 {
        w.send(&big, 1, Tag(2))
    } else if me == 1 {
        w.recv(&mut big, Source::Rank(0), Tag(2)).map(|st| {
            if st.count != LEN || big.iter().any(|&b| b != 7) {
                eprintln!("rank 1: a completed receive holds wrong data");
                std::process::exit(1);
            }
        })
    } else {
        Ok(())
    };
    if me == victim {
        // Finished before the kill (a fast machine): nothing was tested.
        std::thread::sleep(Duration::from_secs(5));
        return Err(format!("rank {me}: the transfer ended before the kill: {r:?}").into());
    }
    match r {
        Err(P2pError::PeerGone { rank, reason }) if rank == victim => println!(
            "rank {me} saw rank {victim} gone after {} ms: {reason}",
            t0.elapsed().as_millis()
        ),
        other => {
            return Err(format!("expected PeerGone naming rank {victim}, got {other:?}").into())
        }
    }
    std::process::exit(0);
}

/// Rank 0 sends rank 1 2000 eager-sized messages (60 KiB, 120 MB in all) while rank 1
/// does not receive for 1.5 s: rank 0's sends must stall once the buffers on the way are
/// full (no unbounded queue), then everything arrives intact and in order.
fn flow_control() -> Res {
    const N: u32 = 2000;
    const LEN: usize = 60 << 10;
    let f = Fabric::init()?;
    let w = f.world();
    match w.rank() {
        0 => {
            w.send(&[0u8], 1, Tag(1))?;
            let t0 = Instant::now();
            let mut early = 0;
            let mut msg = vec![0u8; LEN];
            for i in 0..N {
                msg[..4].copy_from_slice(&i.to_le_bytes());
                w.send(&msg, 1, Tag(2))?;
                if t0.elapsed() < Duration::from_secs(1) {
                    early += 1;
                }
            }
            println!("rank 0 sent {early} of {N} before the receiver started");
        }
        1 => {
            w.recv(&mut [0u8], Source::Rank(0), Tag(1))?;
            std::thread::sleep(Duration::from_millis(1500));
            let mut msg = vec![0u8; LEN];
            for i in 0..N {
                w.recv(&mut msg, Source::Rank(0), Tag(2))?;
                let got = u32::from_le_bytes(msg[..4].try_into()?);
                if got != i {
                    return Err(format!("message {i} arrived as {got}").into());
                }
            }
        }
        _ => {}
    }
    println!("rank {} ok", w.rank());
    f.finalize()?;
    Ok(())
}

/// Clear errors for bad arguments, then a clean exchange.
fn errors() -> Res {
    let f = Fabric::init()?;
    let w = f.world();
    let size = w.size();
    println!(
        "rank {} outside: {}",
        w.rank(),
        w.send(&[1u8], size + 2, Tag(0)).unwrap_err()
    );
    println!(
        "rank {} anytag: {}",
        w.rank(),
        w.send(&[1u8], 0, Tag::ANY).unwrap_err()
    );
    let peer = (w.rank() + 1) % size;
    let from = (w.rank() + size - 1) % size;
    w.send(&[0u8; 300], peer, Tag(4))?;
    let mut small = [0u8; 3];
    println!(
        "rank {} truncated: {}",
        w.rank(),
        w.recv(&mut small, Source::Rank(from), Tag(4)).unwrap_err()
    );
    println!("rank {} ok", w.rank());
    f.finalize()?;
    Ok(())
}

/// Every rank sends a distinct message to every other, all non-blocking.
fn all_to_all() -> Res {
    let f = Fabric::init()?;
    let w = f.world();
    let (me, size) = (w.rank(), w.size());
    let outs: Vec<Vec<u32>> = (0..size)
        .map(|d| vec![me * 1000 + d; 1 + (d as usize * 5000)])
        .collect();
    let mut ins: Vec<Vec<u32>> = (0..size)
        .map(|_| vec![0u32; 1 + me as usize * 5000])
        .collect();
    w.scope(|sc| -> Result<(), P2pError> {
        let mut reqs = Vec::new();
        for (s, b) in ins.iter_mut().enumerate() {
            reqs.push(sc.irecv(b, Source::Rank(s as u32), Tag(9))?);
        }
        for (d, b) in outs.iter().enumerate() {
            reqs.push(sc.isend(b, d as u32, Tag(9))?);
        }
        wait_all(reqs)?;
        Ok(())
    })?;
    for (s, b) in ins.iter().enumerate() {
        if b.iter().any(|&v| v != s as u32 * 1000 + me) {
            return Err(format!("rank {me}: data from {s} is wrong").into());
        }
    }
    println!("rank {me} ok");
    f.finalize()?;
    Ok(())
}

/// A split single copy whose sender may not write: rank 1 reads 32 KiB from rank 0 by
/// CMA (proving that it may), then makes itself non-dumpable, so that (without
/// CAP_SYS_PTRACE) rank 0's process_vm_writev into it fails. Rank 0's 1 MiB + 4321 bytes
/// must still arrive intact, rank 1 reading the tail itself.
/// Rank 0 starts a 4 MiB send (split between the two: rank 1 reads the head, rank 0 is
/// asked to write the tail) and then computes for 2 s outside any Weft call: rank 1's
/// receive completes long before, rank 1 taking the tail over; rank 0's wait then ends.
fn split_busy_sender() -> Res {
    let f = Fabric::init()?;
    let w = f.world();
    let warm: Vec<u8> = (0..1usize << 20).map(|i| (i * 7 % 253) as u8).collect();
    let data: Vec<u8> = (0..4usize << 20).map(|i| (i * 13 % 251) as u8).collect();
    if w.rank() == 0 {
        // A first single-copy read proves that CMA works with this peer (splits need it).
        w.send(&warm, 1, Tag(0))?;
        w.scope(|s| -> Res {
            let r = s.isend(&data, 1, Tag(2))?;
            std::thread::sleep(Duration::from_secs(2));
            r.wait()?;
            Ok(())
        })?;
    } else if w.rank() == 1 {
        let mut got = vec![0u8; warm.len()];
        w.recv(&mut got, Source::Rank(0), Tag(0))?;
        let mut got = vec![0u8; data.len()];
        // Rank 0 is computing by the time this receive is posted.
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        w.recv(&mut got, Source::Rank(0), Tag(2))?;
        let ms = t0.elapsed().as_millis();
        if got != data {
            return Err("the split message arrived corrupted".into());
        }
        println!("rank 1 received 4 MiB from a busy sender in {ms} ms");
    }
    println!("rank {} ok", w.rank());
    f.finalize()?;
    Ok(())
}

fn cma_split_refused() -> Res {
    let f = Fabric::init()?;
    let w = f.world();
    let small: Vec<u8> = (0..32usize << 10).map(|i| (i * 7 % 253) as u8).collect();
    let data: Vec<u8> = (0..(1usize << 20) + 4321)
        .map(|i| (i * 13 % 251) as u8)
        .collect();
    if w.rank() == 0 {
        w.send(&small, 1, Tag(0))?;
        let mut go = [0u8];
        w.recv(&mut go, Source::Rank(1), Tag(1))?;
        w.send(&data, 1, Tag(2))?;
    } else if w.rank() == 1 {
        let mut got = vec![0u8; small.len()];
        w.recv(&mut got, Source::Rank(0), Tag(0))?;
        if got != small || f.rendezvous_copy() != "cma" {
            return Err("the 32 KiB message did not arrive intact by cma".into());
        }
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
        w.send(&[1u8], 0, Tag(1))?;
        let mut got = vec![0u8; data.len()];
        w.recv(&mut got, Source::Rank(0), Tag(2))?;
        if got != data {
            return Err("the split message arrived corrupted".into());
        }
        println!(
            "rank 1 received {} bytes by {}",
            data.len(),
            f.rendezvous_copy()
        );
    }
    f.finalize()?;
    Ok(())
}

/// Rank 0 sends 1 MiB to rank 1 with WEFT_SHM_SINGLE_COPY=cma. With `refuse`, rank 0 first
/// makes itself non-dumpable, so that (without CAP_SYS_PTRACE) the kernel refuses rank 1's
/// process_vm_readv: the transfer must still complete, through the pipelined copy.
fn cma(refuse: bool) -> Res {
    let f = Fabric::init()?;
    let w = f.world();
    let data: Vec<u8> = (0..1usize << 20).map(|i| (i * 13 % 251) as u8).collect();
    if w.rank() == 0 {
        if refuse {
            rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
        }
        w.send(&[1u8], 1, Tag(0))?;
        w.send(&data, 1, Tag(1))?;
    } else if w.rank() == 1 {
        let mut go = [0u8];
        w.recv(&mut go, Source::Rank(0), Tag(0))?;
        let mut got = vec![0u8; 1 << 20];
        w.recv(&mut got, Source::Rank(0), Tag(1))?;
        if got != data {
            return Err("the 1 MiB message arrived corrupted".into());
        }
        println!("rank 1 received 1 MiB by {}", f.rendezvous_copy());
    }
    f.finalize()?;
    Ok(())
}

/// Rank 1 is blocked in a wire-up fence (longer than a verbs handshake may take) when
/// rank 0 first sends to it: the fence must keep rank 1 answering its peers, so the
/// send completes, rank 0 joins the fence, and rank 1 then receives the message.
fn first_send_to_a_fencing_peer() -> Res {
    let f = Fabric::init()?;
    let w = f.world();
    let wire = f.wire();
    let fence = || {
        wire.fence(
            Procs::All,
            FenceMode::SyncOnly,
            Some(Duration::from_secs(60)),
        )
    };
    match w.rank() {
        0 => {
            timed_first_send(&w)?;
            fence()?;
        }
        1 => {
            fence()?;
            let mut x = [0u64];
            w.recv(&mut x, Source::Rank(0), Tag(5))?;
            if x[0] != 42 {
                return Err(format!("got {x:?}").into());
            }
        }
        _ => fence()?,
    }
    println!("rank {} ok", w.rank());
    f.finalize()?;
    Ok(())
}

/// Rank 0's first send to rank 1, 300 ms after start (rank 1 is busy elsewhere by then),
/// with how long it took.
fn timed_first_send(w: &Communicator) -> Res {
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    w.send(&[42u64], 1, Tag(5))?;
    println!("rank 0 first send took {} ms", t0.elapsed().as_millis());
    Ok(())
}

/// Rank 1 waits in a get for a key rank 0 commits only after its first send to rank 1
/// completed: the send needs rank 1 to answer (a TCP handshake) while it waits in the
/// get, so the get must keep the fabric progressing.
fn first_send_to_a_getting_peer() -> Res {
    let f = Fabric::init()?;
    let w = f.world();
    let wire = f.wire();
    match w.rank() {
        0 => {
            timed_first_send(&w)?;
            wire.put(Scope::Global, "after-send", 1u64)?;
            wire.commit()?;
        }
        1 => {
            let got = wire.get(
                0,
                "after-send",
                GetOpts::default().timeout(Duration::from_secs(60)),
            )?;
            if got != Value::U64(1) {
                return Err(format!("after-send is {got:?}").into());
            }
            let mut x = [0u64];
            w.recv(&mut x, Source::Rank(0), Tag(5))?;
            if x[0] != 42 {
                return Err(format!("got {x:?}").into());
            }
        }
        _ => {}
    }
    wire.fence(
        Procs::All,
        FenceMode::SyncOnly,
        Some(Duration::from_secs(60)),
    )?;
    println!("rank {} ok", w.rank());
    f.finalize()?;
    Ok(())
}

/// Rank 1 computes for 3 s (outside any Weft call) while rank 0 first sends to it; with
/// a short handshake timeout the send must still complete once rank 1 enters a call: a
/// live peer is never given up.
fn first_send_to_a_busy_peer() -> Res {
    let f = Fabric::init()?;
    let w = f.world();
    match w.rank() {
        0 => {
            let t0 = Instant::now();
            w.send(&[7u64], 1, Tag(6))?;
            println!("rank 0 first send took {} ms", t0.elapsed().as_millis());
        }
        1 => {
            std::thread::sleep(Duration::from_secs(3));
            let mut x = [0u64];
            w.recv(&mut x, Source::Rank(0), Tag(6))?;
            if x[0] != 7 {
                return Err(format!("got {x:?}").into());
            }
        }
        _ => {}
    }
    println!("rank {} ok", w.rank());
    f.finalize()?;
    Ok(())
}

/// Rank 2 starts its fabric 3 s late. Rank 0's first send to it waits for its card; a
/// second thread of rank 0 ping-pongs with rank 1 meanwhile, and must not be stalled by
/// that wait (the card is fetched without the engine lock).
/// With `busy`, rank 2 starts its fabric at once but then computes for 3 s outside any
/// Weft call: rank 0's first send waits for the connection's handshake (verbs, TCP), and
/// that wait must not stall rank 0's other thread either.
fn slow_peer(busy: bool) -> Res {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let me: u32 = std::env::var("WEFT_RANK")?.parse()?;
    if me == 2 && !busy {
        std::thread::sleep(Duration::from_secs(3));
    }
    let f = Fabric::init()?;
    if me == 2 && busy {
        std::thread::sleep(Duration::from_secs(3));
    }
    let w = f.world();
    match me {
        0 => {
            let done = AtomicBool::new(false);
            let trips = AtomicU64::new(0);
            let (waited, meanwhile) = std::thread::scope(|s| {
                let pinger = s.spawn(|| -> Result<(), P2pError> {
                    let mut x = [0u64];
                    while !done.load(Ordering::Relaxed) {
                        w.send(&[1u64], 1, Tag(1))?;
                        w.recv(&mut x, Source::Rank(1), Tag(1))?;
                        trips.fetch_add(1, Ordering::Relaxed);
                    }
                    w.send(&[u64::MAX], 1, Tag(1))
                });
                std::thread::sleep(Duration::from_millis(200));
                let t0 = Instant::now();
                let before = trips.load(Ordering::Relaxed);
                let sent = w.send(&[42u64], 2, Tag(9));
                let waited = t0.elapsed();
                let meanwhile = trips.load(Ordering::Relaxed) - before;
                done.store(true, Ordering::Relaxed);
                let pinged = pinger.join().map_err(|_| "pinger panicked");
                sent.map(|_| (waited, meanwhile))
                    .map_err(|e| e.to_string())
                    .and_then(|r| {
                        pinged.map_err(str::to_owned)?.map_err(|e| e.to_string())?;
                        Ok(r)
                    })
            })?;
            println!(
                "rank 0 slow-peer: first send waited {} ms, {meanwhile} round trips with rank 1 meanwhile",
                waited.as_millis()
            );
        }
        1 => {
            let mut x = [0u64];
            loop {
                w.recv(&mut x, Source::Rank(0), Tag(1))?;
                if x[0] == u64::MAX {
                    break;
                }
                w.send(&x, 0, Tag(1))?;
            }
        }
        _ => {
            let mut x = [0u64];
            w.recv(&mut x, Source::Rank(0), Tag(9))?;
            if x[0] != 42 {
                return Err(format!("got {x:?}").into());
            }
        }
    }
    println!("rank {me} ok");
    f.finalize()?;
    Ok(())
}

/// Every rank waits for what never comes (the test kills a server meanwhile: its ranks
/// must notice and end). `recv`: a message from its node partner; `probe`: a probe for a
/// message from any source; `bcast`: a broadcast of the world from the first rank of
/// the second node (two nodes, ranks mapped by slot), which never joins it but waits
/// for a message instead: the rest of its node wait in shared memory for it.
fn wait_forever(how: &str) -> Res {
    let f = Fabric::init()?;
    let w = f.world();
    let local = f.wire().local_peers().to_vec();
    let me = w.rank();
    let pos = local
        .iter()
        .position(|&r| r == me)
        .ok_or("not a local peer")?;
    let partner = local[(pos + 1) % local.len()];
    if how == "bcast" {
        // The node's shared-memory collective is set up by the first collective.
        w.barrier()?;
    }
    println!("rank {me} waiting");
    std::io::stdout().flush()?;
    let mut x = [0u8];
    match how {
        "recv" => {
            w.recv(&mut x, Source::Rank(partner), Tag(77))?;
        }
        "probe" => {
            w.probe(Source::Any, Tag(77))?;
        }
        "bcast" if me == w.size() / 2 => {
            w.recv(&mut x, Source::Rank(partner), Tag(77))?;
        }
        "bcast" => {
            w.bcast(&mut x, w.size() / 2)?;
        }
        other => return Err(format!("unknown way to wait {other:?}").into()),
    }
    Err("what nobody sent arrived".into())
}

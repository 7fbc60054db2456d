//! The program the session tests run under `weft run`: one scenario per first argument.
//! Each scenario checks what it can itself and prints facts for the test to assert on;
//! any surprise is an error message and exit status 1.

use std::time::{Duration, Instant};

use weft::prelude::*;
use weft_fabric::{CommError, SessionError};
use weft_wireup::{FenceError, FenceMode, Procs};

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().map(String::as_str).unwrap_or("");
    let out = match scenario {
        "groups" => groups(),
        "two-sessions" => two_sessions(),
        "standard-example" => standard_example(),
        "subcomm" => subcomm(),
        "finalize-sync" => finalize_sync(),
        "thread" => thread(),
        "fatal" => fatal(),
        "split" => split(),
        "fabric-comm" => fabric_comm(),
        "reinit" => reinit(),
        "end" => end(args.get(1).map(String::as_str).unwrap_or("")),
        other => Err(format!("unknown scenario {other:?}").into()),
    };
    if let Err(e) = out {
        eprintln!("session_probe {scenario}: {e}");
        std::process::exit(1);
    }
}

fn session() -> Result<Session, SessionError> {
    Session::init(Info::new(), ErrHandler::Return)
}

fn check(cond: bool, what: &str) -> Res {
    if cond {
        Ok(())
    } else {
        Err(format!("check failed: {what}").into())
    }
}

/// Process sets and group operations (MPI semantics), on a 4-process job.
fn groups() -> Res {
    let s = session()?;
    let r = s.fabric().wire().rank();
    let names = s.pset_names();
    for n in ["weft://world", "weft://self", "mpi://WORLD", "mpi://SELF"] {
        check(names.iter().any(|x| x == n), n)?;
    }
    check(s.pset_info("weft://world")?.size == 4, "world size 4")?;
    check(s.pset_info("mpi://SELF")?.size == 1, "self size 1")?;
    check(
        matches!(s.pset_info("nope"), Err(SessionError::NoSuchPset { .. })),
        "unknown pset is an error",
    )?;
    let world = s.group_from_pset("weft://world")?;
    let me = s.group_from_pset("weft://self")?;
    check(world.size() == 4 && world.rank() == Some(r), "world group")?;
    check(me.members() == [r], "self group")?;
    let rev = world.incl(&[3, 2, 1, 0])?;
    check(rev.members() == [3, 2, 1, 0], "incl order")?;
    check(world.compare(&rev) == GroupCompare::Similar, "similar")?;
    check(
        world.compare(&world.clone()) == GroupCompare::Ident,
        "ident",
    )?;
    let odd = world.excl(&[0, 2])?;
    check(odd.members() == [1, 3], "excl")?;
    check(world.compare(&odd) == GroupCompare::Unequal, "unequal")?;
    let u = odd.union(&world.incl(&[0, 1])?)?;
    check(u.members() == [1, 3, 0], "union order")?;
    check(
        world.intersection(&odd)?.members() == [1, 3],
        "intersection",
    )?;
    check(world.difference(&odd)?.members() == [0, 2], "difference")?;
    check(
        world.translate_ranks(&[0, 1, 3], &rev)? == [Some(3), Some(2), Some(0)],
        "translate to reversed",
    )?;
    check(
        world.translate_ranks(&[0, 1], &odd)? == [None, Some(0)],
        "translate to odd",
    )?;
    check(
        matches!(world.incl(&[1, 1]), Err(SessionError::BadRanks { .. })),
        "duplicate ranks refused",
    )?;
    check(
        matches!(world.excl(&[4]), Err(SessionError::BadRanks { .. })),
        "out of range refused",
    )?;
    let other = session()?;
    let w2 = other.group_from_pset("weft://world")?;
    check(
        matches!(
            world.union(&w2),
            Err(SessionError::DifferentSessions { .. })
        ),
        "groups of two sessions do not mix",
    )?;
    let info = s.info();
    println!(
        "rank {r} groups ok sessions {} and {}",
        info.get("weft.session_id").unwrap_or("?"),
        other.info().get("weft.session_id").unwrap_or("?")
    );
    other.finalize()?;
    s.finalize()?;
    Ok(())
}

/// Two sessions side by side in every process, a communicator from each over the same
/// processes with the same tag; messages on one never reach the other.
fn two_sessions() -> Res {
    let a = session()?;
    let b = Session::init(
        Info::new().thread_level(ThreadLevel::Multiple),
        ErrHandler::Return,
    )?;
    let ca = Communicator::create_from_group(
        &a.group_from_pset("mpi://WORLD")?,
        "t",
        ErrHandler::Return,
    )?;
    let cb = Communicator::create_from_group(
        &b.group_from_pset("weft://world")?,
        "t",
        ErrHandler::Return,
    )?;
    check(ca.context_id() != cb.context_id(), "distinct PGCIDs")?;
    let (r, n) = (ca.rank(), ca.size());
    let right = (r + 1) % n;
    // Same message tag on both; receive on b first.
    ca.send(&[100 + u64::from(r)], right, Tag(1))?;
    cb.send(&[200 + u64::from(r)], right, Tag(1))?;
    let left = (r + n - 1) % n;
    let (mut x, mut y) = ([0u64], [0u64]);
    cb.recv(&mut y, Source::Any, Tag(1))?;
    ca.recv(&mut x, Source::Any, Tag(1))?;
    check(
        x[0] == 100 + u64::from(left) && y[0] == 200 + u64::from(left),
        "messages stayed on their communicator",
    )?;
    println!(
        "rank {r} two sessions ok levels {} {} pgcids {} {}",
        a.thread_level(),
        b.thread_level(),
        ca.context_id(),
        cb.context_id()
    );
    ca.disconnect()?;
    cb.free()?;
    b.finalize()?;
    a.finalize()?;
    Ok(())
}

/// The MPI-4 standard's three-process shape: process 0 has one session, processes 1 and
/// 2 have two sessions each; two communicators (A over {0,1} and B over {0,2}) are both
/// made from process 0's one session, then only freed. Finalizing process 0's session
/// synchronises with both peers at once: process 1 finalizes late, and process 2 must
/// not wait for it.
fn standard_example() -> Res {
    let s1 = session()?;
    let r = s1.fabric().wire().rank();
    let world = s1.group_from_pset("weft://world")?;
    let t0 = Instant::now();
    match r {
        0 => {
            let a =
                Communicator::create_from_group(&world.incl(&[0, 1])?, "A", ErrHandler::Return)?;
            let b =
                Communicator::create_from_group(&world.incl(&[0, 2])?, "B", ErrHandler::Return)?;
            a.send(&[1u8], 1, Tag(0))?;
            b.send(&[2u8], 1, Tag(0))?;
            a.free()?;
            b.free()?;
            s1.finalize()?;
        }
        1 | 2 => {
            // The second session is made first and holds the communicator.
            let s2 = session()?;
            let g = s2.group_from_pset("weft://world")?;
            let (tag, ranks) = if r == 1 { ("A", [0, 1]) } else { ("B", [0, 2]) };
            let c = Communicator::create_from_group(&g.incl(&ranks)?, tag, ErrHandler::Return)?;
            let mut got = [0u8];
            c.recv(&mut got, Source::Rank(0), Tag(0))?;
            check(u32::from(got[0]) == r, "message on the right communicator")?;
            c.free()?;
            s1.finalize()?; // holds nothing: local
            if r == 1 {
                std::thread::sleep(Duration::from_millis(600));
            }
            let t = Instant::now();
            s2.finalize()?;
            println!("rank {r} finalize took {} ms", t.elapsed().as_millis());
        }
        _ => return Err("run with -n 3".into()),
    }
    println!(
        "rank {r} standard example ok after {} ms",
        t0.elapsed().as_millis()
    );
    Ok(())
}

/// Communicators over a permuted group and over a subset: ranks and statuses are in
/// communicator ranks; a process outside the group gets a clear error.
fn subcomm() -> Res {
    let s = session()?;
    let world = s.group_from_pset("weft://world")?;
    let me = s.fabric().wire().rank();
    let rev =
        Communicator::create_from_group(&world.incl(&[3, 2, 1, 0])?, "rev", ErrHandler::Return)?;
    check(rev.rank() == 3 - me, "reversed rank")?;
    // Ring on the reversed communicator in its own ranks.
    let (r, n) = (rev.rank(), rev.size());
    rev.send(&[r], (r + 1) % n, Tag(3))?;
    let mut got = [0u32];
    let st = rev.recv(&mut got, Source::Any, Tag(3))?;
    check(
        st.source == (r + n - 1) % n && got[0] == st.source,
        "status in comm ranks",
    )?;
    let odd = world.excl(&[0, 2])?;
    if me % 2 == 1 {
        let c = Communicator::create_from_group(&odd, "odd", ErrHandler::Return)?;
        let peer = 1 - c.rank();
        c.send(&[me], peer, Tag(4))?;
        let mut x = [0u32];
        let st = c.recv(&mut x, Source::Rank(peer), Tag(4))?;
        check(
            st.source == peer && x[0] == odd.members()[peer as usize],
            "odd pair",
        )?;
        check(
            matches!(
                c.send(&[0u8], 2, Tag(1)),
                Err(P2pError::InvalidRank { rank: 2, size: 2 })
            ),
            "rank outside the subcomm",
        )?;
        c.disconnect()?;
    } else {
        check(
            matches!(
                Communicator::create_from_group(&odd, "odd", ErrHandler::Return),
                Err(CommError::NotMember { .. })
            ),
            "non-member refused",
        )?;
    }
    check(
        matches!(s.fabric().world().free(), Err(CommError::Predefined)),
        "world cannot be freed",
    )?;
    println!("rank {me} subcomm ok rank {r}");
    rev.disconnect()?;
    s.finalize()?;
    Ok(())
}

/// Session finalize is local when every communicator was disconnected, and waits for the
/// peers when one was only freed.
fn finalize_sync() -> Res {
    let me = Fabric::init()?.wire().rank();
    // Round 1: disconnected: finalize is local even though rank 1 is late.
    let s = session()?;
    let c = Communicator::create_from_group(
        &s.group_from_pset("weft://world")?,
        "d",
        ErrHandler::Return,
    )?;
    c.disconnect()?;
    if me == 1 {
        std::thread::sleep(Duration::from_millis(500));
    }
    let t = Instant::now();
    s.finalize()?;
    let local_ms = t.elapsed().as_millis();
    // Round 2: only freed: finalize waits for rank 1, which is late again.
    let s = session()?;
    let c = Communicator::create_from_group(
        &s.group_from_pset("weft://world")?,
        "f",
        ErrHandler::Return,
    )?;
    c.free()?;
    if me == 1 {
        std::thread::sleep(Duration::from_millis(500));
    }
    let t = Instant::now();
    s.finalize()?;
    let sync_ms = t.elapsed().as_millis();
    println!("rank {me} local {local_ms} ms sync {sync_ms} ms");
    Ok(())
}

/// Threads: sessions made concurrently from several threads (the process's first
/// fabric init among them), each at its own thread level; a communicator per thread with
/// its own tag, rings on all of them at once; then every thread on one shared
/// communicator at once; and a receive on one thread that only a later send on another
/// thread of the same process can satisfy (a wait loop must let go of the engine).
fn thread() -> Res {
    const THREADS: usize = 4;
    const ROUNDS: u64 = 300;
    let levels = [
        ThreadLevel::Single,
        ThreadLevel::Funneled,
        ThreadLevel::Serialized,
        ThreadLevel::Multiple,
    ];
    let start = std::sync::Barrier::new(THREADS);
    let shared: std::sync::OnceLock<Communicator> = std::sync::OnceLock::new();
    let made = std::sync::Barrier::new(THREADS);
    let outcome: Vec<Result<String, String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (start, made, shared) = (&start, &made, &shared);
                let level = levels[t];
                sc.spawn(move || -> Result<String, String> {
                    let fail = |e: &dyn std::fmt::Display| format!("thread {t}: {e}");
                    start.wait();
                    let s = Session::init(Info::new().thread_level(level), ErrHandler::Return)
                        .map_err(|e| fail(&e))?;
                    if s.thread_level() != level {
                        return Err(fail(&format!("provided {} for {level}", s.thread_level())));
                    }
                    let world = s.group_from_pset("weft://world").map_err(|e| fail(&e))?;
                    let comm = Communicator::create_from_group(
                        &world,
                        &format!("thread-{t}"),
                        ErrHandler::Return,
                    )
                    .map_err(|e| fail(&e))?;
                    let (r, n) = (comm.rank(), comm.size());
                    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
                    // A ring per thread, all at once, each on its own communicator.
                    for i in 0..ROUNDS {
                        let v = [u64::from(r) << 32 | i, t as u64];
                        let mut got = [0u64; 2];
                        comm.scope(|sc| {
                            let rq = sc.irecv(&mut got, Source::Rank(left), Tag(5))?;
                            comm.send(&v, right, Tag(5))?;
                            rq.wait()
                        })
                        .map_err(|e| fail(&e))?;
                        if got != [u64::from(left) << 32 | i, t as u64] {
                            return Err(fail(&format!("round {i}: got {got:?} from rank {left}")));
                        }
                    }
                    // One communicator, every thread at once, a message tag per thread.
                    if t == 0 {
                        let c = Communicator::create_from_group(
                            &world,
                            "thread-shared",
                            ErrHandler::Return,
                        )
                        .map_err(|e| fail(&e))?;
                        let _ = shared.set(c);
                    }
                    made.wait();
                    let c = shared
                        .get()
                        .ok_or_else(|| fail(&"no shared communicator"))?;
                    for i in 0..ROUNDS {
                        c.send(&[i, t as u64], right, Tag(100 + t as u32))
                            .map_err(|e| fail(&e))?;
                        let mut got = [0u64; 2];
                        let st = c
                            .recv(&mut got, Source::Rank(left), Tag(100 + t as u32))
                            .map_err(|e| fail(&e))?;
                        if got != [i, t as u64] || st.source != left {
                            return Err(fail(&format!("shared round {i}: got {got:?}")));
                        }
                    }
                    // Thread 0 waits for a message to itself that thread 1 sends 100 ms
                    // later: it must not hold the engine meanwhile.
                    match t {
                        0 => {
                            let mut got = [0u64; 1];
                            c.recv(&mut got, Source::Rank(r), Tag(99))
                                .map_err(|e| fail(&e))?;
                            if got[0] != 0x5e1f {
                                return Err(fail(&format!("self message {got:?}")));
                            }
                        }
                        1 => {
                            std::thread::sleep(Duration::from_millis(100));
                            c.send(&[0x5e1fu64], r, Tag(99)).map_err(|e| fail(&e))?;
                        }
                        _ => {}
                    }
                    comm.disconnect().map_err(|e| fail(&e))?;
                    let provided = s.info().get("thread_level").unwrap_or("?").to_owned();
                    s.finalize().map_err(|e| fail(&e))?;
                    Ok(provided)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    let provided = outcome.into_iter().collect::<Result<Vec<_>, _>>()?;
    let bad = Session::init(Info::new().set("thread_level", "lots"), ErrHandler::Return);
    check(
        matches!(bad, Err(SessionError::BadInfo { .. })),
        "bad thread level refused",
    )?;
    let s = session()?;
    println!(
        "rank {} threads ok provided {} default {}",
        s.fabric().wire().rank(),
        provided.join(","),
        s.thread_level(),
    );
    s.finalize()?;
    Ok(())
}

/// ErrHandler::Fatal: an error ends the process with status 1 and a message.
fn fatal() -> Res {
    let s = session()?;
    let w = s.group_from_pset("weft://world")?;
    let _ = Communicator::create_from_group(&w, "", ErrHandler::Fatal);
    Err("a fatal error handler returned".into())
}

/// Two disjoint halves create communicators with the same tag at the same time.
fn split() -> Res {
    let s = session()?;
    let world = s.group_from_pset("weft://world")?;
    let me = s.fabric().wire().rank();
    let half = if me < 2 {
        world.incl(&[0, 1])?
    } else {
        world.incl(&[2, 3])?
    };
    let c = Communicator::create_from_group(&half, "half", ErrHandler::Return)?;
    let peer = 1 - c.rank();
    c.send(&[me], peer, Tag(0))?;
    let mut x = [0u32];
    c.recv(&mut x, Source::Rank(peer), Tag(0))?;
    check(x[0] == half.members()[peer as usize], "half pair")?;
    println!("rank {me} split ok pgcid {}", c.context_id());
    c.disconnect()?;
    s.finalize()?;
    Ok(())
}

/// Communicators from groups agreed over the fabric (`FabricGroup::create_comm`): three
/// in a row from the world group, one from each half at once (the same tag), a dup of
/// one (its id from the root server); collectives on each, every id the same at every
/// member and distinct: prints `rank R fabric-comm ok N` with the number of distinct ids.
fn fabric_comm() -> Res {
    let s = session()?;
    let world = s.group_from_pset("weft://world")?;
    let me = s.fabric().wire().rank();
    let n = world.size();
    let mut ids = std::collections::HashSet::new();
    let mut comms = Vec::new();
    let agreed = |c: &Communicator, what: &str| -> Res {
        let id = c.context_id();
        let (mut hi, mut lo) = ([0u64], [0u64]);
        c.allreduce(&[id], &mut hi, Op::Max)?;
        c.allreduce(&[id], &mut lo, Op::Min)?;
        check(hi[0] == id && lo[0] == id, what)
    };
    for i in 0..3 {
        let c = world.create_comm("probe.fabric")?;
        check(
            ids.insert(c.context_id()),
            "a fresh id for each communicator",
        )?;
        check(c.rank() == me && c.size() == n, "world order")?;
        let mut sum = [0u64];
        c.allreduce(&[u64::from(me)], &mut sum, Op::Sum)?;
        check(sum[0] == u64::from(n * (n - 1) / 2), "allreduce on it")?;
        agreed(&c, &format!("communicator {i}: one id at every member"))?;
        comms.push(c);
    }
    let mine: Vec<u32> = (0..n).filter(|r| r % 2 == me % 2).collect();
    let half = world.incl(&mine)?;
    let h = half.create_comm("probe.half")?;
    check(ids.insert(h.context_id()), "a fresh id for the half")?;
    let mut sum = [0u32];
    h.allreduce(&[me], &mut sum, Op::Sum)?;
    check(sum[0] == mine.iter().sum::<u32>(), "allreduce on the half")?;
    agreed(&h, "the half: one id at every member")?;
    let d = h.dup()?;
    check(ids.insert(d.context_id()), "a fresh id for the dup")?;
    agreed(&d, "the dup: one id at every member")?;
    d.barrier()?;
    println!("rank {me} fabric-comm ok {}", ids.len());
    d.free()?;
    h.free()?;
    for c in comms {
        c.free()?;
    }
    s.finalize()?;
    Ok(())
}

/// `end HOW`: rank 1 ends HOW (exit3, panic, abort, finalize) after a first exchange;
/// the others print how the wire-up service and the fabric name its end.
fn end(how: &str) -> Res {
    let s = session()?;
    let wire = s.fabric().wire();
    let me = wire.rank();
    let world = Communicator::create_from_group(
        &s.group_from_pset("weft://world")?,
        "end",
        ErrHandler::Return,
    )?;
    // Ranks 1 and 2 also share a communicator in which rank 1 is rank 0.
    let sub = if me == 0 {
        None
    } else {
        let g = s.group_from_pset("weft://world")?.excl(&[0])?;
        Some(Communicator::create_from_group(
            &g,
            "end.sub",
            ErrHandler::Return,
        )?)
    };
    wire.fence(
        Procs::All,
        FenceMode::SyncOnly,
        Some(Duration::from_secs(30)),
    )?;
    if me == 1 {
        match how {
            "exit3" => std::process::exit(3),
            "panic" => panic!("rank 1 panics on purpose"),
            "abort" => std::process::abort(),
            "finalize" => {
                // Disconnecting the communicator would wait for the others (collective).
                wire.finalize_shared()?;
                std::thread::sleep(Duration::from_millis(500));
                return Ok(());
            }
            other => return Err(format!("unknown way to end {other:?}").into()),
        }
    }
    match wire.fence(
        Procs::All,
        FenceMode::SyncOnly,
        Some(Duration::from_secs(30)),
    ) {
        Err(FenceError::ProcGone { rank: 1, reason }) => {
            println!("rank {me} fence: rank 1 {reason}")
        }
        other => return Err(format!("expected a fence error naming rank 1, got {other:?}").into()),
    }
    let mut x = [0u8; 1];
    if let Some(sub) = &sub {
        match sub.recv(&mut x, Source::Rank(0), Tag(0)) {
            Err(e) => println!("rank {me} sub: {e}"),
            Ok(st) => return Err(format!("a receive from an ended rank succeeded: {st:?}").into()),
        }
    }
    match world.recv(&mut x, Source::Rank(1), Tag(0)) {
        Err(e) => println!("rank {me} recv: {e}"),
        Ok(st) => return Err(format!("a receive from an ended rank succeeded: {st:?}").into()),
    }
    Ok(())
}

/// A second connection and a re-initialization are refused with errors that say what to
/// do instead; the process's shared client is the session's.
fn reinit() -> Res {
    let s = session()?;
    let me = s.fabric().wire().rank();
    match weft_wireup::Client::init() {
        Err(e @ weft_wireup::InitError::AlreadyConnected) => println!("rank {me} second init: {e}"),
        other => {
            return Err(format!("a second Client::init must be refused, got {other:?}").into())
        }
    }
    let shared = weft_wireup::Client::shared()?;
    check(
        shared.rank() == me && !shared.is_finalized(),
        "the shared client is the session's",
    )?;
    s.finalize()?;
    // Sessions may come and go while the fabric lives.
    let s2 = session()?;
    s2.finalize()?;
    Fabric::init()?.finalize()?;
    match Session::init(Info::new(), ErrHandler::Return) {
        Err(e) => println!("rank {me} init after finalize: {e}"),
        Ok(_) => return Err("Session::init after Fabric::finalize must be refused".into()),
    }
    match weft_wireup::Client::shared() {
        Err(weft_wireup::InitError::Finalized) => {}
        other => return Err(format!("Client::shared after finalize: {other:?}").into()),
    }
    println!("rank {me} ok");
    Ok(())
}

//! Intercommunicators under `weft run` (issue 33): a parent communicator spawns a job
//! (`Communicator::spawn`), the children get theirs (`Fabric::parent`), and both sides
//! exchange 8-byte and 1 MiB messages (eager and rendezvous) each way, a wildcard
//! receive among them, then disconnect. Prints facts for the test; exits 1 on any
//! surprise.
//!
//! `intercomm_probe parent N [die]`: the world spawns N children (with `die`, child 1
//! exits 3 after connecting, before it answers). `intercomm_probe child [die]`: what
//! the children run. `intercomm_probe server NAME` opens a port, publishes it as NAME and
//! accepts on it; `intercomm_probe client NAME` (another job of the runtime) looks NAME up
//! and connects: both exchange messages, merge (the server's world first) and disconnect.
//! `intercomm_probe plain-parent`: spawns 2 `plain-child` with `Client::spawn`, whose
//! `Fabric::parent` is `None` at once (no intercommunicator was asked for).
//! `intercomm_probe progress-parent N`: the world's rank 0 sends 8 bytes to each of N
//! children in turn while child 0 waits in its world's barrier for child 1, which receives
//! first: the parent's first send to child 0 completes only if child 0's barrier wait
//! progresses its intercommunicator (over TCP: the connection's handshake).
//! `intercomm_probe chaos-parent N ROUNDS` (for `ci/chaos-family.sh`): the world spawns N
//! `chaos-child ROUNDS`; in each round every parent sends every child 8 bytes (every
//! tenth round 64 KiB), and every child, once it took all (wildcard receives), answers
//! each; then both merge, sum on the merged communicator and disconnect. A parent
//! prints `parent R ok`, or `parent R error: ...` when a child was lost (then it ends
//! well: the loss of a spawned job is the parents' to handle); a child prints `rank R ok`
//! or `rank R error: ...` (and exits 1).

use std::io::Write;

use weft::prelude::*;

type Res = Result<(), Box<dyn std::error::Error>>;

const BIG: usize = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let out = match args.get(1).map(String::as_str) {
        Some("parent") => parent(&args),
        Some("child") => child(&args),
        Some("server") => port_end(&args, true),
        Some("progress-parent") => progress_parent(&args),
        Some("progress-child") => progress_child(),
        Some("plain-parent") => plain_parent(),
        Some("plain-child") => plain_child(),
        Some("client") => port_end(&args, false),
        Some("lone-parent") => lone_parent(&args),
        Some("lone-child") => lone_child(&args),
        Some("chaos-parent") => chaos_parent(&args),
        Some("chaos-child") => chaos_child(&args),
        other => Err(format!("unknown scenario {other:?}").into()),
    };
    if let Err(e) = out {
        eprintln!("intercomm_probe: {e}");
        std::process::exit(1);
    }
}

/// The 1 MiB message `from` sends `to`: every byte depends on both and its place.
fn pattern(from: u32, to: u32) -> Vec<u8> {
    (0..BIG)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(from * 7 + to * 13) as u8)
        .collect()
}

fn say(line: String) -> Res {
    println!("{line}");
    std::io::stdout().flush()?;
    Ok(())
}

fn parent(args: &[String]) -> Res {
    let fabric = Fabric::init()?;
    let world = fabric.world();
    let n: u32 = args.get(2).ok_or("parent N")?.parse()?;
    let mut cargs = vec!["child".to_owned()];
    cargs.extend(args.get(3).cloned());
    let app = SpawnApp {
        program: std::env::current_exe()?.display().to_string(),
        args: cargs,
        np: n,
        env: Vec::new(),
        cwd: None,
    };
    let ic = world.spawn(&[app], 0)?;
    let me = ic.rank();
    let remote: Vec<String> = ic.remote_procs().iter().map(ToString::to_string).collect();
    say(format!(
        "parent {me}/{}: ctx {} remote [{}]",
        ic.size(),
        ic.context_id(),
        remote.join(" ")
    ))?;
    // Small messages to every child, then the large ones, then the answers (children
    // receive in parent order and answer after: no cycle of blocking sends).
    let exchange = || -> Result<(), Box<dyn std::error::Error>> {
        for c in 0..ic.remote_size() {
            ic.send(&[u64::from(me * 100 + c)], c, Tag(1))?;
        }
        for c in 0..ic.remote_size() {
            ic.send(&pattern(me, c), c, Tag(2))?;
        }
        for c in 0..ic.remote_size() {
            let mut small = [0u64];
            ic.recv(&mut small, Source::Rank(c), Tag(3))?;
            if small[0] != u64::from(c * 100 + me) {
                return Err(format!("from child {c}: {} ", small[0]).into());
            }
            let mut big = vec![0u8; BIG];
            let st = ic.recv(&mut big, Source::Rank(c), Tag(4))?;
            if st.source != c || big != pattern(c, me) {
                return Err(format!("the 1 MiB message of child {c} is wrong").into());
            }
        }
        Ok(())
    };
    let failed = exchange().err();
    match failed {
        Some(e) => say(format!("parent {me}: failed: {e}"))?,
        None => {
            say(format!(
                "parent {me}: exchanged with {} children",
                ic.remote_size()
            ))?;
            // A wildcard receive while child 0 is already in the merge, whose flag has
            // come: it gets the last child's late message, never the flag.
            let mut late = [0u64];
            let st = ic.recv(&mut late, Source::Any, Tag::ANY)?;
            let last = ic.remote_size() - 1;
            if (st.source, st.tag, late[0]) != (last, 5, u64::from(5000 + me)) {
                return Err(format!(
                    "the wildcard receive got {late:?} from child {} with tag {}",
                    st.source, st.tag
                )
                .into());
            }
            merged("parent", me, &ic, false)?;
            let child0 = ic.remote_procs()[0];
            ic.disconnect()?;
            // The merge's connect is undone too: the children's data is refused again,
            // as not connected; or, if the children have already ended and their job
            // was forgotten (they finish right after their disconnect), as a namespace
            // no longer served. Either way never given.
            let opts = GetOpts::default().immediate();
            match fabric.wire().get_proc(child0, "weft.none", opts) {
                Err(e)
                    if e.to_string().contains("not connected")
                        || e.to_string().contains("is not served here") =>
                {
                    say(format!("parent {me}: disconnected"))?
                }
                other => say(format!("parent {me}: disconnected, yet {other:?}"))?,
            }
        }
    }
    fabric.finalize()?;
    Ok(())
}

/// Merges (parents first: they pass `high = false`), then runs collectives on the merged
/// communicator and a split of it, and prints what they gave.
fn merged(who: &str, me: u32, ic: &InterComm, high: bool) -> Res {
    let m = ic.merge(high)?;
    let (rank, size) = (m.rank(), m.size());
    let mut sum = [0u64];
    m.allreduce(&[u64::from(rank)], &mut sum, Op::Sum)?;
    let mut root = [if rank == 0 { 4242u64 } else { 0 }];
    m.bcast(&mut root, 0)?;
    m.barrier()?;
    // Even and odd merged ranks: each half sums its ranks.
    let half = m.split(Some(rank % 2), rank as i32)?.ok_or("no half")?;
    let mut part = [0u64];
    half.allreduce(&[u64::from(rank)], &mut part, Op::Sum)?;
    say(format!(
        "{who} {me}: merged rank {rank} of {size}, sum {}, bcast {}, half {} of {} sum {}",
        sum[0],
        root[0],
        half.rank(),
        half.size(),
        part[0]
    ))
}

fn child(args: &[String]) -> Res {
    let fabric = Fabric::init()?;
    let ic = fabric.parent()?.ok_or("a child without a parent")?;
    let me = ic.rank();
    let remote: Vec<String> = ic.remote_procs().iter().map(ToString::to_string).collect();
    say(format!(
        "child {me}/{}: ctx {} remote [{}]",
        ic.size(),
        ic.context_id(),
        remote.join(" ")
    ))?;
    if args.get(2).is_some_and(|a| a == "die") && me == 1 {
        std::process::exit(3);
    }
    let parents = ic.remote_size();
    // The first message from any parent (a wildcard receive), then each parent's.
    let mut small = [0u64];
    let st = ic.recv(&mut small, Source::Any, Tag(1))?;
    let mut got = vec![st.source];
    if small[0] != u64::from(st.source * 100 + me) {
        return Err(format!("from parent {}: {}", st.source, small[0]).into());
    }
    for p in (0..parents).filter(|&p| p != st.source) {
        ic.recv(&mut small, Source::Rank(p), Tag(1))?;
        if small[0] != u64::from(p * 100 + me) {
            return Err(format!("from parent {p}: {}", small[0]).into());
        }
        got.push(p);
    }
    for p in 0..parents {
        let mut big = vec![0u8; BIG];
        ic.recv(&mut big, Source::Rank(p), Tag(2))?;
        if big != pattern(p, me) {
            return Err(format!("the 1 MiB message of parent {p} is wrong").into());
        }
    }
    for p in 0..parents {
        ic.send(&[u64::from(me * 100 + p)], p, Tag(3))?;
        ic.send(&pattern(me, p), p, Tag(4))?;
    }
    say(format!(
        "child {me}: exchanged with {parents} parents (first from {})",
        got[0]
    ))?;
    if me + 1 == ic.size() {
        // The late message (after child 0's merge flag reached the parents).
        std::thread::sleep(std::time::Duration::from_millis(300));
        for p in 0..parents {
            ic.send(&[u64::from(5000 + p)], p, Tag(5))?;
        }
    }
    merged("child", me, &ic, true)?;
    ic.disconnect()?;
    say(format!("child {me}: disconnected"))?;
    fabric.finalize()?;
    Ok(())
}

/// `server NAME` / `client NAME`: the two ends of a port, each a whole job.
fn port_end(args: &[String], server: bool) -> Res {
    use weft::fabric::Port;
    use weft::wireup::{LookupOptions, NameRange, NameValue, Persistence};
    let who = if server { "server" } else { "client" };
    let fabric = Fabric::init()?;
    let world = fabric.world();
    let wire = fabric.wire();
    let name = args.get(2).ok_or("server|client NAME")?;
    if server {
        // `server NAME [ROUNDS]`: accepts ROUNDS connectors in turn on one port.
        let rounds: u32 = args.get(3).map_or(Ok(1), |r| r.parse())?;
        let port = fabric.open_port()?;
        if world.rank() == 0 {
            wire.publish(
                &[(name, port.as_str().as_bytes())],
                NameRange::Global,
                Persistence::Job,
            )?;
        }
        for _ in 0..rounds {
            port_round(who, world.accept(&port, 0)?, true)?;
        }
        if world.rank() == 0 {
            wire.unpublish(&[name], NameRange::Global)?;
        }
    } else {
        let opts = LookupOptions {
            range: NameRange::Global,
            wait: Some(std::time::Duration::from_secs(60)),
        };
        let found = wire.lookup(&[name], opts)?;
        let text = match found.into_iter().next().map(|p| p.value) {
            Some(NameValue::Bytes(b)) => String::from_utf8(b)?,
            other => return Err(format!("{name}: {other:?}").into()),
        };
        port_round(who, world.connect(&Port::parse(&text)?, 0)?, false)?;
    }
    fabric.finalize()?;
    Ok(())
}

/// One accept or connect's intercommunicator: 8 B between every pair, 1 MiB between the
/// rank 0s both ways, the merge (the server first), the disconnect.
fn port_round(who: &str, ic: InterComm, server: bool) -> Res {
    let me = ic.rank();
    let remote: Vec<String> = ic.remote_procs().iter().map(ToString::to_string).collect();
    say(format!(
        "{who} {me}/{}: ctx {} remote [{}]",
        ic.size(),
        ic.context_id(),
        remote.join(" ")
    ))?;
    for r in 0..ic.remote_size() {
        ic.send(&[u64::from(me * 100 + r)], r, Tag(1))?;
    }
    for r in 0..ic.remote_size() {
        let mut got = [0u64];
        ic.recv(&mut got, Source::Rank(r), Tag(1))?;
        if got[0] != u64::from(r * 100 + me) {
            return Err(format!("from remote {r}: {}", got[0]).into());
        }
    }
    // 1 MiB from the server's rank 0 to the client's and back.
    if me == 0 {
        let mut big = vec![0u8; BIG];
        if server {
            ic.send(&pattern(0, 1), 0, Tag(2))?;
            ic.recv(&mut big, Source::Rank(0), Tag(3))?;
            if big != pattern(1, 0) {
                return Err("the 1 MiB answer is wrong".into());
            }
        } else {
            ic.recv(&mut big, Source::Rank(0), Tag(2))?;
            if big != pattern(0, 1) {
                return Err("the 1 MiB message is wrong".into());
            }
            ic.send(&pattern(1, 0), 0, Tag(3))?;
        }
    }
    say(format!(
        "{who} {me}: exchanged with {} remote processes",
        ic.remote_size()
    ))?;
    merged(who, me, &ic, !server)?;
    ic.disconnect()?;
    say(format!("{who} {me}: disconnected"))?;
    Ok(())
}

fn progress_parent(args: &[String]) -> Res {
    let fabric = Fabric::init()?;
    let n: u32 = args.get(2).ok_or("progress-parent N")?.parse()?;
    let app = SpawnApp {
        program: std::env::current_exe()?.display().to_string(),
        args: vec!["progress-child".into()],
        np: n,
        env: Vec::new(),
        cwd: None,
    };
    let ic = fabric.world().spawn(&[app], 0)?;
    if ic.rank() == 0 {
        for c in 0..ic.remote_size() {
            ic.send(&[u64::from(c) + 10], c, Tag(1))?;
        }
        say(format!("parent: sent to {} children", ic.remote_size()))?;
    }
    ic.disconnect()?;
    fabric.finalize()?;
    Ok(())
}

fn progress_child() -> Res {
    let fabric = Fabric::init()?;
    let ic = fabric.parent()?.ok_or("no parent")?;
    let world = fabric.world();
    let mut got = [0u64];
    if world.rank() == 0 {
        world.barrier()?;
        ic.recv(&mut got, Source::Rank(0), Tag(1))?;
    } else {
        ic.recv(&mut got, Source::Rank(0), Tag(1))?;
        world.barrier()?;
    }
    say(format!("child {}: got {}", world.rank(), got[0]))?;
    ic.disconnect()?;
    fabric.finalize()?;
    Ok(())
}

fn plain_parent() -> Res {
    let fabric = Fabric::init()?;
    let app = SpawnApp {
        program: std::env::current_exe()?.display().to_string(),
        args: vec!["plain-child".into()],
        np: 2,
        env: Vec::new(),
        cwd: None,
    };
    fabric.wire().spawn(&[app])?;
    fabric.finalize()?;
    Ok(())
}

fn plain_child() -> Res {
    let fabric = Fabric::init()?;
    let t0 = std::time::Instant::now();
    let p = fabric.parent()?;
    say(format!(
        "plain child {}: parent {}, in {} s",
        fabric.world().rank(),
        if p.is_some() { "some" } else { "none" },
        t0.elapsed().as_secs()
    ))?;
    fabric.finalize()?;
    Ok(())
}

/// `lone-parent [idle]`: a job of one process spawns one `lone-child`, then exits with
/// code 3 without sending; the child's wildcard receive from its parent group (of one)
/// fails, naming it. With `idle` the child only sleeps: the parent job's failure must end
/// it.
fn lone_parent(args: &[String]) -> Res {
    let fabric = Fabric::init()?;
    let mut cargs = vec!["lone-child".to_owned()];
    cargs.extend(args.get(2).cloned());
    let app = SpawnApp {
        program: std::env::current_exe()?.display().to_string(),
        args: cargs,
        np: 1,
        env: Vec::new(),
        cwd: None,
    };
    let _ic = fabric.world().spawn(&[app], 0)?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::process::exit(3);
}

fn lone_child(args: &[String]) -> Res {
    let fabric = Fabric::init()?;
    let ic = fabric.parent()?.ok_or("no parent")?;
    if args.get(2).is_some_and(|a| a == "idle") {
        std::thread::sleep(std::time::Duration::from_secs(100));
        return say("lone child: slept".into());
    }
    let mut buf = [0u8; 8];
    match ic.recv(&mut buf, Source::Any, Tag::ANY) {
        Err(e) => say(format!("lone child: {e}")),
        Ok(st) => Err(format!("a message from parent {}", st.source).into()),
    }
}

/// The end of a chaos family's exchange: merge (`high` as given), count the merged
/// processes with an allreduce, disconnect.
fn merge_count_disconnect(ic: InterComm, high: bool) -> Res {
    let m = ic.merge(high)?;
    let mut sum = [0u64];
    m.allreduce(&[1u64], &mut sum, Op::Sum)?;
    if sum[0] != u64::from(m.size()) {
        return Err(format!("the merged sum is {} of {}", sum[0], m.size()).into());
    }
    ic.disconnect()?;
    Ok(())
}

/// Round `round`'s message from parent `p` to child `c` (every tenth: 64 KiB).
fn chaos_msg(round: u32, p: u32, c: u32) -> Vec<u8> {
    let len = if round % 10 == 9 { 64 << 10 } else { 8 };
    (0..len)
        .map(|i| (i as u32 ^ round.wrapping_mul(7) ^ (p * 31 + c * 17)) as u8)
        .collect()
}

fn chaos_parent(args: &[String]) -> Res {
    let fabric = Fabric::init()?;
    let me = fabric.world().rank();
    let n: u32 = args.get(2).ok_or("chaos-parent N ROUNDS")?.parse()?;
    let rounds: u32 = args.get(3).ok_or("chaos-parent N ROUNDS")?.parse()?;
    let run = || -> Res {
        let app = SpawnApp {
            program: std::env::current_exe()?.display().to_string(),
            args: vec!["chaos-child".into(), rounds.to_string()],
            np: n,
            env: Vec::new(),
            cwd: None,
        };
        let ic = fabric.world().spawn(&[app], 0)?;
        let mut buf = vec![0u8; 64 << 10];
        for round in 0..rounds {
            for c in 0..n {
                ic.send(&chaos_msg(round, me, c), c, Tag(round))?;
            }
            for _ in 0..n {
                let st = ic.recv(&mut buf, Source::Any, Tag(round))?;
                let want = chaos_msg(round, st.source, me);
                if buf[..st.count] != want[..] {
                    return Err(
                        format!("round {round}: child {}'s answer is wrong", st.source).into(),
                    );
                }
            }
        }
        merge_count_disconnect(ic, false)
    };
    match run() {
        Ok(()) => say(format!("parent {me} ok"))?,
        Err(e) => say(format!("parent {me} error: {e}"))?,
    }
    fabric.finalize()?;
    Ok(())
}

fn chaos_child(args: &[String]) -> Res {
    let fabric = Fabric::init()?;
    let me = fabric.world().rank();
    let rounds: u32 = args.get(2).ok_or("chaos-child ROUNDS")?.parse()?;
    let run = || -> Res {
        let ic = fabric.parent()?.ok_or("no parent")?;
        let mut buf = vec![0u8; 64 << 10];
        for round in 0..rounds {
            // Every parent's message first, then the answers: a parent's large send waits
            // for its receive, never for one of this child's sends.
            for _ in 0..ic.remote_size() {
                let st = ic.recv(&mut buf, Source::Any, Tag(round))?;
                if buf[..st.count] != chaos_msg(round, st.source, me)[..] {
                    return Err(
                        format!("round {round}: parent {}'s message is wrong", st.source).into(),
                    );
                }
            }
            for p in 0..ic.remote_size() {
                ic.send(&chaos_msg(round, me, p), p, Tag(round))?;
            }
        }
        merge_count_disconnect(ic, true)
    };
    match run() {
        Ok(()) => say(format!("rank {me} ok"))?,
        Err(e) => {
            say(format!("rank {me} error: {e}"))?;
            std::process::exit(1);
        }
    }
    fabric.finalize()?;
    Ok(())
}

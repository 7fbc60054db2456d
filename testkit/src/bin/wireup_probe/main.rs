//! The program the wire-up tests run under `weft run`: one scenario per first argument.
//! Each scenario checks what it can itself and prints facts for the test to assert on;
//! any surprise is an error message and exit status 1.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use weft_wireup::{Client, FenceError, FenceMode, GetError, GetOpts, Procs, Scope, Value};

mod connect;
mod jobs;
use jobs::{control, family, spawn, spawn_child, spawn_watch};

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().map(String::as_str).unwrap_or("");
    let out = match scenario {
        "info" => info(),
        "fence-timeout" => fence_timeout(),
        "get-timeout" => get_timeout(),
        "kill-during-fence" => kill_during_fence(),
        "garbage" => garbage(),
        "subsets" => subsets(),
        "get-opts" => get_opts(),
        "exit" => exit_with(&args),
        "sleep" => sleep(&args),
        "stdin" => stdin(),
        "finalized-peer" => finalized_peer(),
        "full-store" => full_store(),
        "bad-requests" => bad_requests(),
        "sparse-rounds" => sparse_rounds(),
        "get-waits" => get_waits(),
        "late-commits" => late_commits(),
        "fuzz-server" => fuzz_server(),
        "pieces" => pieces(),
        "spawn" => spawn(&args),
        "spawn-child" => spawn_child(),
        "control" => control(),
        "family" => family(&args),
        "spawn-watch" => spawn_watch(),
        "connect" => connect::connect(&args),
        "connect-child" => connect::connect_child(&args),
        other => Err(format!("unknown scenario {other:?}").into()),
    };
    if let Err(e) = out {
        eprintln!("wireup_probe {scenario}: {e}");
        std::process::exit(1);
    }
}

fn t(s: u64) -> Option<Duration> {
    Some(Duration::from_secs(s))
}

/// Prints what the process learned at init, one `key=value` per line, prefixed by rank.
fn info() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let j = w.job();
    let mut lines = vec![
        format!("size={}", w.size()),
        format!("env_rank={}", std::env::var("WEFT_RANK")?),
        format!("env_size={}", std::env::var("WEFT_SIZE")?),
        format!("node={}", w.node()),
        format!("nodes={}", j.num_nodes()),
        format!("hostname={}", w.hostname()),
        format!("local_rank={}", w.local_rank()),
        format!("local_size={}", w.local_size()),
        format!("local_peers={:?}", w.local_peers()),
        format!("app={}", w.app_num()),
        format!(
            "app_sizes={:?}",
            j.apps.iter().map(|a| a.size).collect::<Vec<_>>()
        ),
        format!(
            "node_list={:?}",
            j.nodes
                .iter()
                .map(|n| n.hostname.clone())
                .collect::<Vec<_>>()
        ),
        format!(
            "hosts_of_ranks={:?}",
            (0..w.size())
                .map(|p| j.hostname_of(p).unwrap_or("?").to_owned())
                .collect::<Vec<_>>()
        ),
        format!("pset_names={:?}", w.pset_names()),
        format!("psets_of_me={:?}", w.psets_of(r)),
        format!("psets_of_0={:?}", w.psets_of(0)),
        format!(
            "cpuset={}",
            j.cpuset_of(r)
                .map(|c| c.to_string())
                .unwrap_or_else(|| "none".into())
        ),
    ];
    for name in w.pset_names() {
        lines.push(format!(
            "pset[{name}]={:?}",
            w.pset_members(&name).unwrap_or_default()
        ));
    }
    let status = std::fs::read_to_string("/proc/self/status")?;
    let allowed = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(str::trim)
        .unwrap_or("?");
    lines.push(format!("allowed={allowed}"));
    let sock = std::path::PathBuf::from(std::env::var("WEFT_SERVER_SOCKET")?);
    let mode = std::fs::metadata(sock.parent().ok_or("socket has no parent")?)?
        .permissions()
        .mode()
        & 0o777;
    lines.push(format!("sockdir_mode={mode:o}"));
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{r}:{l}")?;
    }
    drop(out);
    w.fence(Procs::All, FenceMode::SyncOnly, t(30))?;
    w.finalize()?;
    Ok(())
}

/// The last rank never joins the first fence; everyone else fences with a 1 s timeout and
/// must get a Timeout naming exactly that rank. Then all fence again and succeed.
fn fence_timeout() -> Res {
    let w = Client::init()?;
    let last = w.size() - 1;
    if w.rank() == last {
        std::thread::sleep(Duration::from_millis(2500));
        // The fence we skipped was aborted by the timeout; joining it now fails at once.
        match w.fence(Procs::All, FenceMode::Full, t(10)) {
            Err(FenceError::Timeout { missing }) if missing == vec![last] => {}
            other => {
                return Err(format!(
                    "late joiner expected the aborted fence's timeout, got {other:?}"
                )
                .into())
            }
        }
    } else {
        let t0 = Instant::now();
        match w.fence(Procs::All, FenceMode::Full, Some(Duration::from_secs(1))) {
            Err(FenceError::Timeout { missing }) => {
                let ms = t0.elapsed().as_millis();
                println!(
                    "rank {} fence timed out after {ms} ms missing {missing:?}",
                    w.rank()
                );
                if missing != vec![last] {
                    return Err(format!("missing should be [{last}], is {missing:?}").into());
                }
                if !(900..2500).contains(&ms) {
                    return Err(format!("timeout took {ms} ms").into());
                }
            }
            other => return Err(format!("expected a timeout, got {other:?}").into()),
        }
    }
    w.fence(Procs::All, FenceMode::Full, t(30))?;
    println!("rank {} ok", w.rank());
    w.finalize()?;
    Ok(())
}

/// Rank 0 gets a key of the last rank, which commits only after 2 s: a 500 ms get times
/// out naming it, a get without timeout then waits and succeeds.
fn get_timeout() -> Res {
    let w = Client::init()?;
    let last = w.size() - 1;
    if w.rank() == last {
        std::thread::sleep(Duration::from_secs(2));
        w.put(Scope::Global, "late", "here")?;
        w.commit()?;
    } else if w.rank() == 0 {
        let t0 = Instant::now();
        match w.get(
            last,
            "late",
            GetOpts::default().timeout(Duration::from_millis(500)),
        ) {
            Err(GetError::Timeout { missing, .. }) if missing == vec![last] => {
                println!(
                    "rank 0 get timed out after {} ms: missing {missing:?}",
                    t0.elapsed().as_millis()
                );
            }
            other => {
                return Err(format!("expected a get timeout naming {last}, got {other:?}").into())
            }
        }
        let v = w.get(
            last,
            "late",
            GetOpts::default().timeout(Duration::from_secs(20)),
        )?;
        if v.as_str() != Some("here") {
            return Err(format!("late value is {v:?}").into());
        }
        // A key the owner never commits: an immediate get says so at once, a get with a
        // timeout times out naming the key and the rank.
        match w.get(last, "never-put", GetOpts::default().immediate()) {
            Err(GetError::NotFound { .. }) => {}
            other => {
                return Err(format!(
                    "an immediate get of a missing key must be NotFound, got {other:?}"
                )
                .into())
            }
        }
        let t1 = Instant::now();
        match w.get(
            last,
            "never-put",
            GetOpts::default().timeout(Duration::from_millis(300)),
        ) {
            Err(e @ GetError::Timeout { .. }) => {
                let text = e.to_string();
                if !text.contains("never-put") || !text.contains(&format!("rank {last}")) {
                    return Err(
                        format!("the timeout must name the key and the rank: {text}").into(),
                    );
                }
                println!(
                    "rank 0 never-put timed out after {} ms: {text}",
                    t1.elapsed().as_millis()
                );
            }
            other => return Err(format!("expected a get timeout, got {other:?}").into()),
        }
    }
    w.fence(Procs::All, FenceMode::SyncOnly, t(30))?;
    println!("rank {} ok", w.rank());
    w.finalize()?;
    Ok(())
}

/// The last rank SIGKILLs itself instead of fencing; the others must get an error that
/// names it within 2 seconds.
fn kill_during_fence() -> Res {
    let w = Client::init()?;
    let last = w.size() - 1;
    w.fence(Procs::All, FenceMode::SyncOnly, t(30))?;
    if w.rank() == last {
        std::thread::sleep(Duration::from_millis(300));
        println!("rank {last} killing itself");
        std::io::stdout().flush()?;
        let me = rustix::process::getpid();
        rustix::process::kill_process(me, rustix::process::Signal::KILL)?;
        std::thread::sleep(Duration::from_secs(60));
        return Err("still alive after SIGKILL".into());
    }
    let t0 = Instant::now();
    match w.fence(Procs::All, FenceMode::Full, None) {
        Err(FenceError::ProcGone { rank, reason }) if rank == last => {
            println!(
                "rank {} saw rank {rank} gone after {} ms: {reason}",
                w.rank(),
                t0.elapsed().as_millis()
            );
        }
        other => return Err(format!("expected ProcGone naming {last}, got {other:?}").into()),
    }
    // A get of data it never committed fails too, instead of waiting forever.
    match w.get(last, "never", GetOpts::default()) {
        Err(GetError::ProcGone { .. }) => {}
        other => return Err(format!("get from the dead rank should fail, got {other:?}").into()),
    }
    // Exit 0 without finalizing, so that the launcher reports the killed rank as the
    // first failure (a non-zero exit here could race with it); not at once, so that a
    // slower survivor still finds the killed rank the only one gone (under a PMIx host,
    // where it looks for dead processes itself).
    std::thread::sleep(Duration::from_millis(500));
    std::process::exit(0);
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(payload);
    f
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// A hello as the client sends it (postcard: variant 0, magic, varint version/rank/token,
/// since version 4 the varint namespace id; `ns` None: a version 3 hello, without it).
fn hello(version: u32, rank: u32, token: u64, ns: Option<u32>) -> Vec<u8> {
    let mut p = vec![0u8];
    p.extend_from_slice(b"WEFT");
    varint(version.into(), &mut p);
    varint(rank.into(), &mut p);
    varint(token, &mut p);
    if let Some(ns) = ns {
        varint(ns.into(), &mut p);
    }
    frame(&p)
}

/// Writes bytes to the server socket and returns what the server answered before closing.
fn poke(bytes: &[u8], close_write: bool) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut s = UnixStream::connect(std::env::var("WEFT_SERVER_SOCKET")?)?;
    s.set_read_timeout(Some(Duration::from_secs(40)))?;
    s.write_all(bytes)?;
    if close_write {
        s.shutdown(std::net::Shutdown::Write)?;
    }
    // The server closes a bad connection, possibly with our bytes unread (a reset).
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(reply),
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(reply),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Rank 0 throws bad connections at its server; then the job fences and checks cards.
fn garbage() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    w.put(Scope::Global, "card", format!("card-{r}"))?;
    w.commit()?;
    if r == 0 {
        let token: u64 = std::env::var("WEFT_TOKEN")?.parse()?;
        let ns: u32 = std::env::var("WEFT_NSID")?.parse()?;
        let cases: Vec<(&str, Vec<u8>, bool)> = vec![
            (
                "garbage",
                b"\x07\x00\x00\x00this is not postcard at all".to_vec(),
                true,
            ),
            (
                "truncated",
                {
                    let mut f = 100u32.to_le_bytes().to_vec();
                    f.extend_from_slice(b"0123456789");
                    f
                },
                true,
            ),
            ("4GiB", vec![0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4], false),
            ("version99", hello(99, 0, token, Some(ns)), false),
            // A version 3 client's hello: no namespace (it does not decode as version 4).
            ("version3", hello(3, 0, token, None), false),
            (
                "wrong-token",
                hello(weft_wireup::PROTOCOL_VERSION, 1, token ^ 0x5555, Some(ns)),
                false,
            ),
            (
                "duplicate",
                hello(weft_wireup::PROTOCOL_VERSION, 0, token, Some(ns)),
                false,
            ),
            (
                "foreign-rank",
                hello(weft_wireup::PROTOCOL_VERSION, 999, 1, Some(ns)),
                false,
            ),
            (
                "foreign-ns",
                hello(weft_wireup::PROTOCOL_VERSION, 0, token, Some(ns + 6)),
                false,
            ),
        ];
        for (name, bytes, close) in cases {
            let reply = poke(&bytes, close)?;
            let text = String::from_utf8_lossy(&reply).into_owned();
            println!(
                "case {name}: server replied {} bytes: {text:?}",
                reply.len()
            );
        }
    }
    w.fence(Procs::All, FenceMode::Full, t(30))?;
    for p in 0..w.size() {
        let v = w.get(p, "card", GetOpts::default())?;
        if v.as_str() != Some(format!("card-{p}").as_str()) {
            return Err(format!("card of {p} is {v:?}").into());
        }
    }
    println!("rank {r} ok");
    w.finalize()?;
    Ok(())
}

/// Two threads per process: one fences repeatedly over the pair {r, r^1} in Full mode
/// with per-round data, the other over all ranks in SyncOnly mode, concurrently.
fn subsets() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let size = w.size();
    if size % 2 != 0 {
        return Err("needs an even number of processes".into());
    }
    let partner = r ^ 1;
    std::thread::scope(|s| -> Res {
        let pairs = s.spawn(|| -> Result<(), String> {
            for round in 0..20u64 {
                w.put(Scope::Global, "pair", round * 100 + u64::from(r))
                    .map_err(|e| e.to_string())?;
                w.commit().map_err(|e| e.to_string())?;
                w.fence(Procs::List(vec![r, partner]), FenceMode::Full, t(30))
                    .map_err(|e| e.to_string())?;
                let v = w
                    .get(partner, "pair", GetOpts::default().refresh())
                    .map_err(|e| e.to_string())?;
                if v.as_u64() < Some(round * 100) {
                    return Err(format!("round {round}: partner's value {v:?} is stale"));
                }
            }
            Ok(())
        });
        let all = s.spawn(|| -> Result<(), String> {
            for _ in 0..20 {
                w.fence(Procs::All, FenceMode::SyncOnly, t(30))
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        pairs.join().map_err(|_| "pair thread panicked")??;
        all.join().map_err(|_| "all thread panicked")??;
        Ok(())
    })?;
    // The four fences {0,1}, {2,3}, ... ran concurrently with the world fences; finish
    // with a fence over the even ranks only, on the even ranks.
    if r % 2 == 0 {
        let evens: Vec<u32> = (0..size).step_by(2).collect();
        w.fence(Procs::List(evens), FenceMode::SyncOnly, t(30))?;
    }
    w.fence(Procs::All, FenceMode::SyncOnly, t(30))?;
    println!("rank {r} ok");
    w.finalize()?;
    Ok(())
}

/// local_only and refresh, in Sparse mode between rank 0 and the last rank.
fn get_opts() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let last = w.size() - 1;
    w.put(Scope::Remote, "v", 1u64)?;
    w.commit()?;
    w.fence(Procs::All, FenceMode::Sparse, t(30))?;
    if r == 0 {
        if w.job().node_of(last) == Some(w.node()) {
            return Err("the last rank must be on another node".into());
        }
        match w.get(last, "v", GetOpts::default().local_only()) {
            Err(GetError::NotFound { .. }) => {}
            other => {
                return Err(format!(
                    "local-only get before any fetch must be NotFound, got {other:?}"
                )
                .into())
            }
        }
        let t0 = Instant::now();
        let v = w.get(last, "v", GetOpts::default())?;
        let first = t0.elapsed();
        if v.as_u64() != Some(1) {
            return Err(format!("v is {v:?}").into());
        }
        let t1 = Instant::now();
        let again = w.get(last, "v", GetOpts::default().local_only())?;
        let cached = t1.elapsed();
        if again.as_u64() != Some(1) {
            return Err(format!("cached v is {again:?}").into());
        }
        println!("rank 0 first get {first:?}, cached local-only get {cached:?}");
    }
    w.fence(Procs::All, FenceMode::SyncOnly, t(30))?;
    if r == last {
        w.put(Scope::Remote, "v", 2u64)?;
        w.commit()?;
    }
    w.fence(Procs::All, FenceMode::SyncOnly, t(30))?;
    if r == 0 {
        // The copy on this node predates the fence: local-only still reads it, a plain
        // get fetches what the owner committed before the fence.
        let here = w.get(last, "v", GetOpts::default().local_only())?;
        let after = w.get(last, "v", GetOpts::default())?;
        println!("rank 0 local-only {here:?} after the fence {after:?}");
        if here != Value::U64(1) || after != Value::U64(2) {
            return Err("a get after the fence did not see the value committed before it".into());
        }
    }
    w.fence(Procs::All, FenceMode::SyncOnly, t(30))?;
    // Without a fence a plain get may keep answering from the copy here; refresh
    // fetches again (the loop waits for the owner's commit, with no fence to order it).
    if r == last {
        w.put(Scope::Remote, "v", 3u64)?;
        w.commit()?;
    }
    if r == 0 {
        let t0 = Instant::now();
        loop {
            let v = w.get(last, "v", GetOpts::default().refresh())?;
            if v == Value::U64(3) {
                break;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                return Err(format!("refresh still reads {v:?} after 10 s").into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let after = w.get(last, "v", GetOpts::default().local_only())?;
        println!("rank 0 refreshed to 3, the copy here is now {after:?}");
        if after != Value::U64(3) {
            return Err("a refresh must renew the copy on the node".into());
        }
    }
    w.fence(Procs::All, FenceMode::SyncOnly, t(30))?;
    println!("rank {r} ok");
    w.finalize()?;
    Ok(())
}

/// `exit RANK CODE [SLEEP_MS]`: rank RANK exits with CODE, the others sleep then exit 0.
fn exit_with(args: &[String]) -> Res {
    let who: u32 = args.get(1).ok_or("exit RANK CODE")?.parse()?;
    let code: i32 = args.get(2).ok_or("exit RANK CODE")?.parse()?;
    let sleep_ms: u64 = args
        .get(3)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20_000);
    let me: u32 = std::env::var("WEFT_RANK")?.parse()?;
    if me == who {
        std::process::exit(code);
    }
    std::thread::sleep(Duration::from_millis(sleep_ms));
    println!("rank {me} finished its sleep");
    Ok(())
}

/// `sleep MS`: init, print the pid, sleep.
fn sleep(args: &[String]) -> Res {
    let ms: u64 = args.get(1).ok_or("sleep MS")?.parse()?;
    let w = Client::init()?;
    println!("rank {} pid {} started", w.rank(), std::process::id());
    std::io::stdout().flush()?;
    std::thread::sleep(Duration::from_millis(ms));
    w.finalize()?;
    Ok(())
}

fn stdin() -> Res {
    let me: u32 = std::env::var("WEFT_RANK")?.parse()?;
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s)?;
    println!("rank {me} read {:?}", s.trim());
    Ok(())
}

/// Rank 1 finalizes and exits at once; the others' next fence must fail naming it.
fn finalized_peer() -> Res {
    let w = Client::init()?;
    w.fence(Procs::All, FenceMode::SyncOnly, t(30))?;
    if w.rank() == 1 {
        w.put(Scope::Global, "bye", "still here")?;
        w.commit()?;
        w.finalize()?;
        return Ok(());
    }
    match w.fence(Procs::All, FenceMode::SyncOnly, t(30)) {
        Err(FenceError::ProcGone { rank: 1, reason }) => {
            println!("rank {} saw: rank 1 {reason}", w.rank())
        }
        other => return Err(format!("expected ProcGone naming rank 1, got {other:?}").into()),
    }
    // Its committed data stays available.
    let v = w.get(
        1,
        "bye",
        GetOpts::default().timeout(Duration::from_secs(10)),
    )?;
    if v.as_str() != Some("still here") {
        return Err(format!("bye is {v:?}").into());
    }
    println!("rank {} ok", w.rank());
    Ok(())
}

/// Two ranks on one node fill its datastore (run with a small `WEFT_DATASTORE_BYTES`):
/// gets still answer (through the server), and rank 1's end still reaches the store, where
/// waits on a peer look for it.
fn full_store() -> Res {
    let w = Client::init()?;
    let value = "x".repeat(256);
    for i in 0..4000 {
        w.put(Scope::Global, &format!("k{i}"), value.as_str())?;
    }
    w.commit()?;
    w.fence(Procs::All, FenceMode::Full, t(60))?;
    let peer = 1 - w.rank();
    let got = w.get(
        peer,
        "k3999",
        GetOpts::default().timeout(Duration::from_secs(10)),
    )?;
    if got.as_str() != Some(value.as_str()) {
        return Err(format!("rank {peer}'s k3999 is {got:?}").into());
    }
    println!("rank {} read its peer's keys", w.rank());
    if w.rank() == 1 {
        w.finalize()?;
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(why) = w.gone_reason(1) {
            println!("rank 0 saw: rank 1 {why}");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err("rank 1's end never reached the full datastore".into())
}

/// Invalid requests get clear errors and change nothing.
fn bad_requests() -> Res {
    let w = Client::init()?;
    let size = w.size();
    let checks: Vec<(String, String)> = vec![
        (
            "get outside".into(),
            format!("{}", w.get(size + 3, "k", GetOpts::default()).unwrap_err()),
        ),
        (
            "fence outside".into(),
            format!(
                "{}",
                w.fence(Procs::List(vec![0, size + 1]), FenceMode::Full, t(5))
                    .unwrap_err()
            ),
        ),
        (
            "empty key".into(),
            format!("{}", w.put(Scope::Local, "", 1u64).unwrap_err()),
        ),
        (
            "huge value".into(),
            format!(
                "{}",
                w.put(Scope::Local, "big", vec![0u8; 17 << 20]).unwrap_err()
            ),
        ),
    ];
    for (what, msg) in checks {
        println!("rank {} {what}: {msg}", w.rank());
    }
    if w.rank() == 0 && size > 1 {
        // A fence that does not include the caller is refused.
        let msg = w
            .fence(Procs::List(vec![1]), FenceMode::Full, t(5))
            .unwrap_err()
            .to_string();
        println!("rank 0 fence without me: {msg}");
    }
    w.fence(Procs::All, FenceMode::Full, t(30))?;
    println!("rank {} ok", w.rank());
    w.finalize()?;
    Ok(())
}

/// The rank on the other node that this rank reads from (the job has 2 nodes, slot
/// mapping: rank r reads rank (r + size/2) mod size).
fn partner(w: &Client) -> Result<u32, Box<dyn std::error::Error>> {
    let p = (w.rank() + w.size() / 2) % w.size();
    if w.job().node_of(p) == Some(w.node()) {
        return Err(format!("rank {p} must run on another node than rank {}", w.rank()).into());
    }
    Ok(p)
}

/// Rounds of put/commit/fence/get with new and re-put keys, in every fence mode: after
/// each fence every get sees what its owner committed before it (a node's older copy
/// of the owner's data must not hide a new key or answer with an old value).
fn sparse_rounds() -> Res {
    let w = Client::init()?;
    let (r, p) = (w.rank(), partner(&w)?);
    let modes = [
        FenceMode::Sparse,
        FenceMode::Sparse,
        FenceMode::SyncOnly,
        FenceMode::Full,
        FenceMode::Sparse,
    ];
    for (round, mode) in modes.into_iter().enumerate() {
        let round = round as u64;
        w.put(
            Scope::Remote,
            &format!("k{round}"),
            round * 100 + u64::from(r),
        )?;
        w.put(Scope::Remote, "same", round * 100 + u64::from(r))?;
        w.commit()?;
        w.fence(Procs::All, mode, t(30))?;
        for key in [format!("k{round}"), "same".to_owned()] {
            let v = w.get(p, &key, GetOpts::default().timeout(Duration::from_secs(10)))?;
            if v != Value::U64(round * 100 + u64::from(p)) {
                return Err(format!("round {round} ({mode:?}): {key} of rank {p} is {v:?}").into());
            }
        }
        // Nobody re-puts "same" before every rank has read this round's value.
        w.fence(Procs::All, FenceMode::SyncOnly, t(30))?;
    }
    w.fence(Procs::All, FenceMode::SyncOnly, t(30))?;
    println!("rank {r} ok");
    w.finalize()?;
    Ok(())
}

/// Gets wait for keys committed late: without any fence, and for a key committed 2 s
/// after its owner's first commit (no timeout: the get must wait, not say NotFound).
fn get_waits() -> Res {
    let w = Client::init()?;
    let (r, p) = (w.rank(), partner(&w)?);
    w.put(Scope::Remote, "now", u64::from(r))?;
    w.commit()?;
    // No fence: the owner's server answers when the key is there.
    let v = w.get(p, "now", GetOpts::default())?;
    if v != Value::U64(u64::from(p)) {
        return Err(format!("now of rank {p} is {v:?}").into());
    }
    w.fence(Procs::All, FenceMode::Sparse, t(30))?;
    if r == 0 {
        std::thread::sleep(Duration::from_secs(2));
        w.put(Scope::Global, "late", "here")?;
        w.commit()?;
    } else if p == 0 {
        let t0 = Instant::now();
        let v = w.get(0, "late", GetOpts::default())?;
        let waited = t0.elapsed();
        if v.as_str() != Some("here") {
            return Err(format!("late is {v:?}").into());
        }
        println!("rank {r} waited {} ms for late", waited.as_millis());
    }
    w.fence(Procs::All, FenceMode::SyncOnly, t(30))?;
    // After the fence, any rank (on either node) sees it without waiting.
    let v = w.get(0, "late", GetOpts::default().immediate())?;
    if v.as_str() != Some("here") {
        return Err(format!("after the fence, late is {v:?}").into());
    }
    println!("rank {r} ok");
    w.finalize()?;
    Ok(())
}

/// A committed key never reads as `NotFound`, on any placement and under any wire-up
/// backend: after a Full fence, rank 0 commits a new key 1 s late and every other rank's
/// get of it waits and sees it; a key nobody commits ends the bounded get with a
/// timeout, not `NotFound`; a key committed before the fence is there at once.
fn late_commits() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    w.put(Scope::Global, "early", u64::from(r))?;
    w.commit()?;
    w.fence(Procs::All, FenceMode::Full, t(60))?;
    for p in 0..w.size() {
        let v = w.get(
            p,
            "early",
            GetOpts::default().timeout(Duration::from_secs(10)),
        )?;
        if v != Value::U64(u64::from(p)) {
            return Err(format!("early of rank {p} is {v:?}").into());
        }
    }
    if r == 0 {
        std::thread::sleep(Duration::from_secs(1));
        w.put(Scope::Global, "late", "here")?;
        w.commit()?;
    } else {
        let t0 = Instant::now();
        let v = w.get(
            0,
            "late",
            GetOpts::default().timeout(Duration::from_secs(30)),
        )?;
        let waited = t0.elapsed();
        if v.as_str() != Some("here") {
            return Err(format!("late is {v:?}").into());
        }
        println!("rank {r} waited {} ms for late", waited.as_millis());
        let t0 = Instant::now();
        match w.get(
            0,
            "never",
            GetOpts::default().timeout(Duration::from_millis(700)),
        ) {
            Err(GetError::Timeout { .. }) if t0.elapsed() >= Duration::from_millis(600) => {}
            other => {
                return Err(format!(
                    "a key nobody commits: expected a timeout after 700 ms, got {other:?} \
                     after {:?}",
                    t0.elapsed()
                )
                .into())
            }
        }
    }
    w.fence(Procs::All, FenceMode::SyncOnly, t(60))?;
    println!("rank {r} ok");
    w.finalize()?;
    Ok(())
}

/// Rank 0 sends its server hostile requests (mutations of valid requests of every kind
/// that still decode, then one that does not) over its real socket for `WEFT_FUZZ_SECS`
/// (default 1 s); meanwhile the other ranks keep fencing and reading each other's cards
/// through the same servers, and must never see a wrong answer or a stall.
fn fuzz_server() -> Res {
    let secs: f64 = std::env::var("WEFT_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let me: u32 = std::env::var("WEFT_RANK")?.parse()?;
    let size: u32 = std::env::var("WEFT_SIZE")?.parse()?;
    if me == 0 {
        use weft_testkit::corpus::{client_corpus, hello, is_client_request, Mutator};
        let token: u64 = std::env::var("WEFT_TOKEN")?.parse()?;
        let mut s = UnixStream::connect(std::env::var("WEFT_SERVER_SOCKET")?)?;
        let ns = weft_wireup::NsId(std::env::var("WEFT_NSID")?.parse()?);
        s.write_all(&hello(ns, 0, token))?;
        // Replies and events are read and dropped, so the server never blocks on us.
        let mut rd = s.try_clone()?;
        let drain = std::thread::spawn(move || {
            let mut buf = [0u8; 1 << 16];
            let mut n = 0usize;
            while let Ok(k @ 1..) = rd.read(&mut buf) {
                n += k;
            }
            n
        });
        let corpus = client_corpus(0, size);
        let mut m = Mutator::new(u64::from(std::process::id()));
        let (mut sent, mut tries) = (0u64, 0u64);
        while Instant::now() < until {
            let i = m.below(corpus.len());
            let f = m.mutate(&corpus[i]);
            tries += 1;
            if !is_client_request(&f) {
                continue;
            }
            if s.write_all(&f).is_err() {
                break;
            }
            sent += 1;
        }
        // The last one does not decode: the server drops this connection.
        let _ = s.write_all(b"\x05\x00\x00\x00\xff\xff\xff\xff\xff");
        let _ = s.shutdown(std::net::Shutdown::Write);
        let got = drain.join().map_err(|_| "drain thread")?;
        println!(
            "rank 0 fuzz: sent {sent} hostile requests ({tries} mutations), read {got} bytes back"
        );
        return Ok(());
    }
    let w = Client::init()?;
    let others: Vec<u32> = (1..size).collect();
    let mut round = 0u64;
    // The first of the others decides for all whether another round starts.
    let lead = others[0];
    loop {
        round += 1;
        w.put(Scope::Global, "card", format!("card-{me}-{round}"))?;
        if me == lead {
            w.put(Scope::Global, "go", Instant::now() < until || round < 3)?;
        }
        w.commit()?;
        let mode = [FenceMode::Full, FenceMode::Sparse, FenceMode::SyncOnly][(round % 3) as usize];
        w.fence(Procs::List(others.clone()), mode, t(30))?;
        for &p in &others {
            let v = w.get(
                p,
                "card",
                GetOpts::default().timeout(Duration::from_secs(10)),
            )?;
            if v.as_str() != Some(&format!("card-{p}-{round}")) {
                return Err(format!("round {round}: card of {p} is {v:?}").into());
            }
        }
        let go = w.get(
            lead,
            "go",
            GetOpts::default().timeout(Duration::from_secs(10)),
        )?;
        w.fence(Procs::List(others.clone()), FenceMode::SyncOnly, t(30))?;
        if go != Value::Bool(true) {
            break;
        }
    }
    println!("rank {me} ok after {round} rounds");
    w.finalize()?;
    Ok(())
}

/// Each rank writes 5 lines to stderr and stdout, each in 8 separate writes 1 ms apart
/// (as `eprintln!` and unbuffered writers do): the job's output must hold every line
/// whole, whatever the other nodes write meanwhile.
fn pieces() -> Res {
    let me: u32 = std::env::var("WEFT_RANK")?.parse()?;
    for line in 0..5 {
        for (k, mut w) in [
            Box::new(std::io::stderr()) as Box<dyn Write>,
            Box::new(std::io::stdout()),
        ]
        .into_iter()
        .enumerate()
        {
            for piece in 0..8 {
                let end = if piece == 7 { "\n" } else { " " };
                w.write_all(format!("r{me}.{k}.{line}.{piece}{end}").as_bytes())?;
                w.flush()?;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    Ok(())
}

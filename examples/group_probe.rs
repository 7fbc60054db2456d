//! The program the group tests run under `weft run`: one scenario per first argument.
//! Each scenario checks what it can itself and prints facts for the test to assert on;
//! any surprise is an error message and exit status 1.

use std::time::{Duration, Instant};

use weft_wireup::{Client, GetOpts, GroupDirectives, GroupError, Scope};

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().map(String::as_str).unwrap_or("");
    let out = match scenario {
        "basic" => basic(),
        "optional-timeout" => optional_timeout(),
        "timeout" => timeout(),
        "killed-member" => killed_member(false),
        "killed-member-tolerant" => killed_member(true),
        "ids" => ids(),
        "local-only" => local_only(),
        "nonblocking" => nonblocking(),
        "mismatch" => mismatch(),
        "destruct-dead" => destruct_dead(),
        other => Err(format!("unknown scenario {other:?}").into()),
    };
    if let Err(e) = out {
        eprintln!("group_probe {scenario}: {e}");
        std::process::exit(1);
    }
}

fn t(s: u64) -> Option<Duration> {
    Some(Duration::from_secs(s))
}

fn all(w: &Client) -> Vec<u32> {
    (0..w.size()).collect()
}

/// Two groups over the world and over the even ranks, with PGCIDs; the members' cards are
/// on the node afterwards; queries; destruct and reconstruct (the PGCID is never reused).
fn basic() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    w.put(Scope::Global, "card", format!("card-of-{r}"))?;
    w.commit()?;
    let d = GroupDirectives::default().assign_context_id();
    let g = w.group_construct("world-copy", &all(&w), &d, t(30))?;
    let pgcid = g.pgcid.ok_or("no pgcid")?;
    if g.members != all(&w) || !g.left_out.is_empty() {
        return Err(format!("bad membership {g:?}").into());
    }
    // Every member's card is on this node now: a local-only get succeeds.
    for p in all(&w) {
        let v = w.get(p, "card", GetOpts::default().local_only())?;
        if v.as_str() != Some(&format!("card-of-{p}")) {
            return Err(format!("card of {p} is {v:?}").into());
        }
    }
    let evens: Vec<u32> = all(&w).into_iter().filter(|p| p % 2 == 0).collect();
    let mut second = None;
    if r % 2 == 0 {
        let e = w.group_construct("evens", &evens, &d.clone().leader(0), t(30))?;
        if e.members != evens || e.leader != Some(0) {
            return Err(format!("bad evens {e:?}").into());
        }
        second = e.pgcid;
        if second == Some(pgcid) {
            return Err("two groups got the same PGCID".into());
        }
    }
    let mine = w.groups_of(r)?;
    println!(
        "rank {r} group world-copy pgcid {pgcid} evens {:?} groups_of_me {mine:?} known {}",
        second,
        w.groups()?.len()
    );
    w.group_destruct("world-copy", t(30))?;
    if w.group("world-copy")?.is_some() {
        return Err("world-copy still known after destruct".into());
    }
    let again = w.group_construct("world-copy", &all(&w), &d, t(30))?;
    let p2 = again.pgcid.ok_or("no pgcid")?;
    if p2 == pgcid || Some(p2) == second {
        return Err(format!("PGCID {p2} reused").into());
    }
    println!("rank {r} reconstructed pgcid {p2}");
    // Without a context id there is no PGCID.
    let plain = w.group_construct("plain", &all(&w), &GroupDirectives::default(), t(30))?;
    if plain.pgcid.is_some() {
        return Err("a PGCID without assign_context_id".into());
    }
    println!("rank {r} ok");
    Ok(())
}

/// The last rank never joins; the others construct an optional group with a timeout and
/// get the partial membership.
fn optional_timeout() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let last = w.size() - 1;
    if r == last {
        // Sit out, but stay alive until the others are done.
        std::thread::sleep(Duration::from_secs(3));
        return Ok(());
    }
    let d = GroupDirectives::default().optional().assign_context_id();
    let start = Instant::now();
    let g = w.group_construct("opt", &all(&w), &d, Some(Duration::from_millis(800)))?;
    println!(
        "rank {r} members {:?} left_out {:?} pgcid {:?} after {} ms",
        g.members,
        g.left_out,
        g.pgcid,
        start.elapsed().as_millis()
    );
    Ok(())
}

/// The last rank never joins a plain construct: the others get a timeout naming it.
fn timeout() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let last = w.size() - 1;
    if r == last {
        std::thread::sleep(Duration::from_secs(3));
        return Ok(());
    }
    match w.group_construct("late", &all(&w), &GroupDirectives::default(), t(1)) {
        Err(GroupError::Timeout { missing, .. }) => {
            println!("rank {r} timeout missing {missing:?}");
            Ok(())
        }
        other => Err(format!("expected a timeout, got {other:?}").into()),
    }
}

/// The last rank dies before joining. Without tolerance the construct fails naming it;
/// with notify-termination it completes without it.
fn killed_member(tolerant: bool) -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let last = w.size() - 1;
    if r == last {
        std::process::abort();
    }
    let d = if tolerant {
        GroupDirectives::default()
            .notify_termination()
            .assign_context_id()
    } else {
        GroupDirectives::default().assign_context_id()
    };
    let start = Instant::now();
    match w.group_construct("k", &all(&w), &d, t(30)) {
        Ok(g) if tolerant => println!(
            "rank {r} members {:?} left_out {:?} after {} ms",
            g.members,
            g.left_out,
            start.elapsed().as_millis()
        ),
        Err(GroupError::ProcGone { rank, reason, .. }) if !tolerant => println!(
            "rank {r} construct failed: rank {rank} gone after {} ms ({reason})",
            start.elapsed().as_millis()
        ),
        other => return Err(format!("unexpected outcome {other:?}").into()),
    }
    // Survivors exit 0 so that the launcher's first failure is the abort.
    Ok(())
}

/// Group ids are checked: in use, reserved, the namespace, concurrent use of one id.
fn ids() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let d = GroupDirectives::default();
    w.group_construct("taken", &all(&w), &d, t(30))?;
    let again = w.group_construct("taken", &[r], &d, t(5));
    let in_use = matches!(&again, Err(GroupError::Invalid { reason, .. }) if reason.contains("already in use"));
    let nspace = w.nspace().to_owned();
    let ns = w.group_construct(&nspace, &[r], &d, t(5));
    let ns_err =
        matches!(&ns, Err(GroupError::Invalid { reason, .. }) if reason.contains("namespace"));
    let reserved = w.group_construct("weft://world", &[r], &d, t(5));
    let res_err = matches!(&reserved, Err(GroupError::Invalid { .. }));
    // One id used twice at once by two threads: one of them gets an error, nobody hangs.
    let twice = format!("twice-{r}");
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| w.group_construct(&twice, &[r], &d, t(5)));
        let b = s.spawn(|| w.group_construct(&twice, &[r], &d, t(5)));
        (a.join(), b.join())
    });
    let a = a.map_err(|_| "thread panicked")?;
    let b = b.map_err(|_| "thread panicked")?;
    let errors = [&a, &b].iter().filter(|x| x.is_err()).count();
    let reason = [&a, &b]
        .iter()
        .find_map(|x| x.as_ref().err().map(|e| e.to_string()))
        .unwrap_or_default();
    println!(
        "rank {r} in_use {in_use} namespace {ns_err} reserved {res_err} twice_errors {errors} ({reason})"
    );
    Ok(())
}

/// Groups of the processes of one node with local-only, with and without a PGCID.
fn local_only() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let node = w.node();
    let peers = w.local_peers().to_vec();
    let d = GroupDirectives::default().local_only().assign_context_id();
    let g = w.group_construct(&format!("node{node}"), &peers, &d, t(30))?;
    let bad = w.group_construct(
        "all-local",
        &all(&w),
        &GroupDirectives::default().local_only(),
        t(5),
    );
    let refused = match &bad {
        Err(GroupError::Invalid { reason, .. }) => reason.contains("local-only"),
        _ => w.job().num_nodes() == 1,
    };
    println!(
        "rank {r} node {node} members {:?} pgcid {:?} refused_remote {refused}",
        g.members,
        g.pgcid.ok_or("no pgcid")?
    );
    Ok(())
}

/// A non-blocking construct, polled with test while the caller does other work.
fn nonblocking() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    if r == 0 {
        // Arrive late, so the others really poll.
        std::thread::sleep(Duration::from_millis(300));
    }
    let d = GroupDirectives::default().assign_context_id();
    let pending = w.group_construct_nb("nb", &all(&w), &d, t(30))?;
    let mut polls = 0u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    let g = loop {
        if let Some(res) = pending.test() {
            break res?;
        }
        polls += 1;
        if Instant::now() > deadline {
            return Err("non-blocking construct never completed".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    println!(
        "rank {r} nb members {} pgcid {:?} polls {}",
        g.members.len(),
        g.pgcid.ok_or("no pgcid")?,
        if polls > 0 { "many" } else { "none" }
    );
    Ok(())
}

/// Members that disagree on the directives get an error, not a hang.
fn mismatch() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let d = if r == 0 {
        GroupDirectives::default().assign_context_id()
    } else {
        GroupDirectives::default()
    };
    match w.group_construct("mm", &all(&w), &d, t(10)) {
        Err(e @ (GroupError::Invalid { .. } | GroupError::Aborted { .. })) => {
            println!("rank {r} mismatch error: {e}");
            Ok(())
        }
        other => Err(format!("expected an error, got {other:?}").into()),
    }
}

/// A member of a notify-termination group dies; the others destruct without it.
fn destruct_dead() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let last = w.size() - 1;
    let d = GroupDirectives::default().notify_termination();
    w.group_construct("nt", &all(&w), &d, t(30))?;
    if r == last {
        std::process::abort();
    }
    // Wait until the death has reached this node, then destruct among the survivors.
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.gone_reason(last).is_none() {
        if Instant::now() > deadline {
            return Err("the death never reached this node".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    w.group_destruct("nt", t(10))?;
    println!("rank {r} destructed without {last}");
    Ok(())
}

//! The program the group tests run under `weft run`: one scenario per first argument.
//! Each scenario checks what it can itself and prints facts for the test to assert on;
//! any surprise is an error message and exit status 1.

use std::time::{Duration, Instant};

use std::sync::{Arc, Mutex};

use weft_wireup::{
    Client, Event, EventCode, EventCodes, EventFlow, GetOpts, GroupDirectives, GroupError, Scope,
};

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
        "member-failed" => member_failed(),
        "leader" => leader(),
        "leave" => leave(),
        "psets" => psets(),
        "pgcids" => pgcids(),
        "invite" => invite(),
        "invite-abort" => invite_abort(),
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
        std::thread::sleep(Duration::from_secs(5));
        return Ok(());
    }
    // The others first wait for each other (a fence without the last rank): a member
    // slow to start on a loaded machine is not what the timeout is to catch.
    let others: Vec<u32> = (0..last).collect();
    w.fence(
        weft_wireup::Procs::List(others),
        weft_wireup::FenceMode::SyncOnly,
        None,
    )?;
    let d = GroupDirectives::default().optional().assign_context_id();
    let start = Instant::now();
    // Long enough for a loaded machine (CI runs tests in parallel on two cores).
    let g = w.group_construct("opt", &all(&w), &d, Some(Duration::from_millis(2500)))?;
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

/// PGCIDs through a job's life: a group over every rank, one over all but rank 0 (led by
/// rank 1), the first destructed and constructed again, an optional one (its membership
/// decided by its leader). Every member gets the same id for a group, no id twice, and
/// the members' cards are on the node after each construct. Prints the ids (the test
/// tells the host's from derived ones).
fn pgcids() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    w.put(Scope::Global, "card", format!("card-of-{r}"))?;
    w.commit()?;
    let d = GroupDirectives::default().assign_context_id();
    let cards_here = |members: &[u32]| -> Res {
        for &p in members {
            let v = w.get(p, "card", GetOpts::default().local_only())?;
            if v.as_str() != Some(&format!("card-of-{p}")) {
                return Err(format!("card of {p} is {v:?}").into());
            }
        }
        Ok(())
    };
    let a = w.group_construct("a", &all(&w), &d, t(30))?;
    cards_here(&a.members)?;
    let tail: Vec<u32> = (1..w.size()).collect();
    let mut b = None;
    if r != 0 {
        let g = w.group_construct("b", &tail, &d, t(30))?;
        cards_here(&g.members)?;
        b = g.pgcid;
    }
    w.group_destruct("a", t(30))?;
    let a2 = w.group_construct("a", &all(&w), &d, t(30))?;
    let c = w.group_construct("c", &all(&w), &d.clone().optional(), t(30))?;
    if c.members != all(&w) {
        return Err(format!("optional c lost members: {c:?}").into());
    }
    let ids = [a.pgcid, b, a2.pgcid, c.pgcid];
    let mut seen = Vec::new();
    for id in ids.iter().flatten() {
        if seen.contains(id) {
            return Err(format!("PGCID {id} twice: {ids:?}").into());
        }
        seen.push(*id);
    }
    let show = |p: Option<u64>| p.map_or("-".to_string(), |p| p.to_string());
    println!(
        "rank {r} pgcids a {} b {} a-again {} c {}",
        show(a.pgcid),
        show(b),
        show(a2.pgcid),
        show(c.pgcid)
    );
    for g in ["a", "c"] {
        w.group_destruct(g, t(30))?;
    }
    if r != 0 {
        w.group_destruct("b", t(30))?;
    }
    println!("rank {r} pgcids destructed");
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

/// Collects the events of `codes` in a shared list.
fn collect(w: &Client, codes: EventCodes) -> Arc<Mutex<Vec<Event>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    w.register_event_handler(codes, move |e, _| {
        s2.lock().unwrap().push(e.clone());
        EventFlow::Continue
    });
    seen
}

/// A barrier among the ranks below `last` (the survivors), so that none finalizes (a
/// termination its groups would report) while another still waits for events.
fn survivors_fence(w: &Client, last: u32) -> Res {
    let procs = weft_wireup::Procs::List((0..last).collect());
    w.fence(procs, weft_wireup::FenceMode::SyncOnly, t(30))?;
    Ok(())
}

/// Processes events until `done` holds or `secs` pass.
fn wait_for(w: &Client, secs: u64, mut done: impl FnMut() -> bool) -> Res {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        if Instant::now() > deadline {
            return Err("timed out waiting for events".into());
        }
        w.process_events(Duration::from_millis(20));
    }
    Ok(())
}

/// The last rank dies in two notify-termination groups: one without a leader (every
/// member hears of it), one led by rank 0 (only the leader does). Also checks the order
/// of the handler chain: single-code, multi-code, default, results passed down.
fn member_failed() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let last = w.size() - 1;
    // Handlers first: events may arrive while the second construct is still completing.
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    // Registered in reverse of the order they must run in.
    for (name, codes) in [
        ("default", EventCodes::All),
        (
            "multi",
            EventCodes::Many(vec![EventCode::MemberFailed, EventCode::MemberLeft]),
        ),
        ("single", EventCodes::One(EventCode::MemberFailed)),
    ] {
        let o = order.clone();
        w.register_event_handler(codes, move |e, results| {
            let seen: Vec<String> = results.iter().map(|(k, _)| k.clone()).collect();
            o.lock().unwrap().push(format!(
                "{name}{seen:?}@{}",
                e.group.clone().unwrap_or_default()
            ));
            results.push((name.to_owned(), String::new()));
            EventFlow::Continue
        });
    }
    let failed = collect(&w, EventCodes::One(EventCode::MemberFailed));
    let nt = GroupDirectives::default().notify_termination();
    w.group_construct("all-hear", &all(&w), &nt, t(30))?;
    w.group_construct("leader-hears", &all(&w), &nt.clone().leader(0), t(30))?;
    if r == last {
        std::process::abort();
    }
    let want = if r == 0 { 2 } else { 1 };
    wait_for(&w, 10, || failed.lock().unwrap().len() >= want)?;
    // Nothing more arrives.
    w.process_events(Duration::from_millis(200));
    let got = failed.lock().unwrap().clone();
    let mut groups: Vec<String> = got.iter().filter_map(|e| e.group.clone()).collect();
    groups.sort();
    if got.iter().any(|e| e.rank != Some(last)) {
        return Err(format!("events name the wrong rank: {got:?}").into());
    }
    let chain = order.lock().unwrap().clone();
    println!("rank {r} member-failed groups {groups:?} chain {chain:?}");
    survivors_fence(&w, last)
}

/// The leader (last rank) of a notify-termination group dies. The survivors' leader-failed
/// events are cached until a handler registers; then ranks 0 and 1 both claim the
/// leadership: the root server accepts one, and every survivor hears who.
fn leader() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let last = w.size() - 1;
    let d = GroupDirectives::default().notify_termination().leader(last);
    w.group_construct("led", &all(&w), &d, t(30))?;
    if r == last {
        std::process::abort();
    }
    // No leader-failed handler yet: that event is cached. The server sends it before
    // member-failed, so once member-failed was handled, leader-failed is in the cache.
    let member = collect(&w, EventCodes::One(EventCode::MemberFailed));
    wait_for(&w, 10, || !member.lock().unwrap().is_empty())?;
    let failed = collect(&w, EventCodes::One(EventCode::LeaderFailed));
    let from_cache = failed.lock().unwrap().len();
    let selected = collect(&w, EventCodes::One(EventCode::LeaderSelected));
    // Everyone has seen the failure before anyone claims.
    survivors_fence(&w, last)?;
    let won = if r <= 1 {
        match w.group_claim_leadership("led") {
            Ok(()) => "won",
            Err(_) => "lost",
        }
    } else {
        "none"
    };
    wait_for(&w, 10, || !selected.lock().unwrap().is_empty())?;
    let who = selected.lock().unwrap()[0].rank.ok_or("no rank")?;
    println!("rank {r} leader-failed from cache {from_cache} claim {won} selected {who}");
    survivors_fence(&w, last)
}

/// Rank 1 leaves a group; the others get a member-left event and the new membership.
fn leave() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    w.group_construct("lv", &all(&w), &GroupDirectives::default(), t(30))?;
    let left = collect(&w, EventCodes::One(EventCode::MemberLeft));
    if r == 1 {
        w.group_leave("lv")?;
        if w.group_destruct("lv", t(1)).is_ok() {
            return Err("a process that left could still destruct".into());
        }
        println!("rank {r} left");
        return Ok(());
    }
    wait_for(&w, 10, || !left.lock().unwrap().is_empty())?;
    let e = left.lock().unwrap()[0].clone();
    let g = w.group("lv")?.ok_or("group gone")?;
    println!(
        "rank {r} member-left rank {:?} members {:?} query {:?}",
        e.rank, e.members, g.members
    );
    Ok(())
}

/// Process sets defined and deleted while the job runs.
fn psets() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let defined = collect(&w, EventCodes::One(EventCode::PsetDefined));
    let deleted = collect(&w, EventCodes::One(EventCode::PsetDeleted));
    w.fence(
        weft_wireup::Procs::All,
        weft_wireup::FenceMode::SyncOnly,
        t(30),
    )?;
    if r == 0 {
        w.define_pset("dyn", &[2, 1])?;
        let again = w.define_pset("dyn", &[0]).is_err();
        let builtin = w.define_pset("weft://world", &[0]).is_err();
        let outside = w.define_pset("big", &[99]).is_err();
        let unknown = w.delete_pset("never").is_err();
        println!(
            "rank 0 refused twice {again} builtin {builtin} outside {outside} unknown {unknown}"
        );
    }
    wait_for(&w, 10, || !defined.lock().unwrap().is_empty())?;
    let members = w.pset_members("dyn");
    let listed = w.pset_names().iter().any(|n| n == "dyn");
    let ev = defined.lock().unwrap()[0].clone();
    w.fence(
        weft_wireup::Procs::All,
        weft_wireup::FenceMode::SyncOnly,
        t(30),
    )?;
    if r == 0 {
        w.delete_pset("dyn")?;
    }
    wait_for(&w, 10, || !deleted.lock().unwrap().is_empty())?;
    println!(
        "rank {r} defined {:?} {:?} members {members:?} listed {listed} after delete {:?}",
        ev.pset,
        ev.members,
        w.pset_members("dyn")
    );
    Ok(())
}

/// Rank 0 invites ranks 1, 2 and 3 with a 1 s timeout: 1 accepts, 2 declines, 3 never
/// answers. The group is {0, 1} with one PGCID; the leader heard of each answer.
fn invite() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let invited = collect(&w, EventCodes::One(EventCode::Invited));
    let complete = collect(&w, EventCodes::One(EventCode::ConstructComplete));
    let answers = collect(
        &w,
        EventCodes::Many(vec![
            EventCode::InviteAccepted,
            EventCode::InviteDeclined,
            EventCode::InviteFailed,
        ]),
    );
    let d = GroupDirectives::default().assign_context_id();
    match r {
        0 => {
            let g = w.group_invite("inv", &[1, 2, 3], &d, Some(Duration::from_secs(1)))?;
            let mut seen: Vec<String> = answers
                .lock()
                .unwrap()
                .iter()
                .map(|e| format!("{:?}:{}", e.code, e.rank.unwrap_or(99)))
                .collect();
            seen.sort();
            wait_for(&w, 10, || !complete.lock().unwrap().is_empty())?;
            println!(
                "rank 0 formed members {:?} left_out {:?} pgcid {} answers {seen:?}",
                g.members,
                g.left_out,
                g.pgcid.ok_or("no pgcid")?
            );
        }
        1 | 2 => {
            wait_for(&w, 10, || !invited.lock().unwrap().is_empty())?;
            let e = invited.lock().unwrap()[0].clone();
            let leader = e.rank.ok_or("no leader")?;
            let got = w.group_join("inv", leader, r == 1, t(10))?;
            match got {
                Some(g) => {
                    wait_for(&w, 10, || !complete.lock().unwrap().is_empty())?;
                    println!(
                        "rank {r} joined members {:?} pgcid {}",
                        g.members,
                        g.pgcid.ok_or("no pgcid")?
                    );
                }
                None => println!("rank {r} declined"),
            }
        }
        _ => {
            wait_for(&w, 10, || !invited.lock().unwrap().is_empty())?;
            std::thread::sleep(Duration::from_millis(1500));
            let late = w.group_join("inv", 0, true, t(5));
            println!("rank {r} late join refused {}", late.is_err());
        }
    }
    Ok(())
}

/// The leader dies after rank 1 accepted: rank 1's join fails and it, like rank 2 that
/// never answered, gets a construct-abort event.
fn invite_abort() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    let invited = collect(&w, EventCodes::One(EventCode::Invited));
    let aborted = collect(&w, EventCodes::One(EventCode::ConstructAbort));
    let accepted = collect(&w, EventCodes::One(EventCode::InviteAccepted));
    if r == 0 {
        std::thread::scope(|s| {
            s.spawn(|| {
                let _ = w.group_invite("doomed", &[1, 2], &GroupDirectives::default(), t(30));
            });
            // Dispatch events read by the inviting thread until rank 1 accepted.
            let _ = wait_for(&w, 10, || !accepted.lock().unwrap().is_empty());
            std::process::abort();
        });
        return Ok(());
    }
    wait_for(&w, 10, || !invited.lock().unwrap().is_empty())?;
    let start = Instant::now();
    let joined = if r == 1 {
        match w.group_join("doomed", 0, true, t(10)) {
            Err(GroupError::ProcGone { rank: 0, .. }) => "failed",
            other => return Err(format!("join should fail, got {other:?}").into()),
        }
    } else {
        "none"
    };
    wait_for(&w, 10, || !aborted.lock().unwrap().is_empty())?;
    println!(
        "rank {r} join {joined} abort after {} ms",
        start.elapsed().as_millis()
    );
    Ok(())
}

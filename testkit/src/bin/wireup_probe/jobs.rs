//! The probe's scenarios about jobs of a runtime (issue 33): spawning, runtime control,
//! families for `ci/chaos-family.sh`, and the events a parent gets.

use std::io::Write;
use std::time::{Duration, Instant};

use weft_wireup::{
    AllocRequest, Client, FenceMode, GetOpts, JobAction, NsId, ProcId, ProcSel, Procs, Scope,
    SessionRef, SpawnApp, SpawnOptions, Value,
};

use super::{t, Res};

/// `spawn N [PROGRAM ARGS...]`: spawns N processes of PROGRAM (by default this probe as
/// `spawn-child`) and prints the new job (or why there is none); the children get
/// `WEFT_PROBE_PARENT` = this job's nspace; it also prints its own parent
/// (`Client::parent`: "spawner 0: parent none" for a job `weft run` started). With `WEFT_PROBE_WAIT_MS` set, it then waits
/// that long and prints the new job's shared-memory segments still in /dev/shm.
pub(crate) fn spawn(args: &[String]) -> Res {
    let w = Client::init()?;
    let np: u32 = args.get(1).ok_or("spawn N [PROGRAM ARGS...]")?.parse()?;
    let (program, pargs) = match args.get(2) {
        Some(p) => (p.clone(), args[3..].to_vec()),
        None => (
            std::env::current_exe()?.display().to_string(),
            vec!["spawn-child".to_owned()],
        ),
    };
    let app = SpawnApp {
        program,
        args: pargs,
        np,
        env: vec![("WEFT_PROBE_PARENT".into(), w.nspace().to_owned())],
        cwd: None,
    };
    let own = w.parent().map_or("none".to_owned(), |p| p.to_string());
    println!("spawner {}: parent {own}", w.rank());
    match w.spawn(&[app]) {
        Ok(s) => {
            println!(
                "parent {} of {}: spawned {} ({})",
                w.rank(),
                w.nspace(),
                s.nspace,
                s.ns
            );
            if let Ok(ms) = std::env::var("WEFT_PROBE_WAIT_MS") {
                std::thread::sleep(Duration::from_millis(ms.parse()?));
                let mut left: Vec<String> = std::fs::read_dir("/dev/shm")?
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&format!("{}-", s.nspace)))
                    .collect();
                left.sort();
                println!(
                    "parent {}: segments of {} left: {left:?}",
                    w.rank(),
                    s.nspace
                );
            }
        }
        Err(e) => println!("parent {} of {}: {e}", w.rank(), w.nspace()),
    }
    std::io::stdout().flush()?;
    w.finalize()?;
    Ok(())
}

/// A spawned process: it outlives its parent (300 ms), fences with its job (Full, with
/// a key of each), reads a sibling's key, and prints who it is and its parent (the
/// spawner's nspace it was given, and the process `Client::parent` names).
pub(crate) fn spawn_child() -> Res {
    let w = Client::init()?;
    std::thread::sleep(Duration::from_millis(300));
    w.put(
        Scope::Global,
        "who",
        Value::Str(format!("child {}", w.rank())),
    )?;
    w.commit()?;
    w.fence(Procs::All, FenceMode::Full, t(30))?;
    let next = (w.rank() + 1) % w.size();
    let got = w.get(next, "who", GetOpts::default())?;
    println!(
        "child {} of {} in {} ({}), parent {} ({}), read {got:?} from rank {next}",
        w.rank(),
        w.size(),
        w.nspace(),
        w.ns(),
        std::env::var("WEFT_PROBE_PARENT").unwrap_or_default(),
        w.parent().map_or("none".to_owned(), |p| p.to_string()),
    );
    std::io::stdout().flush()?;
    w.finalize()?;
    Ok(())
}

/// `control` (2 processes on 2 logical nodes; `WEFT_PROBE_DIR` an empty directory): the
/// native runtime control, from rank 0 (the others only finalize). It allocates two
/// sessions of one node (a third is refused), spawns 2 shell children into the second that trap SIGUSR1, signals their job once both are ready,
/// spawns a `sleep 30` and terminates its job, tries bad requests, and releases the
/// session; each step prints what it got.
pub(crate) fn control() -> Res {
    let w = Client::init()?;
    if w.rank() != 0 {
        w.finalize()?;
        return Ok(());
    }
    let dir = std::env::var("WEFT_PROBE_DIR")?;
    let sh = |script: &str, np| SpawnApp {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        np,
        env: vec![("DIR".into(), dir.clone())],
        cwd: None,
    };
    let a = w.allocate(&AllocRequest::new(1).alloc_id("probe-a"))?;
    println!(
        "allocated session {} {} nodes {:?} active {}",
        a.session, a.alloc_id, a.nodes, a.active
    );
    let b = w.allocate(&AllocRequest::new(1).alloc_id("probe-b"))?;
    println!(
        "allocated session {} {} nodes {:?}",
        b.session, b.alloc_id, b.nodes
    );
    match w.allocate(&AllocRequest::new(1)) {
        Err(e) => println!("third allocation: {e}"),
        Ok(x) => println!("third allocation: unexpected {x:?}"),
    }
    let trap = r#"trap 'echo "child $WEFT_RANK on node $WEFT_NODE got USR1"; touch "$DIR/done.$WEFT_RANK"; exit 0' USR1
touch "$DIR/ready.$WEFT_RANK"
while :; do sleep 0.05; done"#;
    let opts = SpawnOptions {
        session: Some(SessionRef::AllocId("probe-b".into())),
        separate: false,
    };
    let job = w.spawn_with(&[sh(trap, 2)], &opts)?;
    wait_for_files(&dir, "ready", 2)?;
    w.job_control(&[ProcSel::All(job.ns)], JobAction::Signal(10))?;
    println!("signalled {}", job.ns);
    wait_for_files(&dir, "done", 2)?;
    let sleeper = w.spawn(&[sh("exec sleep 30", 1)])?;
    w.job_control(&[ProcSel::All(sleeper.ns)], JobAction::Terminate)?;
    println!("terminated {}", sleeper.ns);
    for (what, targets, action) in [
        ("unknown job", vec![ProcSel::All(NsId(99))], JobAction::Kill),
        (
            "rank beyond",
            vec![ProcSel::One(ProcId::new(w.ns(), 5))],
            JobAction::Signal(10),
        ),
        (
            "no signal",
            vec![ProcSel::All(w.ns())],
            JobAction::Signal(0),
        ),
        ("no target", vec![], JobAction::Pause),
    ] {
        match w.job_control(&targets, action) {
            Err(e) => println!("{what}: {e}"),
            Ok(()) => println!("{what}: unexpectedly accepted"),
        }
    }
    for s in [
        SessionRef::Id(a.session),
        SessionRef::AllocId("probe-b".into()),
    ] {
        let r = w.allocate(&AllocRequest::release(s))?;
        println!("released session {} active {}", r.session, r.active);
    }
    match w.spawn_with(&[sh("true", 1)], &opts) {
        Err(e) => println!("spawn into the released session: {e}"),
        Ok(s) => println!("spawn into the released session: unexpectedly {}", s.nspace),
    }
    std::io::stdout().flush()?;
    w.finalize()?;
    Ok(())
}

/// Waits up to 30 s for files `DIR/PREFIX.0` .. `DIR/PREFIX.{n-1}`.
fn wait_for_files(dir: &str, prefix: &str, n: u32) -> Res {
    let start = Instant::now();
    while (0..n).any(|r| !std::path::Path::new(&format!("{dir}/{prefix}.{r}")).exists()) {
        if start.elapsed() > Duration::from_secs(30) {
            return Err(format!("no {dir}/{prefix}.* of every child after 30 s").into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// `family NCHILD ITERS [session]` (`ci/chaos-family.sh`): rank 0 spawns a job of NCHILD
/// `chaos_probe ITERS` (the program next to this one; with `session`, into a session of
/// one logical node it asks for first, which ends with this job), then every rank fences
/// with the others 20 times, 50 ms apart, and prints `parent R ok`. A fence that fails
/// prints `parent R error: ...` (naming whom it lost) and exits 1.
pub(crate) fn family(args: &[String]) -> Res {
    let nchild: u32 = args
        .get(1)
        .ok_or("family NCHILD ITERS [session]")?
        .parse()?;
    let iters: u64 = args
        .get(2)
        .ok_or("family NCHILD ITERS [session]")?
        .parse()?;
    let in_session = args.get(3).is_some_and(|a| a == "session");
    let w = Client::init()?;
    let r = w.rank();
    if r == 0 {
        let exe = std::env::current_exe()?;
        let probe = exe.with_file_name("chaos_probe").display().to_string();
        let opts = if in_session {
            let s = w.allocate(&AllocRequest::new(1))?;
            println!("parent 0: session {} nodes {:?}", s.session, s.nodes);
            SpawnOptions {
                session: Some(SessionRef::Id(s.session)),
                separate: false,
            }
        } else {
            SpawnOptions::default()
        };
        let app = SpawnApp {
            program: probe,
            args: vec![iters.to_string()],
            np: nchild,
            env: Vec::new(),
            cwd: None,
        };
        let job = w.spawn_with(&[app], &opts)?;
        println!("parent 0: spawned {} ({})", job.nspace, job.ns);
    }
    for i in 0..20 {
        if let Err(e) = w.fence(Procs::All, FenceMode::SyncOnly, t(10)) {
            println!("parent {r} error: round {i}: {e}");
            std::io::stdout().flush()?;
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("parent {r} ok");
    std::io::stdout().flush()?;
    w.finalize()?;
    Ok(())
}

/// `spawn-watch` (1 process): spawns 2 shell processes that exit with status 3 without
/// ever connecting, and prints each `SpawnedProcEnded` event it gets (waiting up to 20 s
/// for both).
pub(crate) fn spawn_watch() -> Res {
    use std::sync::{Arc, Mutex};
    use weft_wireup::{EventCode, EventCodes, EventFlow};
    let w = Client::init()?;
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = got.clone();
    w.register_event_handler(
        EventCodes::One(EventCode::SpawnedProcEnded),
        move |ev, _| {
            let proc = ev.proc.map(|p| p.to_string()).unwrap_or_default();
            sink.lock()
                .unwrap()
                .push(format!("event {:?} {proc}: {}", ev.code, ev.reason));
            EventFlow::Complete
        },
    );
    let job = w.spawn(&[SpawnApp {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), "sleep 0.2; exit 3".into()],
        np: 2,
        env: Vec::new(),
        cwd: None,
    }])?;
    println!("spawned {}", job.ns);
    let t0 = Instant::now();
    while got.lock().unwrap().len() < 2 && t0.elapsed() < Duration::from_secs(20) {
        w.process_events(Duration::from_millis(100));
    }
    let mut lines = got.lock().unwrap().clone();
    lines.sort();
    for l in lines {
        println!("{l}");
    }
    std::io::stdout().flush()?;
    w.finalize()?;
    Ok(())
}

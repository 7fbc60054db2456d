//! The probe's scenarios of the native connect (issue 33): a job spawns children, both
//! connect, read each other's data, disconnect, connect again and see the children end.

use std::io::Write;
use std::time::{Duration, Instant};

use weft_wireup::{Client, Connection, GetOpts, ProcId, ProcSel, Scope, SpawnApp, Value};

use super::{t, Res};

fn show(c: &Connection) -> String {
    let procs: Vec<String> = c.procs.iter().map(ProcId::to_string).collect();
    format!(
        "pgcid {} procs [{}] nodes {:?}",
        c.pgcid,
        procs.join(" "),
        c.nodes
    )
}

/// Connects `all` and prints the connection; on a failure, prints it (`None`: the
/// scenario ends there).
fn connect_or_say(
    w: &Client,
    all: &[ProcSel],
) -> Result<Option<Connection>, Box<dyn std::error::Error>> {
    let me = w.me();
    match w.connect(all, t(30)) {
        Ok(c) => {
            say(format!("connect {me}: {}", show(&c)))?;
            Ok(Some(c))
        }
        Err(e) => {
            say(format!("connect {me}: failed: {e}"))?;
            Ok(None)
        }
    }
}

fn say(line: String) -> Res {
    println!("{line}");
    std::io::stdout().flush()?;
    Ok(())
}

/// `connect N [die]`: rank 0 of this job spawns N
/// processes of this probe as `connect-child` (with `die`, child 1 exits 3 before it
/// connects); then the parents and the children connect, each side reads the other's
/// key (`pkey`, `ckey`), all disconnect (a read afterwards is refused), connect again
/// (a new PGCID), and the parents wait until `Client::gone_proc` shows child 0's end.
pub(crate) fn connect(args: &[String]) -> Res {
    let w = Client::init()?;
    let me = w.me();
    let np: u32 = args.get(1).ok_or("connect N [die]")?.parse()?;
    let die = args.get(2).is_some_and(|a| a == "die");
    w.put(
        Scope::Global,
        "pkey",
        Value::Str(format!("parent {}", w.rank())),
    )?;
    w.commit()?;
    // Rank 0 spawns; the others learn the children's job from a fence-published key.
    let child = if w.rank() == 0 {
        let mut cargs = vec!["connect-child".to_owned()];
        if die {
            cargs.push("die".into());
        }
        let app = SpawnApp {
            program: std::env::current_exe()?.display().to_string(),
            args: cargs,
            np,
            env: Vec::new(),
            cwd: None,
        };
        let s = w.spawn(&[app])?;
        w.put(Scope::Global, "child", Value::U64(u64::from(s.ns.0)))?;
        w.commit()?;
        w.fence(weft_wireup::Procs::All, weft_wireup::FenceMode::Full, t(30))?;
        s.ns
    } else {
        w.fence(weft_wireup::Procs::All, weft_wireup::FenceMode::Full, t(30))?;
        match w.get(0, "child", GetOpts::default())? {
            Value::U64(n) => weft_wireup::NsId(n as u32),
            other => return Err(format!("child key {other:?}").into()),
        }
    };
    let all = [ProcSel::All(me.ns), ProcSel::All(child)];
    if connect_or_say(&w, &all)?.is_none() {
        w.finalize()?;
        return Ok(());
    }
    let got = w.get_proc(
        ProcId::new(child, 0),
        "ckey",
        GetOpts::default().timeout(Duration::from_secs(30)),
    )?;
    say(format!(
        "connect {me}: read {got:?} from {}",
        ProcId::new(child, 0)
    ))?;
    w.disconnect(&all, t(30))?;
    match w.get_proc(ProcId::new(child, 0), "ckey", GetOpts::default()) {
        Ok(v) => say(format!("connect {me}: after disconnect read {v:?}"))?,
        Err(e) => say(format!("connect {me}: after disconnect: {e}"))?,
    }
    let again = w.connect(&all, t(30))?;
    say(format!("connect {me}: again {}", show(&again)))?;
    let gone = ProcId::new(child, 0);
    let start = Instant::now();
    let why = loop {
        if let Some(why) = w.gone_proc(gone) {
            break why;
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err(format!("{gone}'s end never showed").into());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    say(format!("connect {me}: {gone} {why}"))?;
    w.finalize()?;
    Ok(())
}

/// A child of `connect`: before connecting, a read of its parent's key is refused; then
/// it does what the parents do, the other way round.
pub(crate) fn connect_child(args: &[String]) -> Res {
    let w = Client::init()?;
    let me = w.me();
    let parent = w.parent().ok_or("a connect-child without a parent")?;
    if args.get(1).is_some_and(|a| a == "die") && w.rank() == 1 {
        std::process::exit(3);
    }
    w.put(
        Scope::Global,
        "ckey",
        Value::Str(format!("child {}", w.rank())),
    )?;
    w.commit()?;
    match w.get_proc(parent, "pkey", GetOpts::default()) {
        Ok(v) => say(format!("child {me}: unconnected read {v:?}"))?,
        Err(e) => say(format!("child {me}: unconnected: {e}"))?,
    }
    let all = [ProcSel::All(parent.ns), ProcSel::All(me.ns)];
    let Some(c) = connect_or_say(&w, &all)? else {
        w.finalize()?;
        return Ok(());
    };
    let last = ProcId::new(
        parent.ns,
        c.procs.iter().filter(|p| p.ns == parent.ns).count() as u32 - 1,
    );
    let got = w.get_proc(
        last,
        "pkey",
        GetOpts::default().timeout(Duration::from_secs(30)),
    )?;
    say(format!("connect {me}: read {got:?} from {last}"))?;
    w.disconnect(&all, t(30))?;
    let again = w.connect(&all, t(30))?;
    say(format!("connect {me}: again {}", show(&again)))?;
    w.finalize()?;
    Ok(())
}

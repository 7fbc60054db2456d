//! Intercommunicators under `weft run` (issue 33): a parent communicator spawns a job
//! (`Communicator::spawn`), the children get theirs (`Fabric::parent`), and both sides
//! exchange 8-byte and 1 MiB messages (eager and rendezvous) each way, a wildcard
//! receive among them, then disconnect. Prints facts for the test; exits 1 on any
//! surprise.
//!
//! `intercomm_probe parent N [die]`: the world spawns N children (with `die`, child 1
//! exits 3 after connecting, before it answers). `intercomm_probe child [die]`: what
//! the children run.

use std::io::Write;

use weft::prelude::*;

type Res = Result<(), Box<dyn std::error::Error>>;

const BIG: usize = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let out = match args.get(1).map(String::as_str) {
        Some("parent") => parent(&args),
        Some("child") => child(&args),
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
            ic.disconnect()?;
            say(format!("parent {me}: disconnected"))?;
        }
    }
    fabric.finalize()?;
    Ok(())
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
    ic.disconnect()?;
    say(format!("child {me}: disconnected"))?;
    fabric.finalize()?;
    Ok(())
}

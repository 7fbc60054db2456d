//! The program the name-service tests run under `weft run` (`Client::publish`, `lookup`,
//! `unpublish`): one scenario per first argument; it prints what it found for the test
//! to assert on, and exits 1 on any surprise.
//!
//! `pair`: rank 0 spawns one `child`, then publishes `parent-port` (after 200 ms, so the
//! others' lookups really wait), tries it again (a duplicate), and waits for the child's
//! `child-port`; the other ranks wait for `parent-port`; rank 0 also looks up a key
//! nobody publishes, at once and with a 100 ms wait. `child` waits for `parent-port`,
//! tries to withdraw it (not its own), publishes `child-port` (for as long as it lives),
//! and waits for rank 0's `parent-done`, published once rank 0 found `child-port`.

use std::io::Write;
use std::time::Duration;

use weft_wireup::{Client, LookupOptions, NameRange, NameValue, Persistence, Published, SpawnApp};

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().map(String::as_str).unwrap_or("");
    let out = match scenario {
        "pair" => pair(),
        "child" => child(),
        other => Err(format!("unknown scenario {other:?}").into()),
    };
    if let Err(e) = out {
        eprintln!("names_probe {scenario}: {e}");
        std::process::exit(1);
    }
}

const WAIT: LookupOptions = LookupOptions {
    range: NameRange::Session,
    wait: Some(Duration::from_secs(20)),
};

/// `key=value from nspace:rank`.
fn show(p: &Published) -> String {
    let v = match &p.value {
        NameValue::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    };
    format!("{}={v} from {}:{}", p.key, p.nspace, p.owner.rank)
}

fn found(w: &Client, key: &str) -> Result<String, Box<dyn std::error::Error>> {
    let got = w.lookup(&[key], WAIT)?;
    Ok(got.iter().map(show).collect::<Vec<_>>().join(", "))
}

fn pair() -> Res {
    let w = Client::init()?;
    let r = w.rank();
    if r == 0 {
        let app = SpawnApp {
            program: std::env::current_exe()?.display().to_string(),
            args: vec!["child".into()],
            np: 1,
            env: Vec::new(),
            cwd: None,
        };
        let s = w.spawn(&[app])?;
        println!("rank 0 spawned {}", s.nspace);
        std::thread::sleep(Duration::from_millis(200));
        let port = [("parent-port", b"p0".as_slice())];
        w.publish(&port, NameRange::Session, Persistence::Session)?;
        match w.publish(&port, NameRange::Session, Persistence::Session) {
            Ok(()) => return Err("a second publish of parent-port succeeded".into()),
            Err(e) => println!("rank 0 again: {e}"),
        }
        println!("rank 0 found {}", found(&w, "child-port")?);
        // The child's name lives as long as the child: it waits for this one to end.
        let done = [("parent-done", b"1".as_slice())];
        w.publish(&done, NameRange::Session, Persistence::Proc)?;
        let at_once = LookupOptions::default();
        match w.lookup(&["nobody"], at_once) {
            Ok(v) => return Err(format!("found {v:?}").into()),
            Err(e) => println!("rank 0 at once: {e}"),
        }
        let briefly = LookupOptions {
            wait: Some(Duration::from_millis(100)),
            ..at_once
        };
        match w.lookup(&["nobody"], briefly) {
            Ok(v) => return Err(format!("found {v:?}").into()),
            Err(e) => println!("rank 0 briefly: {e}"),
        }
    } else {
        println!("rank {r} found {}", found(&w, "parent-port")?);
    }
    std::io::stdout().flush()?;
    w.finalize()?;
    Ok(())
}

fn child() -> Res {
    let w = Client::init()?;
    println!("child found {}", found(&w, "parent-port")?);
    match w.unpublish(&["parent-port"], NameRange::Session) {
        Ok(()) => return Err("withdrew the parent's name".into()),
        Err(e) => println!("child withdrawing: {e}"),
    }
    w.publish(
        &[("child-port", b"c0".as_slice())],
        NameRange::Session,
        Persistence::Proc,
    )?;
    // Published for as long as this process lives: it stays until the parent found it.
    found(&w, "parent-done")?;
    std::io::stdout().flush()?;
    w.finalize()?;
    Ok(())
}

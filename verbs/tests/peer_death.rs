//! Two processes: this test binary spawns itself as the peer, they exchange cards through
//! the child's stdin/stdout, connect over the device, and the parent kills the child in the
//! middle of a transfer. The survivor must get an error naming the peer within 2 s, and all
//! verbs objects (QPs, MRs) must be released (checked with `rdma resource show` per process
//! and with the crate's own counters).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "WEFT_VERBS_PEER_CHILD";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Counts `rdma resource show KIND` entries: `(ours, of all user processes)`. The kernel
/// records the id of the thread that created an object, so "ours" means this thread's.
/// `None` without the tool.
fn rdma_objects(kind: &str) -> Option<(usize, usize)> {
    let out = Command::new("rdma")
        .args(["resource", "show", kind])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() }.to_string();
    let text = String::from_utf8_lossy(&out.stdout);
    let (mut ours, mut user) = (0, 0);
    for l in text.lines() {
        let t: Vec<&str> = l.split_whitespace().collect();
        if let Some(w) = t.windows(2).find(|w| w[0] == "pid") {
            user += 1;
            if w[1] == tid {
                ours += 1;
            }
        }
    }
    Some((ours, user))
}

/// Kills and reaps the child however the test ends.
struct Peer(std::process::Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The peer: runs only when spawned by the test below.
#[test]
fn peer_child() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let mut ep = common::open(2, |_| {}).expect("child: no device");
    println!("CARD {}", hex(&ep.card()));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let card = unhex(line.trim().strip_prefix("CARD ").expect("parent card"));
    ep.connect(1, &card).expect("child connect");
    let mut got = 0u64;
    let mut reported = false;
    loop {
        ep.poll(&mut |peer, f| {
            assert_eq!(peer, 1);
            common::check(f);
            got += 1;
        })
        .expect("child poll");
        if got >= 100 && !reported {
            println!("RECEIVED {got}");
            reported = true;
        }
    }
}

#[test]
fn a_killed_peer_is_an_error_naming_it_and_nothing_leaks() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let base_qp = rdma_objects("qp");
    let base_mr = rdma_objects("mr");
    let Some(mut ep) = common::open(1, |_| {}) else {
        return;
    };
    let mut child = Peer(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "peer_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the peer"),
    );
    let (tx, rx) = mpsc::channel::<String>();
    let out = BufReader::new(child.0.stdout.take().unwrap());
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let card = loop {
        let l = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the child printed no card");
        // The harness may have printed "test peer_child ... " on the same line.
        if let Some(at) = l.find("CARD ") {
            break unhex(l[at + 5..].trim());
        }
    };
    writeln!(child.0.stdin.as_mut().unwrap(), "CARD {}", hex(&ep.card())).unwrap();
    let conn = ep.connect(2, &card).expect("connect");

    // Transfer until the child has received 100 frames, then kill it while still sending.
    let start = Instant::now();
    let mut seq = 0u32;
    let mut killed_at = None;
    let mut sent_after_kill = 0;
    let mut alive = None;
    let err = loop {
        let (h, p) = common::frame(seq, (seq as usize * 13) % 4000);
        match ep.try_send(conn, &h, &p) {
            Ok(true) => {
                seq += 1;
                if killed_at.is_some() {
                    sent_after_kill += 1;
                }
            }
            Ok(false) => {}
            Err(e) => break e,
        }
        if let Err(e) = ep.poll(&mut |_, _| {}) {
            break e;
        }
        if killed_at.is_none() && rx.try_recv().is_ok_and(|l| l.contains("RECEIVED")) {
            if let (Some((q, _)), Some((m, _))) = (rdma_objects("qp"), rdma_objects("mr")) {
                alive = Some((q, m));
            }
            // Still sending: the kill lands mid-transfer.
            child.0.kill().unwrap();
            child.0.wait().unwrap();
            killed_at = Some(Instant::now());
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no transfer / no error: {seq} frames sent, killed {:?} ago, ready {}, {:?}",
            killed_at.map(|t: Instant| t.elapsed()),
            ep.is_ready(conn),
            ep.stats()
        );
    };
    let killed_at = killed_at.unwrap_or_else(|| panic!("error before the kill: {err}"));
    let took = killed_at.elapsed();
    println!(
        "after {seq} frames ({sent_after_kill} after the kill): {err} ({took:?} after the kill)"
    );
    assert!(took < Duration::from_secs(2), "the error took {took:?}");
    assert_eq!(err.peer(), Some(2), "the error names the peer: {err}");
    assert!(
        matches!(err, weft_verbs::Error::WorkCompletion { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("status"), "{err}");
    // The connection stays failed: later sends report the same peer.
    let again = ep
        .try_send(conn, &[0; 32], &[])
        .expect_err("a failed connection refuses sends");
    assert_eq!(again.peer(), Some(2));

    // The dead process's queue pairs and MRs are gone; ours go when the endpoint drops.
    if let (Some((bq, bqu)), Some((bm, bmu)), Some((q, m))) = (base_qp, base_mr, alive) {
        println!("rdma resource show: before open qp {bq} mr {bm}, connected qp {q} mr {m}");
        assert!(
            q > bq && m >= bm + 4,
            "the endpoint's objects are visible (qp {q}, mr {m})"
        );
        let (q2, qu) = rdma_objects("qp").unwrap();
        let (m2, mu) = rdma_objects("mr").unwrap();
        assert_eq!((q2, m2), (q, m), "ours are still there");
        assert_eq!(
            (qu - q2, mu - m2),
            (bqu - bq, bmu - bm),
            "the killed peer's QPs and MRs are released"
        );
        drop(ep);
        assert_eq!(rdma_objects("qp"), Some((bq, bqu)), "our QPs are released");
        assert_eq!(rdma_objects("mr"), Some((bm, bmu)), "our MRs are released");
    } else {
        eprintln!("note: `rdma resource show` unavailable; checking the crate's counters only");
        drop(ep);
    }
    assert_eq!(
        weft_verbs::live_objects(),
        weft_verbs::LiveObjects::default(),
        "every verbs object dropped"
    );
}

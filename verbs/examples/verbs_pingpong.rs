//! Small-message ping-pong between two endpoints, each polled by its own thread, to compare
//! with perftest's `ib_send_lat` on the same device:
//!
//! ```text
//! cargo run --release -p weft-verbs --example verbs_pingpong -- [SIZE] [ITERATIONS]
//! ```
//!
//! Prints the half round-trip time (t_avg, like `ib_send_lat`) in microseconds.

use std::sync::mpsc;
use std::time::Instant;

use weft_verbs::{Config, Endpoint, Error};

fn open(id: u32) -> Endpoint {
    match Endpoint::open(Config::from_env(id).expect("WEFT_VERBS_* settings")) {
        Ok(ep) => ep,
        Err(Error::NoDevice { reason }) => {
            eprintln!("pingpong: no RDMA device ({reason})");
            std::process::exit(2);
        }
        Err(e) => panic!("{e}"),
    }
}

/// Sends `iters` frames of `size` bytes (header 32 + payload), each after receiving one.
fn side(mut ep: Endpoint, peer: u32, card: Vec<u8>, size: usize, iters: usize, first: bool) -> f64 {
    let conn = ep.connect(peer, &card).expect("connect");
    let header = [0u8; 32];
    let payload = vec![7u8; size.saturating_sub(32)];
    // Frames that arrive while waiting for room to send (none in a ping-pong).
    let mut early = 0usize;
    let send = |ep: &mut Endpoint, early: &mut usize| {
        while !ep.try_send(conn, &header, &payload).expect("send") {
            *early += ep.poll(&mut |_, _| {}).expect("poll");
        }
    };
    let warmup = iters / 10 + 1;
    let mut start = Instant::now();
    for i in 0..iters + warmup {
        if i == warmup {
            start = Instant::now();
        }
        if first {
            send(&mut ep, &mut early);
        }
        while early == 0 {
            early += ep
                .poll(&mut |_, f| assert_eq!(f.len(), size.max(32)))
                .expect("poll");
        }
        early -= 1;
        if !first {
            send(&mut ep, &mut early);
        }
    }
    // Let the last frames be acknowledged before the endpoint goes.
    let t = start.elapsed().as_secs_f64();
    for _ in 0..1000 {
        let _ = ep.poll(&mut |_, _| {});
    }
    t * 1e6 / (2.0 * iters as f64)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(32, |s| s.parse().expect("SIZE"));
    let iters: usize = args.next().map_or(1000, |s| s.parse().expect("ITERATIONS"));
    let (a, b) = (open(1), open(2));
    let (ca, cb) = (a.card(), b.card());
    println!(
        "device {} max inline {} frame {} bytes",
        a.info().device,
        a.info().max_inline,
        size.max(32)
    );
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let r = side(b, 1, ca, size, iters, false);
        tx.send(()).ok();
        r
    });
    let lat = side(a, 2, cb, size, iters, true);
    rx.recv().ok();
    t.join().unwrap();
    println!(" #bytes #iterations t_avg[usec]");
    println!(" {:<6} {:<11} {:.2}", size.max(32), iters, lat);
}

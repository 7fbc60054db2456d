//! Rendezvous bandwidth: one endpoint RDMA-reads a registered buffer of another (each polled
//! by its own thread), one read at a time as a rendezvous receive does, to compare with
//! perftest's `ib_read_bw` / `ib_write_bw` on the same device. WINDOW reads are kept in
//! flight (an OSU-style bandwidth test has many rendezvous in flight at once):
//!
//! ```text
//! cargo run --release -p weft-verbs --example verbs_readbw -- [SIZE] [ITERATIONS] [WINDOW] [write]
//! ```
//!
//! With `write` the reading side RDMA-writes into the exposed buffer instead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use weft_verbs::{Config, Endpoint, Error};

fn open(id: u32) -> Endpoint {
    match Endpoint::open(Config::from_env(id).expect("WEFT_VERBS_* settings")) {
        Ok(ep) => ep,
        Err(Error::NoDevice { reason }) => {
            eprintln!("readbw: no RDMA device ({reason})");
            std::process::exit(2);
        }
        Err(e) => panic!("{e}"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(1 << 20, |s| s.parse().expect("SIZE"));
    let iters: usize = args.next().map_or(200, |s| s.parse().expect("ITERATIONS"));
    let (mut a, mut b) = (open(1), open(2));
    let (ca, cb) = (a.card(), b.card());
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let stop2 = stop.clone();
    let exposer = std::thread::spawn(move || {
        let src = vec![0x5au8; size];
        b.connect(1, &ca).expect("connect");
        tx.send(b.register(src.as_ptr(), size).expect("register"))
            .unwrap();
        // SYNC: pairs with the store below; only a flag.
        while !stop2.load(Ordering::Relaxed) {
            b.poll(&mut |_, _| {}).expect("poll b");
            // The peer's NIC (kernel rxe here) serves reads and writes: this side only
            // needs polling for the handshake, so it leaves the CPUs to the device.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(src);
    });
    let conn = a.connect(2, &cb).expect("connect");
    let region = rx.recv().unwrap();
    while !a.is_ready(conn) {
        a.poll(&mut |_, _| {}).expect("poll a");
    }
    let window: usize = std::env::args()
        .nth(3)
        .map_or(1, |s| s.parse().expect("WINDOW"));
    let write = std::env::args().nth(4).is_some_and(|s| s == "write");
    let mut dst: Vec<Vec<u8>> = (0..window).map(|_| vec![0u8; size]).collect();
    let warmup = iters / 10 + 1;
    let total = iters + warmup;
    let (mut posted, mut done) = (0usize, 0usize);
    let mut free: Vec<usize> = (0..window).collect();
    let mut owner = std::collections::HashMap::new();
    let mut start = Instant::now();
    while done < total {
        while posted < total && !free.is_empty() {
            let slot = *free.last().unwrap();
            let buf = dst[slot].as_mut_ptr();
            let op = if write {
                // SAFETY: buffer `slot` is not modified until poll_rdma reports the write.
                unsafe { a.rdma_write(conn, buf, size, region.addr, region.rkey) }
            } else {
                // SAFETY: buffer `slot` is not touched until poll_rdma reports the read.
                unsafe { a.rdma_read(conn, buf, size, region.addr, region.rkey) }
            };
            match op.expect("rdma_read") {
                Some(t) => {
                    free.pop();
                    owner.insert(t, slot);
                    posted += 1;
                }
                None => break,
            }
        }
        a.poll(&mut |_, _| {}).expect("poll a");
        a.poll_rdma(&mut |t, r| {
            r.expect("read");
            free.push(owner.remove(&t).unwrap());
            done += 1;
            if done == warmup {
                start = Instant::now();
            }
        });
    }
    let secs = start.elapsed().as_secs_f64();
    // SYNC: pairs with the load in the exposer thread.
    stop.store(true, Ordering::Relaxed);
    exposer.join().unwrap();
    if !write {
        assert!(dst.iter().all(|d| d.iter().all(|&x| x == 0x5a)));
    }
    let op = if write { "write" } else { "read" };
    println!(" #bytes     #iterations    window    op     BW average[MB/sec]");
    let bw = (size * iters) as f64 / secs / 1e6;
    println!(" {size:<10} {iters:<14} {window:<9} {op:<6} {bw:.2}");
}

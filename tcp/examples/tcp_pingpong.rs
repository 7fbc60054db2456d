//! One-way latency of 8-byte messages on 127.0.0.1: a bare blocking TCP ping-pong (what a C
//! program does: write(2) then read(2) on a TCP_NODELAY socket) against two weft-tcp
//! endpoints busy-polling in two threads, with direct reads and with epoll.
//!
//! `cargo run --release -p weft-tcp --example tcp_pingpong [iterations]`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use weft_tcp::{Config, Deliver, Endpoint};

struct Count(usize);

impl Deliver for Count {
    fn frame(&mut self, _: u32, f: &[u8]) {
        assert_eq!(f.len(), 8);
        self.0 += 1;
    }
    fn bulk_received(&mut self, _: u32, _: u64, _: usize) {}
    fn bulk_sent(&mut self, _: u32, _: u64) {}
    fn failed(&mut self, peer: u32, reason: &str) {
        panic!("rank {peer}: {reason}");
    }
}

fn bare(iters: usize) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut b = [0u8; 8];
        while s.read_exact(&mut b).is_ok() {
            s.write_all(&b).unwrap();
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut b = [0u8; 8];
    let mut t = Instant::now();
    for i in 0..iters * 11 / 10 {
        if i == iters / 10 {
            t = Instant::now();
        }
        s.write_all(&b).unwrap();
        s.read_exact(&mut b).unwrap();
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;
    drop(s);
    echo.join().unwrap();
    us
}

/// The same with non-blocking sockets and busy-polling `recv` (no library at all).
fn bare_spin(iters: usize) -> f64 {
    fn read8(s: &mut TcpStream, b: &mut [u8; 8]) -> bool {
        let mut got = 0;
        while got < 8 {
            match s.read(&mut b[got..]) {
                Ok(0) => return false,
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return false,
            }
        }
        true
    }
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 8];
        while read8(&mut s, &mut b) {
            s.write_all(&b).unwrap();
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 8];
    let mut t = Instant::now();
    for i in 0..iters * 11 / 10 {
        if i == iters / 10 {
            t = Instant::now();
        }
        s.write_all(&b).unwrap();
        assert!(read8(&mut s, &mut b));
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;
    drop(s);
    echo.join().unwrap();
    us
}

fn weft(iters: usize, direct_reads: usize) -> f64 {
    let ip = "127.0.0.1".parse().unwrap();
    let mut c0 = Config::new(0, 1, [2, 3], ip);
    c0.direct_reads = direct_reads;
    let mut c1 = c0.clone();
    c1.me = 1;
    let mut a = Endpoint::open(c0).unwrap();
    let mut b = Endpoint::open(c1).unwrap();
    let ca = a.connect(1, &b.card()).unwrap();
    let total = iters * 11 / 10;
    let echo = std::thread::spawn(move || {
        let mut d = Count(0);
        let mut c = None;
        while d.0 < total {
            let before = d.0;
            b.poll(&mut d);
            if d.0 > before {
                let c = *c.get_or_insert_with(|| b.conn_of(0).unwrap());
                for _ in before..d.0 {
                    assert!(b.try_send(c, &[1; 8], &[]).unwrap());
                }
            }
        }
        // Let the last answers out.
        for _ in 0..10_000 {
            b.poll(&mut d);
        }
    });
    let mut d = Count(0);
    let mut t = Instant::now();
    for i in 0..total {
        if i == iters / 10 {
            t = Instant::now();
        }
        assert!(a.try_send(ca, &[0; 8], &[]).unwrap());
        while d.0 == i {
            a.poll(&mut d);
        }
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;
    echo.join().unwrap();
    us
}

fn main() {
    let iters: usize = std::env::args()
        .nth(1)
        .map_or(100_000, |s| s.parse().expect("iterations"));
    println!("# one-way latency of 8-byte messages, 127.0.0.1, {iters} round trips");
    println!(
        "{:<34} {:>8}  {:>7}  {:>7}",
        "# variant", "us", "/block", "/spin"
    );
    for round in 0..3 {
        let b = bare(iters);
        let sp = bare_spin(iters);
        let d = weft(iters, 4);
        let e = weft(iters, 0);
        let row = |name: &str, us: f64| {
            println!("{name:<34} {us:>8.2}  {:>6.2}x  {:>6.2}x", us / b, us / sp);
        };
        println!("# run {round}");
        row("bare blocking TCP", b);
        row("bare busy-polling TCP", sp);
        row("weft-tcp, direct reads", d);
        row("weft-tcp, epoll_wait(0) + recv", e);
    }
}

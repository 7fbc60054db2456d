//! Helpers shared by the integration tests: endpoints on 127.0.0.1 polled in turns, a
//! recording `Deliver`, and a raw client speaking the documented handshake by hand.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use weft_tcp::{Config, Deliver, Endpoint};

pub const JOB: u64 = 0x005e_ed0b;
pub const SECRET: [u64; 2] = [0x1111_2222, 0x3333_4444];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ev {
    Frame(u32, Vec<u8>),
    BulkIn(u32, u64, usize),
    BulkOut(u32, u64),
    Failed(u32, String),
}

#[derive(Debug, Default)]
pub struct Sink {
    pub evs: Vec<Ev>,
}

impl Deliver for Sink {
    fn frame(&mut self, peer: u32, frame: &[u8]) {
        self.evs.push(Ev::Frame(peer, frame.to_vec()));
    }
    fn bulk_received(&mut self, peer: u32, token: u64, len: usize) {
        self.evs.push(Ev::BulkIn(peer, token, len));
    }
    fn bulk_sent(&mut self, peer: u32, token: u64) {
        self.evs.push(Ev::BulkOut(peer, token));
    }
    fn failed(&mut self, peer: u32, reason: &str) {
        self.evs.push(Ev::Failed(peer, reason.to_string()));
    }
}

impl Sink {
    pub fn frames(&self) -> Vec<(u32, Vec<u8>)> {
        self.evs
            .iter()
            .filter_map(|e| match e {
                Ev::Frame(p, f) => Some((*p, f.clone())),
                _ => None,
            })
            .collect()
    }
    pub fn failures(&self) -> Vec<(u32, String)> {
        self.evs
            .iter()
            .filter_map(|e| match e {
                Ev::Failed(p, r) => Some((*p, r.clone())),
                _ => None,
            })
            .collect()
    }
    pub fn count(&self, f: impl Fn(&Ev) -> bool) -> usize {
        self.evs.iter().filter(|e| f(e)).count()
    }
}

pub fn cfg(me: u32) -> Config {
    let mut c = Config::new(me, JOB, SECRET, "127.0.0.1".parse().unwrap());
    c.hello_timeout = Duration::from_millis(300);
    c
}

pub struct Node {
    pub ep: Endpoint,
    pub sink: Sink,
}

impl Node {
    pub fn new(me: u32) -> Node {
        Node::with(cfg(me))
    }
    pub fn with(c: Config) -> Node {
        Node {
            ep: Endpoint::open(c).expect("open"),
            sink: Sink::default(),
        }
    }
    pub fn poll(&mut self) -> usize {
        self.ep.poll(&mut self.sink)
    }
}

/// Polls all nodes in turns until `done`, panicking after 20 s.
pub fn pump(nodes: &mut [&mut Node], mut done: impl FnMut(&[&mut Node]) -> bool) {
    let t = Instant::now();
    while !done(nodes) {
        for n in nodes.iter_mut() {
            n.poll();
        }
        assert!(t.elapsed() < Duration::from_secs(20), "timed out");
    }
}

/// Connects `a` to `b` and pumps until both sides are ready.
pub fn link(a: &mut Node, b: &mut Node) {
    let rb = card_rank(&b.ep.card());
    let ra = card_rank(&a.ep.card());
    let c = a.ep.connect(rb, &b.ep.card()).unwrap();
    pump(&mut [a, b], |n| {
        n[0].ep.is_ready(c) && n[1].ep.conn_of(ra).is_some_and(|c| n[1].ep.is_ready(c))
    });
}

pub fn card_rank(card: &[u8]) -> u32 {
    weft_tcp::Card::decode(card).unwrap().rank
}

/// A HELLO as documented in the crate docs.
pub fn hello(job: u64, secret: [u64; 2], from: u32, to: u32, max_frame: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"WTCP");
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&job.to_le_bytes());
    b.extend_from_slice(&secret[0].to_le_bytes());
    b.extend_from_slice(&secret[1].to_le_bytes());
    b.extend_from_slice(&from.to_le_bytes());
    b.extend_from_slice(&to.to_le_bytes());
    b.extend_from_slice(&max_frame.to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    b
}

pub fn rec_frame(payload: &[u8]) -> Vec<u8> {
    let mut b = (1u64 | (payload.len() as u64) << 8).to_le_bytes().to_vec();
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(payload);
    b
}

pub fn rec_bulk(token: u64, len: u64) -> Vec<u8> {
    let mut b = (2u64 | len << 8).to_le_bytes().to_vec();
    b.extend_from_slice(&token.to_le_bytes());
    b
}

/// What a raw client read after its HELLO: `Ok((kind, rank, reason))`, or `Err` if the
/// connection was closed or reset without a whole reply.
pub fn raw_connect(
    node: &mut Node,
    hello_bytes: &[u8],
) -> (TcpStream, Result<(u16, u32, String), String>) {
    let mut s = TcpStream::connect(node.ep.local_addr()).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(hello_bytes).unwrap();
    s.set_nonblocking(true).unwrap();
    let mut buf = Vec::new();
    let t = Instant::now();
    let res = loop {
        node.poll();
        let mut b = [0u8; 512];
        match s.read(&mut b) {
            Ok(0) => break Err(format!("closed after {} bytes", buf.len())),
            Ok(k) => buf.extend_from_slice(&b[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => break Err(e.to_string()),
        }
        if buf.len() >= 16 {
            let len = u16::from_le_bytes([buf[12], buf[13]]) as usize;
            if buf.len() >= 16 + len {
                let kind = u16::from_le_bytes([buf[6], buf[7]]);
                let rank = u32::from_le_bytes(buf[8..12].try_into().unwrap());
                break Ok((
                    kind,
                    rank,
                    String::from_utf8_lossy(&buf[16..16 + len]).into(),
                ));
            }
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no reply");
    };
    s.set_nonblocking(false).unwrap();
    (s, res)
}

/// A raw client that completed the handshake as rank `from` to `node` (rank `to`).
pub fn raw_peer(node: &mut Node, from: u32, to: u32) -> TcpStream {
    let mf = node.ep.config().max_frame as u32;
    let (s, r) = raw_connect(node, &hello(JOB, SECRET, from, to, mf));
    assert_eq!(r, Ok((2, to, String::new())), "expected an ACK");
    s
}

/// Deterministic bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

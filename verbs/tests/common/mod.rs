//! Helpers of the device tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use weft_verbs::{Config, ConnId, Endpoint, Error};

/// Opens an endpoint with peer id `id`, or explains why there is no device: returns `None`
/// after printing `skipped: no RDMA device (...)`. With `WEFT_VERBS_REQUIRE_DEVICE=1` (set
/// inside the soft-RoCE VM) a missing device fails the test instead.
pub(crate) fn open(id: u32, tweak: impl FnOnce(&mut Config)) -> Option<Endpoint> {
    let mut cfg = Config::from_env(id).expect("WEFT_VERBS_* settings");
    tweak(&mut cfg);
    match Endpoint::open(cfg) {
        Ok(ep) => Some(ep),
        Err(Error::NoDevice { reason }) => {
            if std::env::var("WEFT_VERBS_REQUIRE_DEVICE").as_deref() == Ok("1") {
                panic!("WEFT_VERBS_REQUIRE_DEVICE=1 but no RDMA device: {reason}");
            }
            eprintln!("skipped: no RDMA device ({reason})");
            None
        }
        Err(e) => panic!("opening the verbs endpoint failed: {e}"),
    }
}

/// Two endpoints (ids 1 and 2) in this process.
pub(crate) fn pair(tweak: impl Fn(&mut Config)) -> Option<(Endpoint, Endpoint)> {
    let a = open(1, &tweak)?;
    let b = open(2, &tweak)?;
    Some((a, b))
}

/// Polls both until `done` holds; panics after `secs`. Frames received go to `got_a`
/// (received by a) and `got_b`.
pub(crate) fn pump_until(
    a: &mut Endpoint,
    b: &mut Endpoint,
    got_a: &mut Vec<(u32, Vec<u8>)>,
    got_b: &mut Vec<(u32, Vec<u8>)>,
    secs: u64,
    mut done: impl FnMut(&Endpoint, &Endpoint, &[(u32, Vec<u8>)], &[(u32, Vec<u8>)]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done(a, b, got_a, got_b) {
        a.poll(&mut |p, f| got_a.push((p, f.to_vec())))
            .expect("poll a");
        b.poll(&mut |p, f| got_b.push((p, f.to_vec())))
            .expect("poll b");
        assert!(Instant::now() < deadline, "timed out after {secs} s");
    }
}

/// Connects a to b (b accepts inside its poll) and waits until both can send.
pub(crate) fn connect(a: &mut Endpoint, b: &mut Endpoint) -> (ConnId, ConnId) {
    let card_b = b.card();
    let ab = a.connect(b.id(), &card_b).expect("connect");
    let (mut ga, mut gb) = (Vec::new(), Vec::new());
    pump_until(a, b, &mut ga, &mut gb, 30, |a, b, _, _| {
        a.is_ready(ab) && b.conn_of(a.id()).is_some_and(|c| b.is_ready(c))
    });
    assert!(
        ga.is_empty() && gb.is_empty(),
        "no data frames during the handshake"
    );
    (ab, b.conn_of(a.id()).unwrap())
}

/// A 32-byte header carrying `seq`, and a payload of `len` bytes derived from `seq`.
pub(crate) fn frame(seq: u32, len: usize) -> ([u8; 32], Vec<u8>) {
    let mut h = [0u8; 32];
    h[..4].copy_from_slice(&seq.to_le_bytes());
    h[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    let p = (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seq) as u8)
        .collect();
    (h, p)
}

/// Checks a received frame against `frame(seq, len)`; returns seq.
pub(crate) fn check(f: &[u8]) -> u32 {
    let seq = u32::from_le_bytes(f[..4].try_into().unwrap());
    let len = u32::from_le_bytes(f[4..8].try_into().unwrap()) as usize;
    assert_eq!(f.len(), 32 + len, "frame {seq}: length");
    let (h, p) = frame(seq, len);
    assert_eq!(&f[..32], &h, "frame {seq}: header");
    assert!(f[32..] == p[..], "frame {seq}: payload differs");
    seq
}

/// Sends one frame, polling both endpoints while there is no room.
pub(crate) fn send(
    a: &mut Endpoint,
    b: &mut Endpoint,
    c: ConnId,
    h: &[u8],
    p: &[u8],
    got_a: &mut Vec<(u32, Vec<u8>)>,
    got_b: &mut Vec<(u32, Vec<u8>)>,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !a.try_send(c, h, p).expect("try_send") {
        a.poll(&mut |p, f| got_a.push((p, f.to_vec())))
            .expect("poll a");
        b.poll(&mut |p, f| got_b.push((p, f.to_vec())))
            .expect("poll b");
        assert!(Instant::now() < deadline, "send stuck for 30 s");
    }
}

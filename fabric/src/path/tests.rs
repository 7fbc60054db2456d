//! The adapter-level conformance suite: every transport's adapter (its [`Link`] for sending,
//! its [`Adapter`] for receiving) against the same tests, beneath the engine: frames arrive
//! whole, in order and named by their sender; short headers name the transport's sender;
//! a full connection refuses (never loses) frames and takes them again once its receiver
//! polls; the capabilities agree with what the connection does; a large message goes by
//! the path's rendezvous (the sender's link exposes it, the receiver fetches it the way
//! the offer says, and the receiving adapter reports the fetch done). The point-to-point
//! semantics above the adapters are `fabric/tests/conformance.rs`'s `suite!`, through the fabric.
//!
//! Shared memory and TCP (on 127.0.0.1) always run; verbs needs an RDMA device and is
//! skipped with a printed reason elsewhere (it runs in the soft-RoCE VM). Loopback carries
//! no frames (a message to oneself is handed to one's own matching whole), so only its
//! capabilities are checked.

use std::time::{Duration, Instant};

use super::loopback::Loopback;
use super::shm::ShmAdapter;
use super::tcp::TcpLink;
use super::verbs::VerbsLink;
use super::{Adapter, Caps, Deliver, Link, OfferVia, RndvKind};
use crate::engine::ReadToken;
use crate::engine::{short_header, Envelope, Frame, HDR, SHORT_HDR};

/// How long a test waits for a handshake or a frame.
const WAIT: Duration = Duration::from_secs(20);

/// What a poll delivered.
#[derive(Debug, Default)]
struct Got {
    frames: Vec<(u32, Vec<u8>)>,
    /// Bulk transfers in: (peer, token, length).
    received: Vec<(u32, u64, usize)>,
    /// Bulk transfers written: (peer, token).
    sent: Vec<(u32, u64)>,
    reads: Vec<(ReadToken, Result<(), String>)>,
    failed: Vec<(u32, String)>,
}

impl Got {
    /// Whether the poll reported no bulk transfer and no RDMA read.
    fn no_transfers(&self) -> bool {
        self.received.is_empty() && self.sent.is_empty() && self.reads.is_empty()
    }
}

impl Deliver for Got {
    fn frame(&mut self, from: u32, frame: &[u8]) {
        self.frames.push((from, frame.to_vec()));
    }

    fn bulk_received(&mut self, peer: u32, token: u64, len: usize) {
        self.received.push((peer, token, len));
    }

    fn bulk_sent(&mut self, peer: u32, token: u64) {
        self.sent.push((peer, token));
    }

    fn read_done(&mut self, token: ReadToken, res: Result<(), String>) {
        self.reads.push((token, res));
    }

    fn failed(&mut self, peer: u32, reason: &str) {
        self.failed.push((peer, reason.to_string()));
    }
}

/// Two ranks joined by one transport: rank 0 sends to rank 1.
trait Pair {
    /// Rank 0's connection's capabilities.
    fn caps(&mut self) -> Caps;
    /// [`Link::try_send`] on rank 0's connection.
    fn try_send(&mut self, header: &[u8], payload: &[u8]) -> Result<bool, String>;
    /// Polls both ends; what rank 1 receives goes to `got`.
    fn poll(&mut self, got: &mut Got) -> usize;
    /// A rendezvous of `data` into `into`: rank 0's link exposes `data`, rank 1 fetches
    /// it as the offer says, polling until its adapter reports the fetch done. Returns
    /// what the offer carried.
    fn rendezvous(&mut self, data: &[u8], into: &mut [u8]) -> OfferVia;
}

/// Polls `p` until `done(got)`, at most [`WAIT`].
fn poll_until<P: Pair>(p: &mut P, got: &mut Got, what: &str, done: impl Fn(&Got) -> bool) {
    let t = Instant::now();
    while !done(got) {
        p.poll(got);
        assert!(t.elapsed() < WAIT, "{what} not done in {WAIT:?}: {got:?}");
        assert!(got.failed.is_empty(), "{:?}", got.failed);
    }
}

/// Shared memory: rank 1's inbox, rank 0's outbox into it.
struct ShmPair {
    name: String,
    out: weft_shm::Outbox,
    rx: ShmAdapter,
}

impl ShmPair {
    fn new(test: &str) -> Option<ShmPair> {
        let name = format!("/weft-test-{}-adapter-{test}", std::process::id());
        let _ = weft_shm::unlink(&name);
        let inbox =
            weft_shm::Inbox::create(&name, &weft_shm::InboxConfig::default()).expect("an inbox");
        // Sender id 1 is rank 0 (and sender id 0 rank 7): the adapter names a frame's
        // sender by its rank, not its inbox sender id.
        let out = weft_shm::Outbox::connect(&name, 1).expect("an outbox");
        let rx = ShmAdapter::new(inbox, vec![7, 0]);
        Some(ShmPair { name, out, rx })
    }
}

impl Drop for ShmPair {
    fn drop(&mut self) {
        let _ = weft_shm::unlink(&self.name);
    }
}

impl Pair for ShmPair {
    fn caps(&mut self) -> Caps {
        let link = &mut self.out;
        link.caps()
    }

    fn try_send(&mut self, header: &[u8], payload: &[u8]) -> Result<bool, String> {
        let mut link = &mut self.out;
        assert!(link.is_ready());
        Link::try_send(&mut link, header, payload).map_err(|e| e.to_string())
    }

    fn poll(&mut self, got: &mut Got) -> usize {
        self.rx.poll(got)
    }

    fn rendezvous(&mut self, data: &[u8], into: &mut [u8]) -> OfferVia {
        let mut link = &mut self.out;
        let pid = std::process::id() as i32;
        let (via, region) = link
            .expose(data.as_ptr(), data.len(), pid)
            .expect("exposed");
        assert!(region.is_none(), "shared memory registers nothing");
        let OfferVia::Cma { addr, pid: p } = via else {
            panic!("shared memory offered {via:?}")
        };
        assert_eq!((addr, p), (data.as_ptr() as u64, pid));
        // The receiver's single copy (here within one process, which CMA allows).
        weft_shm::cma_read(p, addr as usize, into).expect("a CMA read");
        via
    }
}

/// TCP on 127.0.0.1: rank 0 connected to rank 1.
struct TcpPair {
    eps: [weft_tcp::Endpoint; 2],
    conn: weft_tcp::ConnId,
}

fn tcp_endpoint(me: u32) -> weft_tcp::Endpoint {
    let addr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let mut cfg = weft_tcp::Config::from_env(me, 7, [11, 13], addr).expect("TCP config");
    cfg.addr = addr;
    weft_tcp::Endpoint::open(cfg).expect("a TCP endpoint on 127.0.0.1")
}

impl TcpPair {
    fn new(_: &str) -> Option<TcpPair> {
        let mut eps = [tcp_endpoint(0), tcp_endpoint(1)];
        let card = eps[1].card();
        let conn = eps[0].connect(1, &card).expect("connect to rank 1");
        let mut p = TcpPair { eps, conn };
        let t = Instant::now();
        let mut got = Got::default();
        while !(TcpLink {
            ep: &mut p.eps[0],
            conn,
        })
        .is_ready()
        {
            p.poll(&mut got);
            assert!(t.elapsed() < WAIT, "no TCP handshake in {WAIT:?}");
        }
        assert!(got.frames.is_empty() && got.failed.is_empty(), "{got:?}");
        Some(p)
    }
}

impl Pair for TcpPair {
    fn caps(&mut self) -> Caps {
        TcpLink {
            ep: &mut self.eps[0],
            conn: self.conn,
        }
        .caps()
    }

    fn try_send(&mut self, header: &[u8], payload: &[u8]) -> Result<bool, String> {
        let mut link = TcpLink {
            ep: &mut self.eps[0],
            conn: self.conn,
        };
        link.try_send(header, payload).map_err(|e| e.to_string())
    }

    fn poll(&mut self, got: &mut Got) -> usize {
        // Rank 0 receives nothing: its poll writes what it queued (and reports bulk
        // transfers written, kept in `got` too).
        let mut zero = Got::default();
        Adapter::poll(&mut self.eps[0], &mut zero);
        assert!(zero.frames.is_empty() && zero.failed.is_empty(), "{zero:?}");
        got.sent.extend(zero.sent);
        Adapter::poll(&mut self.eps[1], got)
    }

    fn rendezvous(&mut self, data: &[u8], into: &mut [u8]) -> OfferVia {
        let mut link = TcpLink {
            ep: &mut self.eps[0],
            conn: self.conn,
        };
        let (via, region) = link.expose(data.as_ptr(), data.len(), 0).expect("exposed");
        assert!(region.is_none(), "TCP registers nothing");
        assert!(matches!(via, OfferVia::Bulk), "TCP offered {via:?}");
        // The receiver names where the transfer lands (then answers CTS); the sender's
        // endpoint writes it straight from `data`.
        const TOKEN: u64 = (7 << 32) | 9;
        let back = self.eps[1]
            .conn_of(0)
            .expect("rank 1's connection to rank 0");
        // SAFETY: `into` outlives the transfer: this function polls until the endpoint
        // reports it received.
        unsafe { self.eps[1].expect_bulk(back, TOKEN, into.as_mut_ptr(), into.len()) };
        // SAFETY: `data` outlives the transfer: polled until reported written.
        unsafe { self.eps[0].send_bulk(self.conn, TOKEN, data.as_ptr(), data.len()) }
            .expect("a bulk send");
        let mut got = Got::default();
        poll_until(self, &mut got, "the bulk transfer", |g| {
            !g.received.is_empty() && !g.sent.is_empty()
        });
        assert_eq!(got.received, [(0, TOKEN, data.len())]);
        assert_eq!(got.sent, [(1, TOKEN)]);
        via
    }
}

/// Verbs: rank 0's RC connection to rank 1 (needs an RDMA device).
struct VerbsPair {
    eps: [weft_verbs::Endpoint; 2],
    conn: weft_verbs::ConnId,
}

fn verbs_endpoint(me: u32) -> Option<weft_verbs::Endpoint> {
    match weft_verbs::Endpoint::open(weft_verbs::Config::new(me)) {
        Ok(ep) => Some(ep),
        Err(e) if std::env::var_os("WEFT_VERBS_REQUIRE_DEVICE").is_some() => {
            panic!("WEFT_VERBS_REQUIRE_DEVICE is set but the verbs endpoint cannot open: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no RDMA device ({e}); the verbs adapter suite runs in the soft-RoCE VM (ci/verbs-vm.sh)");
            None
        }
    }
}

impl VerbsPair {
    fn new(_: &str) -> Option<VerbsPair> {
        let mut eps = [verbs_endpoint(0)?, verbs_endpoint(1)?];
        let card = eps[1].card();
        let conn = eps[0].connect(1, &card).expect("connect to rank 1");
        let mut p = VerbsPair { eps, conn };
        let t = Instant::now();
        let mut got = Got::default();
        while !p.eps[0].is_ready(conn) || p.eps[1].conn_of(0).is_none_or(|c| !p.eps[1].is_ready(c))
        {
            p.poll(&mut got);
            assert!(t.elapsed() < WAIT, "no verbs handshake in {WAIT:?}");
        }
        assert!(got.frames.is_empty() && got.failed.is_empty(), "{got:?}");
        Some(p)
    }
}

impl Pair for VerbsPair {
    fn caps(&mut self) -> Caps {
        VerbsLink {
            ep: &mut self.eps[0],
            conn: self.conn,
        }
        .caps()
    }

    fn try_send(&mut self, header: &[u8], payload: &[u8]) -> Result<bool, String> {
        let mut link = VerbsLink {
            ep: &mut self.eps[0],
            conn: self.conn,
        };
        link.try_send(header, payload).map_err(|e| e.to_string())
    }

    fn poll(&mut self, got: &mut Got) -> usize {
        let mut none = Got::default();
        Adapter::poll(&mut self.eps[0], &mut none);
        assert!(
            none.frames.is_empty() && none.failed.is_empty() && none.no_transfers(),
            "{none:?}"
        );
        Adapter::poll(&mut self.eps[1], got)
    }

    fn rendezvous(&mut self, data: &[u8], into: &mut [u8]) -> OfferVia {
        let mut link = VerbsLink {
            ep: &mut self.eps[0],
            conn: self.conn,
        };
        let (via, region) = link.expose(data.as_ptr(), data.len(), 0).expect("exposed");
        let OfferVia::RdmaRead { addr, rkey } = via else {
            panic!("verbs offered {via:?}")
        };
        let region = region.expect("a registered region");
        let back = self.eps[1]
            .conn_of(0)
            .expect("rank 1's connection to rank 0");
        let t = Instant::now();
        let token = loop {
            // SAFETY: `into` outlives the read: this function polls until the adapter
            // reports it done.
            match unsafe { self.eps[1].rdma_read(back, into.as_mut_ptr(), into.len(), addr, rkey) }
            {
                Ok(Some(token)) => break token,
                Ok(None) => {
                    self.poll(&mut Got::default());
                    assert!(t.elapsed() < WAIT, "no room for an RDMA read in {WAIT:?}");
                }
                Err(e) => panic!("an RDMA read: {e}"),
            }
        };
        let mut got = Got::default();
        poll_until(self, &mut got, "the RDMA read", |g| !g.reads.is_empty());
        assert_eq!(got.reads, [(token, Ok(()))]);
        self.eps[0].release(region);
        via
    }
}

/// Payload byte `i` of message `seq`.
fn byte(seq: u32, i: usize) -> u8 {
    (seq as usize * 31 + i * 7) as u8
}

fn payload(seq: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte(seq, i)).collect()
}

/// Sends eager frame `seq` (tag `seq`, `len` bytes), polling while the connection is full.
fn send_eager<P: Pair>(p: &mut P, got: &mut Got, seq: u32, len: usize) {
    let data = payload(seq, len);
    let env = Envelope {
        src: 0,
        ctx: 5,
        tag: seq,
    };
    let f = Frame::Eager { env, data: &data };
    let t = Instant::now();
    while !p.try_send(&f.head(), f.payload()).expect("a send") {
        p.poll(got);
        assert!(t.elapsed() < WAIT, "frame {seq} not taken in {WAIT:?}");
    }
}

/// Polls until `n` frames arrived.
fn wait_for<P: Pair>(p: &mut P, got: &mut Got, n: usize) {
    let t = Instant::now();
    while got.frames.len() < n {
        p.poll(got);
        assert!(
            t.elapsed() < WAIT,
            "{} of {n} frames arrived in {WAIT:?}",
            got.frames.len()
        );
    }
    assert_eq!(got.frames.len(), n, "more frames than were sent");
    assert!(got.failed.is_empty(), "{:?}", got.failed);
}

/// Checks that frames `0..n` arrived in order, whole, from rank 0, with the lengths
/// `len(seq)`.
fn check_eager(got: &Got, n: u32, len: impl Fn(u32) -> usize) {
    for (seq, (from, bytes)) in (0..n).zip(&got.frames) {
        assert_eq!(*from, 0, "frame {seq} named rank {from}");
        match Frame::decode(*from, bytes) {
            Ok(Frame::Eager { env, data }) => {
                assert_eq!((env.src, env.ctx, env.tag), (0, 5, seq), "frame {seq}");
                assert_eq!(data.len(), len(seq), "frame {seq}'s length");
                assert!(
                    data.iter().enumerate().all(|(i, &b)| b == byte(seq, i)),
                    "frame {seq}'s bytes changed"
                );
            }
            other => panic!("frame {seq} decoded as {other:?}"),
        }
    }
}

/// Frames of every size up to the largest the connection carries arrive whole, in
/// order, from their sender.
fn frames_arrive_whole_and_in_order<P: Pair>(p: &mut P) {
    let caps = p.caps();
    let max = (caps.max_frame - HDR).min(1 << 20);
    let len = |seq: u32| match seq {
        0 => 0,
        1 => max,
        s => (s as usize * 97) % max.min(9000),
    };
    let n = 300;
    let mut got = Got::default();
    for seq in 0..n {
        send_eager(p, &mut got, seq, len(seq));
    }
    wait_for(p, &mut got, n as usize);
    check_eager(&got, n, len);
}

/// A short header (what the fast path sends) decodes with the transport's sender.
fn short_headers_name_the_transports_sender<P: Pair>(p: &mut P) {
    let caps = p.caps();
    assert!(
        caps.inline_max >= 8,
        "no room for an 8-byte message inline: {caps:?}"
    );
    let mut got = Got::default();
    for seq in 0..50u32 {
        let data = payload(seq, seq as usize % (caps.inline_max.min(64) + 1));
        let hdr = short_header(9, seq);
        let t = Instant::now();
        while !p.try_send(&hdr, &data).expect("a send") {
            p.poll(&mut got);
            assert!(t.elapsed() < WAIT);
        }
    }
    wait_for(p, &mut got, 50);
    for (seq, (from, bytes)) in (0..50u32).zip(&got.frames) {
        assert_eq!(
            bytes.len(),
            SHORT_HDR + seq as usize % (caps.inline_max.min(64) + 1)
        );
        match Frame::decode(*from, bytes) {
            Ok(Frame::Eager { env, data }) => {
                assert_eq!((env.src, env.ctx, env.tag), (0, 9, seq));
                assert!(data.iter().enumerate().all(|(i, &b)| b == byte(seq, i)));
            }
            other => panic!("short frame {seq} decoded as {other:?}"),
        }
    }
}

/// A connection whose receiver does not poll fills up and refuses frames (`Ok(false)`),
/// never queueing without bound nor losing one; once the receiver polls, it takes them
/// again, and every frame arrives, in order.
fn a_full_connection_refuses_and_loses_nothing<P: Pair>(p: &mut P) {
    const LEN: usize = 1000;
    const BOUND: u32 = 200_000;
    let mut sent = 0u32;
    loop {
        let data = payload(sent, LEN);
        let env = Envelope {
            src: 0,
            ctx: 5,
            tag: sent,
        };
        let f = Frame::Eager { env, data: &data };
        if !p.try_send(&f.head(), f.payload()).expect("a send") {
            break;
        }
        sent += 1;
        assert!(sent < BOUND, "{BOUND} frames taken without a refusal");
    }
    let mut got = Got::default();
    for seq in sent..sent + 100 {
        send_eager(p, &mut got, seq, LEN);
    }
    wait_for(p, &mut got, sent as usize + 100);
    check_eager(&got, sent + 100, |_| LEN);
}

/// What a connection says it can do agrees with its type and leaves room for a header.
fn capabilities_are_consistent<P: Pair, L: Link>(p: &mut P) {
    let caps = p.caps();
    assert_eq!(caps.rndv, L::RNDV);
    assert!(caps.max_frame > HDR, "{caps:?}");
    assert!(caps.inline_max + SHORT_HDR <= caps.max_frame, "{caps:?}");
    if let Some(s) = caps.short_max {
        assert!(s >= caps.inline_max, "{caps:?}");
    }
    assert_eq!(caps.reads_remote, caps.rndv != RndvKind::Bulk, "{caps:?}");
}

/// A large message goes by the path's rendezvous: what the sender's link exposes is what
/// the receiver fetches, whole, and the receiving side reports the fetch once. Its
/// offer is of the path's rendezvous kind.
fn a_large_message_goes_by_rendezvous<P: Pair, L: Link>(p: &mut P) {
    for len in [1, 4096, 1 << 20, (4 << 20) + 13] {
        let data = payload(len as u32, len);
        let mut into = vec![0u8; len];
        let via = p.rendezvous(&data, &mut into);
        let kind = match via {
            OfferVia::Cma { .. } => RndvKind::Cma,
            OfferVia::RdmaRead { .. } => RndvKind::RdmaRead,
            OfferVia::Bulk => RndvKind::Bulk,
        };
        assert_eq!(kind, L::RNDV, "{len} bytes offered as {via:?}");
        assert!(into == data, "{len} bytes fetched by rendezvous differ");
    }
}

macro_rules! adapter_suite {
    ($name:ident, $pair:ident, $link:ty) => {
        mod $name {
            use super::*;

            #[test]
            fn frames_arrive_whole_and_in_order() {
                if let Some(mut p) = $pair::new(concat!(stringify!($name), "-order")) {
                    super::frames_arrive_whole_and_in_order(&mut p);
                }
            }

            #[test]
            fn short_headers_name_the_transports_sender() {
                if let Some(mut p) = $pair::new(concat!(stringify!($name), "-short")) {
                    super::short_headers_name_the_transports_sender(&mut p);
                }
            }

            #[test]
            fn a_full_connection_refuses_and_loses_nothing() {
                if let Some(mut p) = $pair::new(concat!(stringify!($name), "-full")) {
                    super::a_full_connection_refuses_and_loses_nothing(&mut p);
                }
            }

            #[test]
            fn a_large_message_goes_by_rendezvous() {
                if let Some(mut p) = $pair::new(concat!(stringify!($name), "-rndv")) {
                    super::a_large_message_goes_by_rendezvous::<_, $link>(&mut p);
                }
            }

            #[test]
            fn capabilities_are_consistent() {
                if let Some(mut p) = $pair::new(concat!(stringify!($name), "-caps")) {
                    super::capabilities_are_consistent::<_, $link>(&mut p);
                }
            }
        }
    };
}

adapter_suite!(shm, ShmPair, &mut weft_shm::Outbox);
adapter_suite!(tcp, TcpPair, TcpLink<'static>);
adapter_suite!(verbs, VerbsPair, VerbsLink<'static>);

/// Loopback carries no frames: its link refuses every one (and exposes nothing), and its
/// capabilities say that a message goes whole (no rendezvous, no frame limit).
#[test]
fn loopback_takes_no_frames() {
    let mut l = Loopback;
    assert_eq!(l.try_send(&[1; HDR], &[2; 8]), Ok(false));
    let caps = l.caps();
    assert_eq!(caps.rndv, RndvKind::None);
    assert_eq!(caps.max_frame, usize::MAX);
    assert!(l.is_ready());
    let e = l
        .expose([0u8; 8].as_ptr(), 8, 1)
        .expect_err("nothing to expose");
    assert!(e.contains("delivered whole"), "{e}");
}

//! The conformance suite of point-to-point semantics, run over every path: shared memory
//! between two endpoints (eager, rendezvous by CMA, rendezvous pipelined through the
//! rings), verbs (eager over the shared receive queue, rendezvous by RDMA read; skipped
//! with a printed reason where there is no RDMA device), TCP on 127.0.0.1 (eager frames,
//! rendezvous by bulk transfer) and loopback. Multi-process runs through `weft run` are in the root package.
#![allow(missing_docs)]

use std::sync::{Arc, Barrier, Mutex};

use weft_fabric::{wait_all, wait_any, Communicator, Fabric, P2pError, RequestScope, Source, Tag};
use weft_shm::{Inbox, InboxConfig};

/// How the two endpoints of [`pair`] reach each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// Shared memory with pair lines (small messages share one cache line per pair),
    /// rendezvous by CMA.
    Cma,
    /// Shared memory, rings only (no pair lines), rendezvous pipelined through them.
    Pipelined,
    /// Verbs (RC connections, rendezvous by RDMA read): needs an RDMA device.
    Verbs,
    /// TCP on 127.0.0.1 (one connection, rendezvous by a bulk transfer from the sender's
    /// buffer into the receiver's).
    Tcp,
}

/// Opens a TCP endpoint for rank `me` on 127.0.0.1.
fn tcp_endpoint(me: u32) -> weft_tcp::Endpoint {
    let addr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let mut cfg = weft_tcp::Config::from_env(me, 7, [11, 13], addr).expect("TCP config");
    cfg.addr = addr;
    weft_tcp::Endpoint::open(cfg).expect("a TCP endpoint on 127.0.0.1")
}

/// Opens a verbs endpoint for rank `me`, or says why the verbs suite is skipped.
fn verbs_endpoint(me: u32) -> Option<weft_verbs::Endpoint> {
    match weft_verbs::Endpoint::open(weft_verbs::Config::new(me)) {
        Ok(ep) => Some(ep),
        Err(e) if std::env::var_os("WEFT_VERBS_REQUIRE_DEVICE").is_some() => {
            panic!("WEFT_VERBS_REQUIRE_DEVICE is set but the verbs endpoint cannot open: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no RDMA device ({e}); the verbs suite runs in the soft-RoCE VM (ci/verbs-vm.sh)");
            None
        }
    }
}

/// Runs `case(comm, peer)` on two endpoints in two threads of this process.
fn pair(name: &str, eager: usize, via: Via, case: fn(&Communicator, u32)) {
    if via == Via::Verbs && verbs_endpoint(9).is_none() {
        return;
    }
    let names: Vec<String> = (0..2)
        .map(|r| format!("/weft-conf-{}-{name}-{r}", std::process::id()))
        .collect();
    let cards = Arc::new(Mutex::new(vec![None, None]));
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2u32)
        .map(|me| {
            let names = names.clone();
            let barrier = barrier.clone();
            let cards = cards.clone();
            std::thread::spawn(move || {
                let f = if via == Via::Tcp {
                    let ep = tcp_endpoint(me);
                    cards.lock().unwrap()[me as usize] = Some(ep.card());
                    barrier.wait();
                    let cards = cards.lock().unwrap().clone();
                    Fabric::from_tcp(me, 2, ep, cards, eager)
                } else if via == Via::Verbs {
                    let ep = verbs_endpoint(me).expect("a verbs endpoint");
                    cards.lock().unwrap()[me as usize] = Some(ep.card());
                    barrier.wait();
                    let cards = cards.lock().unwrap().clone();
                    Fabric::from_verbs(me, 2, ep, cards, eager)
                } else {
                    let name = &names[me as usize];
                    let inbox = if via == Via::Cma {
                        let cfg = InboxConfig {
                            pair_lines: 256,
                            ..InboxConfig::default()
                        };
                        Inbox::create_for(name, &cfg, me).expect("inbox")
                    } else {
                        Inbox::create(name, &InboxConfig::default()).expect("inbox")
                    };
                    barrier.wait();
                    let peers = names.iter().cloned().map(Some).collect();
                    let cma = via == Via::Cma;
                    Fabric::from_parts(me, 2, Some(inbox), vec![0, 1], peers, eager, cma)
                };
                let world = f.world();
                case(&world, 1 - me);
                drop(world);
                // A send may have returned with its frame buffered (a verbs connection
                // still handshaking): finalize delivers it, as a program's would.
                f.finalize().expect("finalize");
                // Both sides finish before the endpoints go away.
                barrier.wait();
            })
        })
        .collect();
    for h in handles {
        h.join().expect("endpoint thread panicked");
    }
}

/// Runs `case(comm, me)` on one endpoint talking to itself.
fn alone(case: fn(&Communicator, u32), eager: usize) {
    let f = Fabric::from_parts(0, 1, None, vec![0], vec![None], eager, true);
    case(&f.world(), 0);
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const SIZES: &[usize] = &[
    0,
    1,
    8,
    31,
    100,
    4095,
    8192,
    8193,
    16384,
    65536,
    1 << 20,
    4 << 20,
];

fn ping_pong(c: &Communicator, peer: u32) {
    for &n in SIZES {
        let mut buf = vec![0u8; n];
        if c.rank() == 0 {
            let out = pattern(n, 1);
            c.send(&out, peer, Tag(5)).unwrap();
            let st = c.recv(&mut buf, Source::Rank(peer), Tag(6)).unwrap();
            assert_eq!((st.source, st.tag, st.count), (peer, 6, n));
            assert!(buf == pattern(n, 2), "size {n}: reply corrupted");
        } else {
            let st = c.recv(&mut buf, Source::Rank(peer), Tag(5)).unwrap();
            assert_eq!(st.count, n);
            assert!(buf == pattern(n, 1), "size {n}: data corrupted");
            c.send(&pattern(n, 2), peer, Tag(6)).unwrap();
        }
    }
}

fn ordering(c: &Communicator, peer: u32) {
    // Messages from one sender on one communicator never overtake each other, whatever
    // their protocol.
    let sizes = [8usize, 20000, 1, 100000, 0, 9000];
    if c.rank() == 0 {
        for i in 0..300u32 {
            let mut m = vec![0u8; sizes[i as usize % sizes.len()].max(4)];
            m[..4].copy_from_slice(&i.to_le_bytes());
            c.send(&m, peer, Tag(1)).unwrap();
        }
    } else {
        let mut buf = vec![0u8; 100000];
        for i in 0..300u32 {
            let st = c.recv(&mut buf, Source::Any, Tag::ANY).unwrap();
            assert_eq!(
                u32::from_le_bytes(buf[..4].try_into().unwrap()),
                i,
                "message {i} overtaken"
            );
            assert_eq!(st.count, sizes[i as usize % sizes.len()].max(4));
        }
    }
}

fn small_after_large_does_not_overtake(c: &Communicator, peer: u32) {
    // A rendezvous then an eager message on the same tag: the blocking receive's direct
    // path must not take the small one first.
    if c.rank() == 0 {
        let big = pattern(100_000, 7);
        c.scope(|s| {
            let r = s.isend(&big, peer, Tag(1)).unwrap();
            c.send(&[9u64], peer, Tag(1)).unwrap();
            r.wait().unwrap();
        });
    } else {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut buf = vec![0u8; 100_000];
        let first = c.recv(&mut buf, Source::Rank(peer), Tag(1)).unwrap();
        assert_eq!(
            first.count, 100_000,
            "the small message overtook the large one"
        );
        assert!(buf == pattern(100_000, 7));
        let second = c.recv(&mut buf, Source::Rank(peer), Tag(1)).unwrap();
        assert_eq!(second.count, 8);
    }
}

fn test_then_wait(c: &Communicator, peer: u32) {
    if c.rank() == 0 {
        c.send(&[5u32], peer, Tag(3)).unwrap();
    } else {
        let mut x = [0u32];
        c.scope(|s| {
            let mut r = s.irecv(&mut x, Source::Rank(peer), Tag(3)).unwrap();
            let st = loop {
                if let Some(s) = r.test() {
                    break s.unwrap();
                }
            };
            // wait() after a successful test() returns the same result, at once.
            assert_eq!(r.wait().unwrap(), st);
        });
        assert_eq!(x[0], 5);
    }
}

fn tags_out_of_order(c: &Communicator, peer: u32) {
    if c.rank() == 0 {
        // Non-blocking: a blocking large send would (as in MPI) wait for its receive.
        let one = [1u64];
        let two = pattern(50000, 3);
        let three = [3u64];
        c.scope(|s| {
            let reqs = vec![
                s.isend(&one, peer, Tag(1)).unwrap(),
                s.isend(&two, peer, Tag(2)).unwrap(),
                s.isend(&three, peer, Tag(3)).unwrap(),
            ];
            wait_all(reqs).unwrap();
        });
    } else {
        // Receive tag 3 first: 1 and 2 go to the unexpected queue (2 as a rendezvous).
        let mut x = [0u64];
        let st = c.recv(&mut x, Source::Rank(peer), Tag(3)).unwrap();
        assert_eq!((x[0], st.tag), (3, 3));
        let mut big = vec![0u8; 50000];
        let st = c.recv(&mut big, Source::Any, Tag(2)).unwrap();
        assert_eq!((st.tag, st.count), (2, 50000));
        assert!(big == pattern(50000, 3));
        let st = c.recv(&mut x, Source::Any, Tag::ANY).unwrap();
        assert_eq!((x[0], st.tag, st.source), (1, 1, peer));
    }
}

fn truncation(c: &Communicator, peer: u32) {
    // Eager, rendezvous into a tiny buffer, and rendezvous into a buffer large enough for
    // a split single copy (the receiver reads part of what fits, the sender writes the rest).
    for (n, cap) in [(100usize, 10usize), (200_000, 10), (300_000, 100_000)] {
        if c.rank() == 0 {
            c.send(&pattern(n, 4), peer, Tag(9)).unwrap();
        } else {
            let mut small = vec![0u8; cap];
            match c.recv(&mut small, Source::Rank(peer), Tag(9)) {
                Err(P2pError::Truncated {
                    sender,
                    tag,
                    size,
                    capacity,
                }) => {
                    assert_eq!((sender, tag, size, capacity), (peer, 9, n, cap));
                    assert!(
                        small[..] == pattern(n, 4)[..cap],
                        "the first {cap} bytes of {n} are delivered"
                    );
                }
                other => panic!("size {n}: expected truncation, got {other:?}"),
            }
        }
    }
    // The channel still works afterwards.
    ping_small(c, peer);
}

fn ping_small(c: &Communicator, peer: u32) {
    let mut x = [0u32];
    if c.rank() == 0 {
        c.send(&[42u32], peer, Tag(0)).unwrap();
        c.recv(&mut x, Source::Rank(peer), Tag(0)).unwrap();
        assert_eq!(x[0], 43);
    } else {
        c.recv(&mut x, Source::Rank(peer), Tag(0)).unwrap();
        c.send(&[x[0] + 1], peer, Tag(0)).unwrap();
    }
}

fn nonblocking(c: &Communicator, peer: u32) {
    let n = 64;
    let outs: Vec<Vec<u32>> = (0..n)
        .map(|i| vec![i as u32 + 1000 * c.rank(); 1 + (i % 7) * 3000])
        .collect();
    let mut ins: Vec<Vec<u32>> = (0..n).map(|i| vec![0u32; 1 + (i % 7) * 3000]).collect();
    c.scope(|s| nonblocking_in(s, &mut ins, &outs, peer));
    for (i, b) in ins.iter().enumerate() {
        assert!(
            b.iter().all(|&v| v == i as u32 + 1000 * peer),
            "irecv {i} got wrong data"
        );
    }
}

fn nonblocking_in<'s>(
    s: &'s RequestScope<'s, '_>,
    ins: &'s mut [Vec<u32>],
    outs: &'s [Vec<u32>],
    peer: u32,
) {
    let mut reqs = Vec::new();
    for (i, b) in ins.iter_mut().enumerate() {
        reqs.push(s.irecv(b, Source::Rank(peer), Tag(i as u32)).unwrap());
    }
    let mut sends = Vec::new();
    for (i, b) in outs.iter().enumerate().rev() {
        sends.push(s.isend(b, peer, Tag(i as u32)).unwrap());
    }
    // wait_any drains a few, test polls one, wait_all the rest.
    for _ in 0..5 {
        let (_, r) = wait_any(&mut reqs);
        r.unwrap();
    }
    let mut one = reqs.remove(0);
    let st = loop {
        if let Some(r) = one.test() {
            break r.unwrap();
        }
    };
    assert_eq!(st.source, peer);
    drop(one);
    wait_all(reqs).unwrap();
    wait_all(sends).unwrap();
}

fn probing(c: &Communicator, peer: u32) {
    if c.rank() == 0 {
        let (a, b) = (pattern(777, 5), pattern(99999, 6));
        c.scope(|s| {
            wait_all(vec![
                s.isend(&a, peer, Tag(11)).unwrap(),
                s.isend(&b, peer, Tag(12)).unwrap(),
            ])
            .unwrap();
        });
    } else {
        let st = c.probe(Source::Any, Tag(12)).unwrap();
        assert_eq!((st.source, st.tag, st.count), (peer, 12, 99999));
        let st1 = c
            .iprobe(Source::Rank(peer), Tag(11))
            .unwrap()
            .expect("tag 11 arrived before 12");
        assert_eq!(st1.count, 777);
        assert!(c.iprobe(Source::Any, Tag(13)).unwrap().is_none());
        let mut b = vec![0u8; st.count];
        c.recv(&mut b, Source::Rank(peer), Tag(12)).unwrap();
        assert!(b == pattern(99999, 6));
        let mut a = vec![0u8; st1.count];
        c.recv(&mut a, Source::Rank(peer), Tag(11)).unwrap();
        assert!(a == pattern(777, 5));
    }
}

fn bad_arguments(c: &Communicator, _peer: u32) {
    let size = c.size();
    assert_eq!(
        c.send(&[1u8], size, Tag(0)),
        Err(P2pError::InvalidRank { rank: size, size })
    );
    assert_eq!(
        c.send(&[1u8], 0, Tag::ANY),
        Err(P2pError::InvalidTag(u32::MAX))
    );
    let mut b = [0u8];
    assert_eq!(
        c.recv(&mut b, Source::Rank(size + 1), Tag(0)).unwrap_err(),
        P2pError::InvalidRank {
            rank: size + 1,
            size
        }
    );
}

fn self_sends(c: &Communicator, me: u32) {
    // Eager to self, then a rendezvous to self with the receive posted first.
    c.send(&[7u64, 8], me, Tag(1)).unwrap();
    let mut x = [0u64; 2];
    c.recv(&mut x, Source::Rank(me), Tag(1)).unwrap();
    assert_eq!(x, [7, 8]);
    let big = pattern(1 << 20, 9);
    let mut got = vec![0u8; 1 << 20];
    c.scope(|s| {
        let r = s.irecv(&mut got, Source::Any, Tag(2)).unwrap();
        c.send(&big, me, Tag(2)).unwrap();
        assert_eq!(r.wait().unwrap().count, 1 << 20);
    });
    assert!(got == big);
    // isend first, then recv.
    let mut got2 = vec![0u8; 1 << 20];
    c.scope(|s| {
        let snd = s.isend(&big, me, Tag(3)).unwrap();
        c.recv(&mut got2, Source::Rank(me), Tag(3)).unwrap();
        snd.wait().unwrap();
    });
    assert!(got2 == big);
}

fn leaked_requests_are_completed_by_the_scope(c: &Communicator, peer: u32) {
    // A forgotten receive cannot outlive its buffer: the scope cancels it (as dropping it
    // would), so the engine never writes into `leaked` after the scope, and the message it
    // would have matched goes to the next receive instead.
    if c.rank() == 0 {
        let mut go = [0u8];
        c.recv(&mut go, Source::Rank(peer), Tag(5)).unwrap();
        c.send(&pattern(50_000, 8), peer, Tag(4)).unwrap();
    } else {
        let mut leaked = vec![0u8; 50_000];
        c.scope(|s| {
            let r = s.irecv(&mut leaked, Source::Rank(peer), Tag(4)).unwrap();
            std::mem::forget(r);
        });
        c.send(&[1u8], peer, Tag(5)).unwrap();
        let mut buf = vec![0u8; 50_000];
        c.recv(&mut buf, Source::Rank(peer), Tag(4)).unwrap();
        assert!(buf == pattern(50_000, 8));
        assert!(
            leaked.iter().all(|&b| b == 0),
            "a cancelled receive wrote its buffer"
        );
    }
}

macro_rules! suite {
    ($modname:ident, $eager:expr, $via:expr) => {
        mod $modname {
            use super::*;
            #[test]
            fn ping_pong_all_sizes() {
                pair(
                    concat!(stringify!($modname), "-pp"),
                    $eager,
                    $via,
                    ping_pong,
                );
            }
            #[test]
            fn no_overtaking() {
                pair(
                    concat!(stringify!($modname), "-ord"),
                    $eager,
                    $via,
                    ordering,
                );
            }
            #[test]
            fn tag_matching_and_unexpected_queue() {
                pair(
                    concat!(stringify!($modname), "-tag"),
                    $eager,
                    $via,
                    tags_out_of_order,
                );
            }
            #[test]
            fn truncation_is_an_error_with_the_real_size() {
                pair(
                    concat!(stringify!($modname), "-trunc"),
                    $eager,
                    $via,
                    truncation,
                );
            }
            #[test]
            fn isend_irecv_test_waitany_waitall() {
                pair(
                    concat!(stringify!($modname), "-nb"),
                    $eager,
                    $via,
                    nonblocking,
                );
            }
            #[test]
            fn probe_and_iprobe() {
                pair(
                    concat!(stringify!($modname), "-probe"),
                    $eager,
                    $via,
                    probing,
                );
            }
            #[test]
            fn bad_arguments_are_errors() {
                pair(
                    concat!(stringify!($modname), "-bad"),
                    $eager,
                    $via,
                    bad_arguments,
                );
            }
            #[test]
            fn a_small_message_never_overtakes_a_large_one() {
                pair(
                    concat!(stringify!($modname), "-over"),
                    $eager,
                    $via,
                    small_after_large_does_not_overtake,
                );
            }
            #[test]
            fn wait_after_test_returns_the_result() {
                pair(
                    concat!(stringify!($modname), "-tw"),
                    $eager,
                    $via,
                    test_then_wait,
                );
            }
            #[test]
            fn leaked_requests_are_completed_by_their_scope() {
                pair(
                    concat!(stringify!($modname), "-leak"),
                    $eager,
                    $via,
                    leaked_requests_are_completed_by_the_scope,
                );
            }
        }
    };
}

suite!(shm_cma, 8192, Via::Cma);
suite!(shm_pipelined, 8192, Via::Pipelined);
suite!(shm_all_rendezvous, 0, Via::Cma);
suite!(verbs_eager_and_rdma, 8192, Via::Verbs);
suite!(verbs_all_rdma, 0, Via::Verbs);
suite!(tcp_eager_and_bulk, 8192, Via::Tcp);
suite!(tcp_all_bulk, 0, Via::Tcp);

mod loopback {
    use super::*;
    #[test]
    fn sends_to_self() {
        alone(self_sends, 8192);
        alone(self_sends, 0);
    }
    #[test]
    fn bad_arguments_are_errors() {
        alone(bad_arguments, 8192);
    }
}

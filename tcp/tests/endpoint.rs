//! Two or more endpoints in one process on 127.0.0.1, polled in turns.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use weft_tcp::{Config, Endpoint, Error};

#[test]
fn frames_both_ways_in_order_with_backpressure() {
    let mut c0 = cfg(0);
    c0.queue_bytes = 256 << 10;
    let mut c1 = cfg(1);
    c1.queue_bytes = 256 << 10;
    let max = c0.max_frame;
    let mut a = Node::with(c0);
    let mut b = Node::with(c1);
    // Frames queued before the connection exists at all are sent after the handshake.
    let ab = a.ep.connect(1, &b.ep.card()).unwrap();
    assert!(!a.ep.is_ready(ab));
    assert!(a.ep.try_send(ab, b"early", b"").unwrap());
    link(&mut a, &mut b);
    let ba = b.ep.conn_of(0).unwrap();
    assert_eq!(b.ep.peer_of(ba), Some(0));
    assert_eq!(a.ep.conn_of(1), Some(ab));

    const N: usize = 600;
    let size = |i: usize| match i % 5 {
        0 => 0,
        1 => 1,
        2 => max,
        3 => 8,
        _ => (i * 7919) % max,
    };
    let frame = |from: u32, i: usize| {
        let mut f = (i as u32).to_le_bytes().to_vec();
        f.extend(pattern(
            from as u64 * 1_000_003 + i as u64,
            size(i).saturating_sub(4),
        ));
        f.truncate(size(i).max(4).min(max));
        f
    };
    let (mut ia, mut ib) = (0, 0);
    let (mut refused_a, mut refused_b) = (0, 0);
    // Fill without the receivers polling until try_send says no (the socket buffers fill,
    // then the queue), then pump until everything arrived.
    let t = Instant::now();
    while refused_a == 0 || refused_b == 0 {
        let f = frame(0, ia);
        let (h, p) = f.split_at(f.len().min(4));
        if a.ep.try_send(ab, h, p).unwrap() {
            ia += 1;
        } else {
            refused_a += 1;
        }
        let f = frame(1, ib);
        let (h, p) = f.split_at(f.len().min(3));
        if b.ep.try_send(ba, h, p).unwrap() {
            ib += 1;
        } else {
            refused_b += 1;
        }
        assert!(ia < N && ib < N, "try_send never said no");
        assert!(t.elapsed() < Duration::from_secs(10));
    }
    assert!(a.ep.queued(ab) >= 256 << 10);
    assert!(!a.ep.idle());
    while ia < N || ib < N {
        if ia < N {
            let f = frame(0, ia);
            if a.ep.try_send(ab, &f, &[]).unwrap() {
                ia += 1;
            }
        }
        if ib < N {
            let f = frame(1, ib);
            if b.ep.try_send(ba, &[], &f).unwrap() {
                ib += 1;
            }
        }
        a.poll();
        b.poll();
        assert!(t.elapsed() < Duration::from_secs(20));
    }
    pump(&mut [&mut a, &mut b], |n| {
        n[0].sink.evs.len() >= N && n[1].sink.evs.len() > N
    });
    let got_b = b.sink.frames();
    let got_a = a.sink.frames();
    assert_eq!(got_b.len(), N + 1);
    assert_eq!(got_b[0], (0, b"early".to_vec()));
    for i in 0..N {
        assert_eq!(got_b[i + 1], (0, frame(0, i)), "frame {i} from 0");
        assert_eq!(got_a[i], (1, frame(1, i)), "frame {i} from 1");
    }
    assert_eq!(got_a.len(), N);
    assert!(a.ep.idle() && b.ep.idle());
    assert_eq!(a.ep.queued(ab), 0);
    // A frame longer than max_frame is an error.
    assert!(matches!(
        a.ep.try_send(ab, &vec![0; max], b"x"),
        Err(Error::FrameTooLarge { .. })
    ));
}

/// Sends bulks of the given sizes a -> b with a frame before and after each; checks data,
/// order, `bulk_sent` and `bulk_received`.
fn bulk_round(a: &mut Node, b: &mut Node, sizes: &[usize], token0: u64) {
    let ra = card_rank(&a.ep.card());
    let rb = card_rank(&b.ep.card());
    let ab = a.ep.conn_of(rb).unwrap();
    let ba = b.ep.conn_of(ra).unwrap();
    let srcs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(token0 + i as u64, n))
        .collect();
    let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let (a0, b0) = (a.sink.evs.len(), b.sink.evs.len());
    for (i, d) in dsts.iter_mut().enumerate() {
        // SAFETY: `dsts` outlives the pump below and is not touched until then.
        unsafe {
            b.ep.expect_bulk(ba, token0 + i as u64, d.as_mut_ptr(), d.len())
        };
    }
    assert!(!b.ep.idle());
    for (i, s) in srcs.iter().enumerate() {
        assert!(a.ep.try_send(ab, b"before", &[i as u8]).unwrap());
        // SAFETY: `srcs` outlives the pump below and is not modified.
        unsafe { a.ep.send_bulk(ab, token0 + i as u64, s.as_ptr(), s.len()) }.unwrap();
        assert!(a.ep.try_send(ab, b"after", &[i as u8]).unwrap());
    }
    let k = sizes.len();
    pump(&mut [a, b], |n| {
        n[1].sink.evs.len() - b0 >= 3 * k && n[0].sink.evs.len() - a0 >= k
    });
    let want: Vec<Ev> = (0..k)
        .flat_map(|i| {
            let mut f = b"before".to_vec();
            f.push(i as u8);
            let mut g = b"after".to_vec();
            g.push(i as u8);
            [
                Ev::Frame(ra, f),
                Ev::BulkIn(ra, token0 + i as u64, sizes[i]),
                Ev::Frame(ra, g),
            ]
        })
        .collect();
    assert_eq!(b.sink.evs[b0..], want[..]);
    let sent: Vec<Ev> = (0..k).map(|i| Ev::BulkOut(rb, token0 + i as u64)).collect();
    assert_eq!(a.sink.evs[a0..], sent[..]);
    for i in 0..k {
        assert!(srcs[i] == dsts[i], "bulk {i} of {} bytes differs", sizes[i]);
    }
    assert!(a.ep.idle() && b.ep.idle());
}

#[test]
fn bulk_transfers_both_ways() {
    let mut a = Node::new(0);
    let mut b = Node::new(1);
    link(&mut a, &mut b);
    let sizes = [0, 1, 1 << 20, 16 << 20];
    bulk_round(&mut a, &mut b, &sizes, 100);
    bulk_round(&mut b, &mut a, &sizes, 200);
    // Small socket buffers: many partial writes and reads.
    let mut c = cfg(2);
    c.sndbuf = Some(8192);
    c.rcvbuf = Some(8192);
    let mut c = Node::with(c);
    link(&mut c, &mut a);
    bulk_round(&mut c, &mut a, &[3, 1 << 20, 0], 300);
    bulk_round(&mut a, &mut c, &[1 << 20, 5], 400);
    // Bulks cut into many writes (write_chunk), odd sizes, frames between them.
    let mut d = cfg(3);
    d.write_chunk = 4096;
    let mut d = Node::with(d);
    link(&mut d, &mut b);
    bulk_round(&mut d, &mut b, &[4095, 4096, 4097, (1 << 20) + 3, 1], 500);
}

#[test]
fn bulk_expected_after_its_bytes_arrived() {
    let mut a = Node::new(0);
    let mut b = Node::new(1);
    link(&mut a, &mut b);
    let ab = a.ep.conn_of(1).unwrap();
    let ba = b.ep.conn_of(0).unwrap();
    for len in [0usize, 100, 1 << 20] {
        let src = pattern(len as u64, len);
        b.sink.evs.clear();
        a.sink.evs.clear();
        assert!(a.ep.try_send(ab, b"rts", &[]).unwrap());
        // SAFETY: `src` lives until the bulk is reported sent below.
        unsafe { a.ep.send_bulk(ab, 7, src.as_ptr(), len) }.unwrap();
        assert!(a.ep.try_send(ab, b"behind", &[]).unwrap());
        // Let bytes arrive: the frame before is delivered, the bulk stalls the stream.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(100) {
            a.poll();
            b.poll();
        }
        assert_eq!(b.sink.evs, vec![Ev::Frame(0, b"rts".to_vec())], "len {len}");
        assert!(!b.ep.idle());
        let mut dst = vec![0u8; len];
        // SAFETY: `dst` outlives the pump and is only read after the report.
        unsafe { b.ep.expect_bulk(ba, 7, dst.as_mut_ptr(), len) };
        pump(&mut [&mut a, &mut b], |n| {
            n[1].sink.evs.len() == 3 && n[0].sink.evs.len() == 1
        });
        assert_eq!(
            b.sink.evs[1..],
            [Ev::BulkIn(0, 7, len), Ev::Frame(0, b"behind".to_vec())]
        );
        assert_eq!(a.sink.evs, vec![Ev::BulkOut(1, 7)]);
        assert!(dst == src);
    }
}

#[test]
fn bulk_larger_than_cap_is_truncated() {
    let mut a = Node::new(0);
    let mut b = Node::new(1);
    link(&mut a, &mut b);
    let ab = a.ep.conn_of(1).unwrap();
    let ba = b.ep.conn_of(0).unwrap();
    for (len, cap, late) in [
        (100_000usize, 1000usize, false),
        (3 << 20, 4096, false),
        (50_000, 10, true),
    ] {
        b.sink.evs.clear();
        let src = pattern(9, len);
        let mut dst = vec![0xEEu8; cap + 1000];
        if !late {
            // SAFETY: `dst` outlives the pump; only `cap` bytes may be written.
            unsafe { b.ep.expect_bulk(ba, 42, dst.as_mut_ptr(), cap) };
        }
        // SAFETY: `src` outlives the pump.
        unsafe { a.ep.send_bulk(ab, 42, src.as_ptr(), len) }.unwrap();
        assert!(a.ep.try_send(ab, b"next", &[]).unwrap());
        if late {
            for _ in 0..100 {
                a.poll();
                b.poll();
            }
            // SAFETY: as above.
            unsafe { b.ep.expect_bulk(ba, 42, dst.as_mut_ptr(), cap) };
        }
        pump(&mut [&mut a, &mut b], |n| n[1].sink.evs.len() == 2);
        assert_eq!(
            b.sink.evs,
            [Ev::BulkIn(0, 42, len), Ev::Frame(0, b"next".to_vec())]
        );
        assert_eq!(dst[..cap], src[..cap]);
        assert!(dst[cap..].iter().all(|&x| x == 0xEE), "written past cap");
    }
}

#[test]
fn simultaneous_connect_keeps_one_connection_and_order() {
    // Several interleavings: who polls first, and how many polls before the other starts.
    for (lead, head_start) in [(0usize, 0usize), (1, 0), (0, 1), (1, 2), (0, 5)] {
        let mut n1 = Node::new(1);
        let mut n3 = Node::new(3);
        let c13 = n1.ep.connect(3, &n3.ep.card()).unwrap();
        let c31 = n3.ep.connect(1, &n1.ep.card()).unwrap();
        const K: usize = 50;
        for i in 0..K {
            assert!(n1.ep.try_send(c13, b"from1", &[i as u8]).unwrap());
            assert!(n3.ep.try_send(c31, b"from3", &[i as u8]).unwrap());
        }
        {
            let first = if lead == 0 { &mut n1 } else { &mut n3 };
            for _ in 0..head_start {
                first.poll();
            }
        }
        pump(&mut [&mut n1, &mut n3], |n| {
            n[0].sink.evs.len() >= K && n[1].sink.evs.len() >= K
        });
        // Then more over the surviving connection.
        for i in K..K + 10 {
            assert!(n1.ep.try_send(c13, b"from1", &[i as u8]).unwrap());
            assert!(n3.ep.try_send(c31, b"from3", &[i as u8]).unwrap());
        }
        pump(&mut [&mut n1, &mut n3], |n| {
            n[0].sink.evs.len() >= K + 10 && n[1].sink.evs.len() >= K + 10
        });
        for _ in 0..50 {
            n1.poll();
            n3.poll();
        }
        let check = |sink: &Sink, from: u32, tag: &[u8], total: usize| {
            let f = sink.frames();
            assert_eq!(sink.failures(), vec![], "no failure expected");
            assert_eq!(f.len(), total, "frames delivered exactly once");
            for (i, (p, fr)) in f.iter().enumerate() {
                let mut want = tag.to_vec();
                want.push(i as u8);
                assert_eq!((*p, fr.clone()), (from, want), "frame {i} in order");
            }
        };
        check(&n3.sink, 1, b"from1", K + 10);
        check(&n1.sink, 3, b"from3", K + 10);
        assert!(n1.ep.is_ready(c13) && n3.ep.is_ready(c31));
        assert_eq!(n1.ep.conn_of(3), Some(c13));
        assert_eq!(n3.ep.conn_of(1), Some(c31));
        // One connection survived: the one rank 1 (the lower) initiated.
        let (s1, s3) = (n1.ep.stats(), n3.ep.stats());
        assert_eq!((s1.connections, s3.connections), (1, 1));
        assert_eq!(
            (s1.accepted, s3.accepted),
            (0, 1),
            "rank 3 accepted rank 1's"
        );
        assert_eq!(s1.superseded, 0);
        assert_eq!(s3.superseded, 1, "rank 3 gave up its own connection");
    }
}

#[test]
fn strangers_are_refused_and_the_endpoint_keeps_working() {
    let mut a = Node::new(0);
    let mf = a.ep.config().max_frame as u32;
    // Wrong secret: NACK naming the problem (not the secret), then closed.
    let (mut s, r) = raw_connect(&mut a, &hello(JOB, [1, 2], 7, 0, mf));
    let (kind, rank, reason) = r.unwrap();
    assert_eq!((kind, rank), (3, 0));
    assert!(reason.contains("wrong job secret"), "{reason}");
    assert!(!reason.contains(&SECRET[0].to_string()));
    let mut rest = [0u8; 8];
    assert!(
        matches!(s.read(&mut rest), Ok(0) | Err(_)),
        "closed after the NACK"
    );
    // Another job, another target rank, another max_frame.
    for (h, want) in [
        (hello(JOB + 1, SECRET, 7, 0, mf), "another job"),
        (hello(JOB, SECRET, 7, 5, mf), "meant to reach rank 5"),
        (hello(JOB, SECRET, 7, 0, mf * 2), "WEFT_TCP_MAX_FRAME"),
    ] {
        let (_, r) = raw_connect(&mut a, &h);
        let (kind, _, reason) = r.unwrap();
        assert_eq!(kind, 3);
        assert!(reason.contains(want), "{reason} should say {want}");
    }
    // Garbage: closed without an answer.
    let (_, r) = raw_connect(&mut a, &pattern(1, 48));
    assert!(r.is_err(), "garbage got an answer: {r:?}");
    // Garbage longer than a HELLO.
    let (_, r) = raw_connect(&mut a, &pattern(2, 4000));
    assert!(r.is_err());
    // Silence: closed after hello_timeout.
    let t = Instant::now();
    let (_, r) = raw_connect(&mut a, b"WTCP");
    assert!(r.is_err());
    assert!(t.elapsed() >= Duration::from_millis(250));
    assert_eq!(a.ep.stats().refused, 7);
    assert_eq!(a.ep.stats().connections, 0);
    assert!(
        a.sink.evs.is_empty(),
        "strangers are not peers: {:?}",
        a.sink.evs
    );
    // A legitimate peer still gets through.
    let mut b = Node::new(1);
    link(&mut b, &mut a);
    let c = b.ep.conn_of(0).unwrap();
    assert!(b.ep.try_send(c, b"hi", b"!").unwrap());
    pump(&mut [&mut a, &mut b], |n| !n[0].sink.evs.is_empty());
    assert_eq!(a.sink.evs, vec![Ev::Frame(1, b"hi!".to_vec())]);
}

#[test]
fn nack_and_refused_connect_are_reported() {
    let mut a = Node::new(0);
    let mut other = cfg(1);
    other.job = JOB + 1;
    let mut b = Node::with(other);
    let c = a.ep.connect(1, &b.ep.card()).unwrap();
    assert!(a.ep.try_send(c, b"lost", b"").unwrap());
    pump(&mut [&mut a, &mut b], |n| !n[0].sink.evs.is_empty());
    let f = a.sink.failures();
    assert_eq!(f.len(), 1);
    assert!(
        f[0].1.contains("refused the connection") && f[0].1.contains("another job"),
        "{}",
        f[0].1
    );
    assert!(matches!(
        a.ep.try_send(c, b"x", b""),
        Err(Error::ConnectionFailed { peer: 1, .. })
    ));
    assert!(b.sink.evs.is_empty());
    assert!(a.ep.idle());

    // Nobody listening: connect refused.
    let dead = {
        let n = Node::new(2);
        n.ep.card()
    };
    let c = a.ep.connect(2, &dead).unwrap();
    pump(&mut [&mut a], |n| n[0].sink.failures().len() == 2);
    let f = a.sink.failures();
    assert_eq!(f[1].0, 2);
    assert!(f[1].1.contains("could not connect to rank 2"), "{}", f[1].1);
    assert!(!a.ep.is_ready(c));
}

#[test]
fn bad_cards_and_self_connect_are_errors() {
    let mut a = Node::new(0);
    let b = Node::new(1);
    let card = b.ep.card();
    assert!(matches!(
        a.ep.connect(2, &card),
        Err(Error::CardRank {
            expected: 2,
            found: 1
        })
    ));
    assert!(matches!(
        a.ep.connect(1, &card[..5]),
        Err(Error::Card { .. })
    ));
    assert!(matches!(
        a.ep.connect(1, b"garbage garbage!"),
        Err(Error::Card { .. })
    ));
    assert!(matches!(
        a.ep.connect(0, &a.ep.card()),
        Err(Error::SelfConnect { me: 0 })
    ));
    let c = weft_tcp::Card::decode(&card).unwrap();
    assert_eq!(c.rank, 1);
    assert_eq!(c.addr, b.ep.local_addr());
    assert_eq!(c.encode(), card);
    assert!(a.ep.conn_of(1).is_none() && a.ep.conn_of(2).is_none());
}

#[test]
fn dropped_endpoint_is_reported_by_rank() {
    let mut a = Node::new(0);
    let mut b = Node::new(4);
    link(&mut a, &mut b);
    let c = a.ep.conn_of(4).unwrap();
    drop(b);
    std::thread::sleep(Duration::from_millis(10));
    a.poll();
    assert_eq!(
        a.sink.failures(),
        vec![(4, "rank 4 closed the connection".to_string())]
    );
    assert!(!a.ep.is_ready(c));
    for _ in 0..100 {
        a.poll();
    }
    assert_eq!(a.sink.failures().len(), 1, "reported once");
}

#[test]
fn close_is_seen_by_the_peer() {
    let mut a = Node::new(0);
    let mut b = Node::new(1);
    link(&mut a, &mut b);
    a.ep.close(1);
    let c = a.ep.conn_of(1).unwrap();
    assert!(matches!(
        a.ep.try_send(c, b"x", b""),
        Err(Error::ConnectionFailed { .. })
    ));
    pump(&mut [&mut a, &mut b], |n| !n[1].sink.evs.is_empty());
    assert_eq!(
        b.sink.failures(),
        vec![(0, "rank 0 closed the connection".to_string())]
    );
    assert!(a.sink.evs.is_empty(), "close is not a failure");
    // And they can connect again.
    link(&mut b, &mut a);
    let c = b.ep.conn_of(0).unwrap();
    assert!(b.ep.try_send(c, b"again", b"").unwrap());
    pump(&mut [&mut a, &mut b], |n| !n[0].sink.evs.is_empty());
    assert_eq!(a.sink.frames(), vec![(1, b"again".to_vec())]);
}

/// Raw peer (rank 5) writes `bytes`, closes; the endpoint reports `want` within two polls
/// (the first may stop after delivering what preceded the end of stream).
fn close_midway(bytes: &[u8], expect: Option<(u64, usize)>, want: &str) {
    let mut a = Node::new(0);
    let mut s = raw_peer(&mut a, 5, 0);
    pump(&mut [&mut a], |n| {
        n[0].ep.conn_of(5).is_some_and(|c| n[0].ep.is_ready(c))
    });
    let c = a.ep.conn_of(5).unwrap();
    let mut dst = vec![0u8; expect.map_or(0, |e| e.1)];
    if let Some((token, cap)) = expect {
        // SAFETY: `dst` outlives the endpoint's use of it (failure abandons it).
        unsafe { a.ep.expect_bulk(c, token, dst.as_mut_ptr(), cap) };
    }
    s.write_all(&rec_frame(b"whole")).unwrap();
    s.write_all(bytes).unwrap();
    s.shutdown(Shutdown::Both).unwrap();
    drop(s);
    std::thread::sleep(Duration::from_millis(20));
    a.poll();
    assert!(a.sink.evs.len() <= 2);
    a.poll();
    assert_eq!(
        a.sink.evs,
        vec![
            Ev::Frame(5, b"whole".to_vec()),
            Ev::Failed(5, want.to_string())
        ]
    );
    assert!(a.ep.idle());
}

#[test]
fn peer_closing_midway_is_reported_and_nothing_half_delivered() {
    close_midway(&[], None, "rank 5 closed the connection");
    close_midway(
        &rec_frame(&[7; 1000])[..16 + 500],
        None,
        "rank 5 closed the connection in the middle of a 1000-byte frame (500 bytes received)",
    );
    close_midway(
        &rec_frame(&[7; 10])[..9],
        None,
        "rank 5 closed the connection in the middle of a record header (9 of 16 bytes received)",
    );
    let mut bulk = rec_bulk(9, 1 << 20);
    bulk.extend(pattern(3, 412_300));
    close_midway(
        &bulk,
        Some((9, 1 << 20)),
        "rank 5 closed the connection in the middle of a 1048576-byte bulk transfer (412300 bytes received)",
    );
    // Not expected yet (stalled in the receive buffer): same report. (A prefix larger than
    // the receive buffer would keep the FIN behind unread data: not visible yet.)
    let mut bulk = rec_bulk(9, 1 << 20);
    bulk.extend(pattern(3, 100_000));
    close_midway(
        &bulk,
        None,
        "rank 5 closed the connection in the middle of a 1048576-byte bulk transfer (100000 bytes received)",
    );
}

#[test]
fn protocol_errors_drop_the_connection_with_a_reason() {
    let mut c = cfg(0);
    c.bulk_wait = Some(Duration::from_millis(100));
    let mf = c.max_frame;
    let mut a = Node::with(c);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![0xff; 16], "unknown record kind 0xff"),
        (
            rec_frame(&vec![0; mf + 1])[..16].to_vec(),
            "exceeds the largest frame",
        ),
        (
            {
                let mut b = rec_frame(b"x");
                b[12] = 1;
                b
            },
            "reserved",
        ),
        (rec_bulk(77, 5), "never expected"),
        (rec_bulk(78, 1 << 50), "never expected"),
    ];
    for (i, (bytes, want)) in cases.into_iter().enumerate() {
        let from = 10 + i as u32;
        let mut s = raw_peer(&mut a, from, 0);
        s.write_all(&rec_frame(b"ok")).unwrap();
        s.write_all(&bytes).unwrap();
        if want == "never expected" {
            s.write_all(&pattern(1, 300_000)).unwrap_or(());
        }
        pump(&mut [&mut a], |n| !n[0].sink.failures().is_empty());
        let f = a.sink.failures();
        assert_eq!(f[0].0, from);
        assert!(
            f[0].1.contains(want) && f[0].1.contains(&format!("rank {from}")),
            "{}",
            f[0].1
        );
        assert_eq!(a.sink.frames(), vec![(from, b"ok".to_vec())]);
        a.sink.evs.clear();
        // The raw peer sees the connection closed.
        let mut buf = [0u8; 64];
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
    }
}

#[test]
fn endpoint_is_send_and_works_across_threads() {
    fn is_send<T: Send>() {}
    is_send::<Endpoint>();
    let mut a = Node::new(0);
    let mut b = Node::new(1);
    let card_b = b.ep.card();
    let h = std::thread::spawn(move || {
        // Echo 200 frames back.
        let mut got = 0;
        let t = Instant::now();
        while got < 200 {
            b.poll();
            let frames = b.sink.frames();
            b.sink.evs.clear();
            for (p, f) in frames {
                let c = b.ep.conn_of(p).unwrap();
                while !b.ep.try_send(c, &f, &[]).unwrap() {
                    b.poll();
                }
                got += 1;
            }
            assert!(t.elapsed() < Duration::from_secs(20));
        }
        for _ in 0..1000 {
            b.poll();
        }
    });
    let c = a.ep.connect(1, &card_b).unwrap();
    for i in 0..200u32 {
        assert!(a.ep.try_send(c, &i.to_le_bytes(), &[]).unwrap());
    }
    pump(&mut [&mut a], |n| n[0].sink.evs.len() >= 200);
    let want: Vec<(u32, Vec<u8>)> = (0..200u32).map(|i| (1, i.to_le_bytes().to_vec())).collect();
    assert_eq!(a.sink.frames(), want);
    h.join().unwrap();
    let _ = Config::new(0, 0, [0, 0], "127.0.0.1".parse().unwrap());
    let _: Option<TcpStream> = None;
}

#[test]
fn a_forbidden_peer_is_refused_for_good_on_both_sides() {
    let mut a = Node::new(0);
    let mut b = Node::new(1);
    link(&mut a, &mut b);
    a.ep.forbid(1, "its process was killed by signal 9");
    pump(&mut [&mut a, &mut b], |n| !n[1].sink.failures().is_empty());
    // b may try again: a refuses, naming why, and b reports it.
    b.sink.evs.clear();
    let c = b.ep.connect(0, &a.ep.card()).unwrap();
    pump(&mut [&mut a, &mut b], |n| !n[1].sink.failures().is_empty());
    let f = b.sink.failures();
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        f[0].1.contains("has given up on rank 1") && f[0].1.contains("killed by signal 9"),
        "{f:?}"
    );
    assert!(!b.ep.is_ready(c));
    assert!(a.sink.frames().is_empty());
    // And a will not connect to it either.
    assert!(matches!(
        a.ep.connect(1, &b.ep.card()),
        Err(Error::ConnectionFailed { peer: 1, .. })
    ));
}

#[test]
fn a_flooding_peer_cannot_hold_one_poll() {
    // A raw peer writes far more small frames than one poll's read budget holds: each poll
    // delivers a bounded part, in order, and every frame arrives.
    let mut a = Node::new(0);
    let mut s = raw_peer(&mut a, 7, 0);
    pump(&mut [&mut a], |n| {
        n[0].ep.conn_of(7).is_some_and(|c| n[0].ep.is_ready(c))
    });
    let frames = 400_000usize;
    let writer = std::thread::spawn(move || {
        let mut all = Vec::new();
        for i in 0..frames as u32 {
            all.extend_from_slice(&rec_frame(&i.to_le_bytes()));
        }
        s.write_all(&all).unwrap();
        s
    });
    let mut most = 0;
    let t = std::time::Instant::now();
    while a.sink.frames().len() < frames {
        let before = a.sink.evs.len();
        a.poll();
        most = most.max(a.sink.evs.len() - before);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "timed out"
        );
    }
    let _s = writer.join().unwrap();
    let got: Vec<u32> = a
        .sink
        .frames()
        .iter()
        .map(|(_, f)| u32::from_le_bytes(f[..4].try_into().unwrap()))
        .collect();
    assert!(
        got.iter().copied().eq(0..frames as u32),
        "out of order or lost"
    );
    // 20 bytes a frame: the whole flood is 8 MB, a poll reads a few receive buffers of it.
    assert!(
        most < frames / 4,
        "one poll delivered {most} of {frames} frames"
    );
}

#[test]
fn frames_sent_before_a_peer_closed_are_delivered_even_after_a_write_fails() {
    // The raw peer (rank 6) sends three frames and closes. Writing to it then fails
    // (reset, broken pipe) before anything was read here: the three frames must still be
    // delivered, then the failure.
    let mut a = Node::new(0);
    let mut s = raw_peer(&mut a, 6, 0);
    pump(&mut [&mut a], |n| {
        n[0].ep.conn_of(6).is_some_and(|c| n[0].ep.is_ready(c))
    });
    let c = a.ep.conn_of(6).unwrap();
    for i in 0..3u8 {
        s.write_all(&rec_frame(&[i; 10])).unwrap();
    }
    drop(s);
    std::thread::sleep(std::time::Duration::from_millis(50));
    // Write until the kernel reports the broken connection (no poll meanwhile).
    for _ in 0..100 {
        match a.ep.try_send(c, b"ping", b"") {
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
            Err(_) => break,
        }
    }
    pump(&mut [&mut a], |n| !n[0].sink.failures().is_empty());
    let frames: Vec<Vec<u8>> = a.sink.frames().into_iter().map(|(_, f)| f).collect();
    assert_eq!(frames, vec![vec![0u8; 10], vec![1u8; 10], vec![2u8; 10]]);
    let f = a.sink.failures();
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].0, 6);
}

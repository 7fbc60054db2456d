//! Random and mutated record bytes through a raw socket after a valid handshake: no panic,
//! the connection is dropped with a reason naming the rank, frames delivered are whole.

mod common;

use std::io::Write;
use std::net::Shutdown;
use std::time::Duration;

use common::*;
use proptest::prelude::*;

fn run(bytes: &[u8], expect_token: Option<u64>) {
    let mut c = cfg(0);
    c.bulk_wait = Some(Duration::from_millis(50));
    c.max_frame = 4096;
    let mut a = Node::with(c);
    let mut s = raw_peer(&mut a, 9, 0);
    pump(&mut [&mut a], |n| {
        n[0].ep.conn_of(9).is_some_and(|c| n[0].ep.is_ready(c))
    });
    let conn = a.ep.conn_of(9).unwrap();
    let mut dst = vec![0u8; 100];
    if let Some(t) = expect_token {
        // SAFETY: `dst` is dropped after `a` (explicitly, below).
        unsafe { a.ep.expect_bulk(conn, t, dst.as_mut_ptr(), dst.len()) };
    }
    // A write may fail once the endpoint has dropped the connection.
    let _ = s.write_all(bytes);
    let _ = s.shutdown(Shutdown::Write);
    pump(&mut [&mut a], |n| !n[0].sink.failures().is_empty());
    let f = a.sink.failures();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].0, 9);
    assert!(f[0].1.contains("rank 9"), "{}", f[0].1);
    for (p, fr) in a.sink.frames() {
        assert_eq!(p, 9);
        assert!(fr.len() <= 4096);
    }
    drop(a);
    drop(dst);
}

fn records() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(|p| rec_frame(&p)),
            (any::<u64>(), 0u64..200).prop_map(|(t, n)| {
                let mut b = rec_bulk(t % 4, n);
                b.extend(pattern(t, n as usize));
                b
            }),
        ],
        0..8,
    )
    .prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
        run(&bytes, None);
    }

    #[test]
    fn mutated_records(
        recs in records(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
        expect in proptest::option::of(0u64..4),
    ) {
        let mut b = recs;
        if !b.is_empty() {
            for (i, x) in flips {
                let i = i.index(b.len());
                b[i] ^= x;
            }
            let n = cut.index(b.len() + 1);
            b.truncate(n.max(b.len() / 2));
        }
        run(&b, expect);
    }
}

/// The time-budgeted target of `ci/fuzz.sh` (`WEFT_FUZZ_SECS`, 1 s in a plain test run):
/// one endpoint takes connection after connection whose bytes are a mutated HELLO, or a
/// valid HELLO followed by a mutated stream of records, each closed by its client. Each
/// must end (the endpoint closes it: refused, failed, or ended) without a panic or a hang;
/// frames delivered from the hostile rank are whole; and a legitimate peer still talks
/// to the endpoint afterwards.
#[test]
fn fuzz_live_endpoint_under_hostile_connections() {
    use std::io::Read;
    use std::net::TcpStream;
    use std::time::Instant;
    let mut c = cfg(0);
    c.bulk_wait = Some(Duration::from_millis(20));
    c.hello_timeout = Duration::from_millis(50);
    c.max_frame = 4096;
    let mut a = Node::with(c);
    let valid = hello(JOB, SECRET, 9, 0, 4096);
    let records = [
        rec_frame(&pattern(1, 40)),
        rec_bulk(2, 100),
        pattern(2, 100),
        rec_frame(&[]),
        rec_frame(&pattern(3, 4000)),
    ]
    .concat();
    weft_fuzz::run("tcp-live-endpoint", 0x7c9_0001, |m| {
        let bytes = if m.below(3) == 0 {
            m.mutate(&valid)
        } else {
            [valid.clone(), m.mutate(&records)].concat()
        };
        let mut s = TcpStream::connect(a.ep.local_addr()).expect("connect");
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(Shutdown::Write);
        s.set_nonblocking(true).expect("nonblocking");
        let t = Instant::now();
        let mut b = [0u8; 256];
        loop {
            a.poll();
            match s.read(&mut b) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the endpoint kept a hostile connection open for 5 s; input {bytes:?}"
            );
        }
        for (p, f) in a.sink.frames() {
            assert_eq!(p, 9);
            assert!(f.len() <= 4096);
        }
        a.sink.evs.clear();
    });
    // The endpoint still works for a legitimate peer.
    let mut cb = cfg(1);
    cb.max_frame = 4096;
    let mut b = Node::with(cb);
    let conn = b.ep.connect(0, &a.ep.card()).expect("connect");
    let t = std::time::Instant::now();
    while !(b.ep.is_ready(conn) && a.ep.conn_of(1).is_some_and(|c| a.ep.is_ready(c))) {
        a.poll();
        b.poll();
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "a legitimate peer cannot connect after the storm: {:?} / {:?} / {:?}",
            b.sink.evs,
            a.sink.evs,
            a.ep.stats()
        );
    }
    assert!(b.ep.try_send(conn, b"after", b" the storm").expect("send"));
    pump(&mut [&mut a, &mut b], |n| {
        n[0].sink
            .frames()
            .iter()
            .any(|(p, f)| *p == 1 && f == b"after the storm")
    });
}

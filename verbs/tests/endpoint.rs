//! Two endpoints in one process over a real device (rxe0 in the soft-RoCE VM). Without a
//! device every test prints `skipped: no RDMA device (...)` and returns.

mod common;

use std::time::{Duration, Instant};

use common::{check, connect, frame, pair, pump_until, send};
use weft_verbs::{describe, Error};

#[test]
fn describe_names_the_device_or_why_there_is_none() {
    match describe() {
        Ok(text) => {
            println!("{text}");
            for field in [
                "device",
                "port state      ACTIVE",
                "GID in use",
                "active MTU",
                "max inline",
                "max message",
            ] {
                assert!(text.contains(field), "{field} missing from:\n{text}");
            }
        }
        Err(Error::NoDevice { reason }) => {
            assert!(!reason.is_empty());
            if std::env::var("WEFT_VERBS_REQUIRE_DEVICE").as_deref() == Ok("1") {
                panic!("no RDMA device: {reason}");
            }
            eprintln!("skipped: no RDMA device ({reason})");
        }
        Err(e) => panic!("describe failed with something else than NoDevice: {e}"),
    }
}

#[test]
fn frames_of_every_eager_size_arrive_in_order_both_ways() {
    let Some((mut a, mut b)) = pair(|c| c.eager_size = 2048) else {
        return;
    };
    let (ab, ba) = connect(&mut a, &mut b);
    assert_eq!(
        b.stats().accepted,
        1,
        "b accepted the connection inside poll"
    );
    let max = a.max_frame(ab) - 32;
    assert_eq!(max, 2048 - 32);
    let (mut ga, mut gb) = (Vec::new(), Vec::new());
    for len in 0..=max {
        let (h, p) = frame(len as u32, len);
        send(&mut a, &mut b, ab, &h, &p, &mut ga, &mut gb);
    }
    for seq in 0..200u32 {
        let (h, p) = frame(seq, (seq as usize * 7) % (max + 1));
        send(&mut b, &mut a, ba, &h, &p, &mut gb, &mut ga);
    }
    pump_until(&mut a, &mut b, &mut ga, &mut gb, 60, |_, _, ga, gb| {
        gb.len() == max + 1 && ga.len() == 200
    });
    for (i, (peer, f)) in gb.iter().enumerate() {
        assert_eq!(*peer, 1, "frames to b come from peer 1");
        assert_eq!(check(f), i as u32, "in order");
    }
    for (i, (peer, f)) in ga.iter().enumerate() {
        assert_eq!(*peer, 2);
        assert_eq!(check(f), i as u32, "in order");
    }
    let s = a.stats();
    println!(
        "a: {s:?}\nb: {:?}\nmax inline {}",
        b.stats(),
        a.info().max_inline
    );
    assert!(s.sends_inline > 0, "small frames went inline");
    assert!(s.sends_copied > 0, "large frames went through send buffers");
    let inline_frames = (a.info().max_inline as usize).saturating_sub(32) + 1;
    assert_eq!(
        s.sends_inline as usize, inline_frames,
        "exactly the frames <= max inline went inline"
    );
    // The frame beyond the limit is an error, not a hang.
    let (h, p) = frame(0, max + 1);
    match a.try_send(ab, &h, &p) {
        Err(Error::MessageTooLarge { len, max: m, .. }) => {
            assert_eq!((len, m), (max + 33, max + 32))
        }
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
}

#[test]
fn slow_receiver_stops_the_sender_until_it_polls() {
    let Some((mut a, mut b)) = pair(|c| c.credits = 8) else {
        return;
    };
    let (ab, _) = connect(&mut a, &mut b);
    let (mut ga, mut gb) = (Vec::new(), Vec::new());
    // b does not poll: a may send exactly its credits, then gets `false`, however long it
    // polls itself.
    let mut sent = 0u32;
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(500) {
        let (h, p) = frame(sent, 100);
        if a.try_send(ab, &h, &p).expect("try_send") {
            sent += 1;
        }
        a.poll(&mut |p, f| ga.push((p, f.to_vec())))
            .expect("poll a");
    }
    assert_eq!(sent, 8, "a fast sender sends its credits and no more");
    assert!(a.stats().no_credit > 0);
    // b polls once: it delivers the 8 frames and returns credits; then a can send again.
    pump_until(&mut a, &mut b, &mut ga, &mut gb, 30, |_, _, _, gb| {
        gb.len() == 8
    });
    let t = Instant::now();
    loop {
        a.poll(&mut |p, f| ga.push((p, f.to_vec())))
            .expect("poll a");
        let (h, p) = frame(sent, 100);
        if a.try_send(ab, &h, &p).expect("try_send") {
            sent += 1;
            break;
        }
        b.poll(&mut |p, f| gb.push((p, f.to_vec())))
            .expect("poll b");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "credits never came back"
        );
    }
    for i in sent..200 {
        let (h, p) = frame(i, 100 + i as usize);
        send(&mut a, &mut b, ab, &h, &p, &mut ga, &mut gb);
    }
    pump_until(&mut a, &mut b, &mut ga, &mut gb, 30, |_, _, _, gb| {
        gb.len() == 200
    });
    for (i, (_, f)) in gb.iter().enumerate() {
        assert_eq!(check(f), i as u32);
    }
    assert!(b.stats().credit_messages > 0 || a.stats().credit_messages > 0);
    println!("a: {:?}\nb: {:?}", a.stats(), b.stats());
}

#[test]
fn idle_keeps_what_it_finds_for_the_next_poll_and_credits_follow_reposts() {
    let Some((mut a, mut b)) = pair(|c| c.credits = 2) else {
        return;
    };
    let (ab, _) = connect(&mut a, &mut b);
    let (mut ga, mut gb) = (Vec::new(), Vec::new());
    // Settle the connection's own traffic: b has nothing to do.
    let t = Instant::now();
    while !b.idle() {
        a.poll(&mut |p, f| ga.push((p, f.to_vec())))
            .expect("poll a");
        b.poll(&mut |p, f| gb.push((p, f.to_vec())))
            .expect("poll b");
        assert!(t.elapsed() < Duration::from_secs(10), "b never idle");
    }
    // Two credits: two inline frames go, the third waits for b.
    for i in 0..2 {
        let (h, p) = frame(i, 8);
        assert!(
            a.try_send(ab, &h, &p).expect("try_send"),
            "frame {i} refused"
        );
    }
    let (h, p) = frame(2, 8);
    assert!(
        !a.try_send(ab, &h, &p).expect("try_send"),
        "a third frame without credit"
    );
    // b's idle look takes the completions off the queue; its next poll delivers them.
    let t = Instant::now();
    while b.idle() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the frames never arrived"
        );
    }
    let n = b
        .poll(&mut |p, f| gb.push((p, f.to_vec())))
        .expect("poll b");
    assert!(
        n >= 1,
        "the poll after a busy idle delivers what idle found"
    );
    // Credits come back only once b's next poll reposted the buffers.
    let t = Instant::now();
    loop {
        b.poll(&mut |p, f| gb.push((p, f.to_vec())))
            .expect("poll b");
        a.poll(&mut |p, f| ga.push((p, f.to_vec())))
            .expect("poll a");
        if a.try_send(ab, &h, &p).expect("try_send") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "credits never came back"
        );
    }
    pump_until(&mut a, &mut b, &mut ga, &mut gb, 30, |_, _, _, gb| {
        gb.len() == 3
    });
    for (i, (_, f)) in gb.iter().enumerate() {
        assert_eq!(check(f), i as u32, "frames in order");
    }
}

fn read_into(
    a: &mut weft_verbs::Endpoint,
    b: &mut weft_verbs::Endpoint,
    ab: weft_verbs::ConnId,
    dst: &mut [u8],
    src: weft_verbs::RemoteRegion,
) {
    // SAFETY: `dst` is not touched until poll_rdma reports the token below.
    let token = unsafe { a.rdma_read(ab, dst.as_mut_ptr(), dst.len(), src.addr, src.rkey) }
        .expect("rdma_read")
        .expect("room for a read");
    let mut done = None;
    let t = Instant::now();
    while done.is_none() {
        a.poll_rdma(&mut |t, r| {
            assert_eq!(t, token);
            done = Some(r);
        });
        b.poll(&mut |_, _| {}).expect("poll b");
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "read never completed"
        );
    }
    done.unwrap().expect("read succeeded");
}

#[test]
fn rdma_read_of_1_and_4_mib() {
    let Some((mut a, mut b)) = pair(|_| {}) else {
        return;
    };
    let (ab, _) = connect(&mut a, &mut b);
    for mib in [1usize, 4] {
        let len = mib << 20;
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + mib) as u8).collect();
        let region = b.register(src.as_ptr(), src.len()).expect("register");
        assert_eq!(region.addr, src.as_ptr() as u64);
        let mut dst = vec![0u8; len];
        let t = Instant::now();
        read_into(&mut a, &mut b, ab, &mut dst, region);
        println!("rdma_read {mib} MiB: {:?}", t.elapsed());
        assert!(dst == src, "{mib} MiB read differs");
    }
    assert_eq!(a.stats().reads, 2);
}

#[test]
fn rdma_write_of_1_and_4_mib() {
    let Some((mut a, mut b)) = pair(|_| {}) else {
        return;
    };
    let (ab, _) = connect(&mut a, &mut b);
    for mib in [1usize, 4] {
        let len = mib << 20;
        let src: Vec<u8> = (0..len).map(|i| (i * 13 + mib) as u8).collect();
        let dst = vec![0u8; len];
        let region = b.register(dst.as_ptr(), len).expect("register");
        // SAFETY: `src` is not modified until the write is reported.
        let token = unsafe { a.rdma_write(ab, src.as_ptr(), len, region.addr, region.rkey) }
            .expect("rdma_write")
            .expect("room for a write");
        let mut done = None;
        let t = Instant::now();
        while done.is_none() {
            a.poll_rdma(&mut |tok, r| {
                assert_eq!(tok, token);
                done = Some(r);
            });
            b.poll(&mut |_, _| {}).expect("poll b");
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "write never completed"
            );
        }
        done.unwrap().expect("write succeeded");
        println!("rdma_write {mib} MiB: {:?}", t.elapsed());
        b.release(region);
        // The NIC placed the data before the write completed.
        // SAFETY: `dst` is live; the write completed, nothing writes to it any more.
        let landed =
            unsafe { std::slice::from_raw_parts(std::ptr::read_volatile(&dst.as_ptr()), len) };
        assert!(landed == &src[..], "{mib} MiB write differs");
    }
    assert_eq!(a.stats().writes, 2);
}

#[test]
fn registration_cache_reuses_and_invalidation_sees_new_pages() {
    let Some((mut a, mut b)) = pair(|_| {}) else {
        return;
    };
    let (ab, _) = connect(&mut a, &mut b);
    let len = 64 << 10;
    // SAFETY: anonymous private mapping of `len` bytes.
    let map = |at: *mut libc::c_void, fixed: bool| unsafe {
        let flags =
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if fixed { libc::MAP_FIXED } else { 0 };
        let p = libc::mmap(at, len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
        assert_ne!(p, libc::MAP_FAILED);
        p as *mut u8
    };
    let src = map(std::ptr::null_mut(), false);
    // SAFETY: `src` is a fresh mapping of `len` bytes.
    unsafe { std::ptr::write_bytes(src, 0xa1, len) };
    let r1 = b.register(src, len).unwrap();
    let r2 = b.register(src.wrapping_add(100), 1000).unwrap();
    assert_eq!(
        r1.rkey, r2.rkey,
        "a range inside a cached registration reuses it"
    );
    let s = b.stats().rcache;
    assert_eq!((s.hits, s.misses), (1, 1));
    let mut dst = vec![0u8; len];
    read_into(&mut a, &mut b, ab, &mut dst, r1);
    assert!(dst.iter().all(|&x| x == 0xa1));
    // The local side cached its destination too: a second read hits.
    let before = a.stats().rcache.hits;
    read_into(&mut a, &mut b, ab, &mut dst, r1);
    assert_eq!(a.stats().rcache.hits, before + 1);

    // Both exposures are over (the peer finished reading).
    b.release(r2);
    // Free the memory and map new pages at the same address: invalidate first (the rule).
    // SAFETY: `src` is our mapping; nothing reads it any more.
    unsafe { libc::munmap(src as *mut libc::c_void, len) };
    let again = map(src as *mut libc::c_void, true);
    assert_eq!(again, src);
    // SAFETY: fresh mapping of `len` bytes.
    unsafe { std::ptr::write_bytes(again, 0x5b, len) };
    assert_eq!(
        b.invalidate(again, len),
        1,
        "one cached registration covered the range"
    );
    let r3 = b.register(again, len).unwrap();
    assert_ne!(r3.rkey, r1.rkey, "a new registration after invalidation");
    assert_eq!(b.stats().rcache.misses, 2);
    read_into(&mut a, &mut b, ab, &mut dst, r3);
    assert!(
        dst.iter().all(|&x| x == 0x5b),
        "the read sees the new pages"
    );
    // The old rkey is gone: reading through it is a clear error naming the peer.
    // SAFETY: `dst` is not touched until the token is reported.
    let t = unsafe { a.rdma_read(ab, dst.as_mut_ptr(), len, r1.addr, r1.rkey) }
        .unwrap()
        .unwrap();
    let mut res = None;
    let start = Instant::now();
    while res.is_none() {
        a.poll_rdma(&mut |tok, r| {
            assert_eq!(tok, t);
            res = Some(r);
        });
        let _ = b.poll(&mut |_, _| {});
        assert!(start.elapsed() < Duration::from_secs(10));
    }
    let e = res
        .unwrap()
        .expect_err("a read with an invalidated rkey fails");
    println!("stale rkey: {e}");
    assert_eq!(e.peer(), Some(2), "{e}");
    assert!(matches!(e, Error::WorkCompletion { .. }), "{e}");
    // SAFETY: our mapping.
    unsafe { libc::munmap(again as *mut libc::c_void, len) };
}

#[test]
fn an_exposed_region_stays_registered_until_released() {
    let Some((mut a, mut b)) = pair(|_| {}) else {
        return;
    };
    let (ab, _) = connect(&mut a, &mut b);
    let src: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
    let x = b.register(src.as_ptr(), 16 << 10).unwrap();
    // A second exposure overlapping the first one's pages does not evict it: the peer may be
    // reading through the first rkey.
    let y = b
        .register(src.as_ptr().wrapping_add(12 << 10), 32 << 10)
        .unwrap();
    assert_ne!(x.rkey, y.rkey);
    assert_eq!(b.stats().rcache.pinned, 2);
    let mut dst = vec![0u8; 16 << 10];
    read_into(&mut a, &mut b, ab, &mut dst, x);
    assert!(
        dst[..] == src[..16 << 10],
        "read through the first exposure"
    );
    b.release(x);
    b.release(y);
    assert_eq!(b.stats().rcache.pinned, 0);
    // Released entries stay cached for reuse...
    let x2 = b.register(src.as_ptr(), 1000).unwrap();
    assert_eq!(x2.rkey, x.rkey);
    b.release(x2);
    // ...until a new registration overlapping them replaces them.
    let z = b
        .register(src.as_ptr().wrapping_add(8 << 10), 56 << 10)
        .unwrap();
    assert!(z.rkey != x.rkey && z.rkey != y.rkey);
    assert_eq!(b.stats().rcache.entries, 1);
    let mut dst = vec![0u8; 56 << 10];
    read_into(&mut a, &mut b, ab, &mut dst, z);
    assert!(
        dst[..] == src[8 << 10..],
        "read through the replacing exposure"
    );
}

#[test]
fn invalidating_one_buffer_spares_a_transfer_through_a_neighbour_sharing_its_page() {
    let Some((mut a, mut b)) = pair(|_| {}) else {
        return;
    };
    let (ab, _) = connect(&mut a, &mut b);
    let mem: Vec<u8> = (0..64 << 10).map(|i| (i % 241) as u8).collect();
    // Two send buffers that share the page at 4..8 KiB (the fabric registers per message).
    let x_ptr = mem.as_ptr().wrapping_add(1000);
    let y_ptr = mem.as_ptr().wrapping_add(6000);
    let x = b.register(x_ptr, 5000).unwrap();
    let y = b.register(y_ptr, 20000).unwrap();
    // x's transfer is done: its owner invalidates it while y is still being read.
    assert!(b.invalidate(x_ptr, 5000) >= 1);
    let mut dst = vec![0u8; 20000];
    read_into(&mut a, &mut b, ab, &mut dst, y);
    assert!(
        dst[..] == mem[6000..26000],
        "the neighbour's registration survived"
    );
    assert_eq!(b.stats().rcache.pinned, 1);
    b.invalidate(y_ptr, 20000);
    let s = b.stats().rcache;
    assert_eq!((s.pinned, s.entries), (0, 0), "{s:?}");
    assert_ne!(x.rkey, y.rkey);
}

/// Polls `a` (and `b`, so its side of the connection moves) until `token` is reported;
/// returns its result.
fn wait_rdma(
    a: &mut weft_verbs::Endpoint,
    b: &mut weft_verbs::Endpoint,
    token: weft_verbs::RdmaToken,
) -> Result<(), Error> {
    let mut done = None;
    let t = Instant::now();
    while done.is_none() {
        a.poll_rdma(&mut |tok, r| {
            assert_eq!(tok, token, "only this transfer is in flight");
            done = Some(r);
        });
        b.poll(&mut |_, _| {}).expect("poll b");
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "transfer never completed"
        );
    }
    done.unwrap()
}

#[test]
fn rdma_bufs_read_and_write_without_unsafe_and_come_back_after_the_completion() {
    let Some((mut a, mut b)) = pair(|_| {}) else {
        return;
    };
    let (ab, _) = connect(&mut a, &mut b);
    let len = 1 << 20;
    // Read: b exposes a pattern, a reads it into its own registered buffer.
    let src: Vec<u8> = (0..len).map(|i| (i * 11 + 3) as u8).collect();
    let region = b.register(src.as_ptr(), len).expect("register");
    let buf = a.alloc_rdma_buf(len).expect("alloc_rdma_buf");
    assert!(buf.as_slice().iter().all(|&x| x == 0), "made zeroed");
    let token = a.read_into(ab, buf, region).expect("read started");
    assert!(
        a.take_buf(token).is_none(),
        "the buffer stays lent until poll_rdma reports the read"
    );
    wait_rdma(&mut a, &mut b, token).expect("read succeeded");
    let mut buf = a.take_buf(token).expect("the buffer comes back");
    assert!(buf.as_slice() == &src[..], "read bytes differ");
    assert!(a.take_buf(token).is_none(), "handed back once");
    b.release(region);

    // Write: b exposes a zeroed buffer, a writes its (rewritten) buffer there.
    for (i, x) in buf.as_mut_slice().iter_mut().enumerate() {
        *x = (i * 5 + 1) as u8;
    }
    let dst = vec![0u8; len];
    let region = b.register(dst.as_ptr(), len).expect("register");
    let token = a.write_from(ab, buf, region).expect("write started");
    wait_rdma(&mut a, &mut b, token).expect("write succeeded");
    let buf = a.take_buf(token).expect("the buffer comes back");
    // SAFETY: `dst` is live; the write completed, nothing writes to it any more.
    let landed = unsafe { std::slice::from_raw_parts(std::ptr::read_volatile(&dst.as_ptr()), len) };
    assert!(landed == buf.as_slice(), "written bytes differ");
    b.release(region);
    assert_eq!((a.stats().reads, a.stats().writes), (1, 1));

    // A buffer longer than the peer's region is refused, handed back as it was.
    let small = vec![0u8; 4096];
    let region = b.register(small.as_ptr(), small.len()).expect("register");
    let refused = a
        .read_into(ab, buf, region)
        .expect_err("longer than the region");
    match &refused.error {
        Some(Error::MessageTooLarge { what, len: l, max }) => {
            assert!(what.contains("longer than the peer's region"), "{what}");
            assert_eq!((*l, *max), (len, 4096));
        }
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    assert_eq!(refused.buf.len(), len);
    assert!(
        refused.buf.as_slice()[..16] == landed[..16],
        "contents kept"
    );
    let refused = a
        .write_from(ab, refused.buf, region)
        .expect_err("longer than the region");
    assert!(matches!(refused.error, Some(Error::MessageTooLarge { .. })));
    b.release(region);
    // Nothing was registered per transfer: the exposures' registrations only.
    assert_eq!(a.stats().rcache.entries, 0, "{:?}", a.stats().rcache);
}

#[test]
fn max_message_size_and_invalid_buffers_are_clear_errors() {
    let Some((mut a, mut b)) = pair(|_| {}) else {
        return;
    };
    let (ab, _) = connect(&mut a, &mut b);
    let max = a.max_read() as usize;
    let mut small = [0u8; 8];
    // SAFETY: the read is refused before anything is posted.
    match unsafe { a.rdma_read(ab, small.as_mut_ptr(), max + 1, 0, 0) } {
        Err(Error::MessageTooLarge { what, len, max: m }) => {
            assert_eq!((what, len, m), ("RDMA read", max + 1, max));
        }
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    // SAFETY: refused before anything is posted.
    match unsafe { a.rdma_write(ab, small.as_ptr(), max + 1, 0, 0) } {
        Err(Error::MessageTooLarge { what, .. }) => assert_eq!(what, "RDMA write"),
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    // Memory that is not mapped cannot be registered.
    let len = 1 << 20;
    // SAFETY: map then unmap a range, leaving a hole.
    let hole = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::munmap(p, len);
        p as *const u8
    };
    match a.register(hole, len) {
        Err(e @ Error::RegMr { .. }) => {
            println!("unmapped: {e}");
            assert!(e.to_string().contains("ibv_reg_mr"), "{e}");
        }
        other => panic!("expected RegMr error, got {other:?}"),
    }
    assert!(matches!(
        a.register(std::ptr::null(), 4096),
        Err(Error::RegMr { .. })
    ));
    // The endpoint still works.
    let (mut ga, mut gb) = (Vec::new(), Vec::new());
    let (h, p) = frame(7, 10);
    send(&mut a, &mut b, ab, &h, &p, &mut ga, &mut gb);
    pump_until(&mut a, &mut b, &mut ga, &mut gb, 30, |_, _, _, gb| {
        gb.len() == 1
    });
}

#[test]
fn simultaneous_connects_make_one_connection() {
    let Some((mut a, mut b)) = pair(|_| {}) else {
        return;
    };
    let (ca, cb) = (a.card(), b.card());
    let ab = a.connect(2, &cb).unwrap();
    let ba = b.connect(1, &ca).unwrap();
    let (mut ga, mut gb) = (Vec::new(), Vec::new());
    pump_until(&mut a, &mut b, &mut ga, &mut gb, 30, |a, b, _, _| {
        a.is_ready(ab) && b.is_ready(ba)
    });
    for i in 0..50 {
        let (h, p) = frame(i, 40);
        send(&mut a, &mut b, ab, &h, &p, &mut ga, &mut gb);
        send(&mut b, &mut a, ba, &h, &p, &mut gb, &mut ga);
    }
    pump_until(&mut a, &mut b, &mut ga, &mut gb, 30, |_, _, ga, gb| {
        ga.len() == 50 && gb.len() == 50
    });
    assert_eq!(a.stats().connections, 1);
    assert_eq!(b.stats().connections, 1);
}

#[test]
fn a_peer_that_never_answers_is_a_handshake_timeout() {
    let Some(mut a) = common::open(1, |c| c.handshake_timeout = Duration::from_millis(700)) else {
        return;
    };
    let Some(b) = common::open(2, |_| {}) else {
        return;
    };
    let mut card = b.card();
    card[8..12].copy_from_slice(&0x00ff_fff0u32.to_le_bytes()); // no such UD queue pair
    a.connect(2, &card).unwrap();
    let t = Instant::now();
    let e = loop {
        if let Err(e) = a.poll(&mut |_, _| {}) {
            break e;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no timeout");
    };
    println!("{e} (after {:?})", t.elapsed());
    match e {
        Error::HandshakeTimeout { peer: 2, waited_ms } => assert!(waited_ms >= 700, "{waited_ms}"),
        e => panic!("expected a handshake timeout naming peer 2, got {e}"),
    }
    assert!(a.connect(3, &card[..5]).is_err(), "a short card is refused");
}

/// The engine may move its endpoint to the progress thread.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<weft_verbs::Endpoint>();
};

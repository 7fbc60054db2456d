//! Tests of the transport: two endpoints in one process first, then across
//! processes (the test binary re-executes itself in a child role).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::*;
use crate::test_child::{child_role, spawn_child};

fn test_name(test: &str) -> String {
    format!("/weft-test-{}-inbox-{test}", std::process::id())
}

/// Unlinks a segment name on drop (for segments a child may leave behind).
struct UnlinkOnDrop(String);

impl Drop for UnlinkOnDrop {
    fn drop(&mut self) {
        let _ = crate::unlink(&self.0);
    }
}

const POOL_BYTES: usize = 1 << 16;

/// Pseudo-random bytes that frame payloads are cut from.
fn pool() -> &'static [u8] {
    static POOL: OnceLock<Vec<u8>> = OnceLock::new();
    POOL.get_or_init(|| {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        (0..POOL_BYTES + (1 << 20))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    })
}

/// The two parts of frame `seq` of `sender` with `len` bytes: its first up
/// to 8 bytes are `seq` and `sender`, the rest is cut from the pool at an
/// offset that depends on both.
fn frame_parts(sender: u32, seq: u64, len: usize) -> ([u8; 8], usize, &'static [u8]) {
    let mut head = [0u8; 8];
    head[..4].copy_from_slice(&(seq as u32).to_le_bytes());
    head[4..].copy_from_slice(&sender.to_le_bytes());
    let head_len = len.min(8);
    let off = (seq.wrapping_mul(2_654_435_761) ^ (u64::from(sender) * 977)) as usize % POOL_BYTES;
    (head, head_len, &pool()[off..off + (len - head_len)])
}

/// Whether `bytes` is exactly frame `seq` of `sender` with `len` bytes.
fn frame_ok(sender: u32, seq: u64, len: usize, bytes: &[u8]) -> bool {
    let (head, head_len, rest) = frame_parts(sender, seq, len);
    bytes.len() == len && bytes[..head_len] == head[..head_len] && &bytes[head_len..] == rest
}

/// Sends frame `seq` of `sender`, retrying while there is no room.
fn send_frame(out: &mut Outbox, seq: u64, len: usize) {
    let (head, head_len, rest) = frame_parts(out.sender_id(), seq, len);
    let mut backoff = Backoff::default();
    while !out.try_send(&head[..head_len], rest) {
        backoff.snooze();
    }
}

/// Spin a little, then yield: the tests share two cores with each other.
#[derive(Default)]
struct Backoff(u32);

impl Backoff {
    fn snooze(&mut self) {
        self.0 += 1;
        if self.0 < 64 {
            core::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    fn reset(&mut self) {
        self.0 = 0;
    }
}

/// Checks frames per sender: in order, intact.
struct Checker {
    next: HashMap<u32, u64>,
    len_of: fn(u64) -> usize,
    total: u64,
}

impl Checker {
    fn new(len_of: fn(u64) -> usize) -> Checker {
        Checker {
            next: HashMap::new(),
            len_of,
            total: 0,
        }
    }
    fn check(&mut self, sender: u32, bytes: &[u8]) {
        let seq = self.next.entry(sender).or_insert(0);
        let len = (self.len_of)(*seq);
        assert!(
            frame_ok(sender, *seq, len, bytes),
            "sender {sender}: frame {seq} (expected {len} bytes) arrived as {} bytes {:02x?}",
            bytes.len(),
            &bytes[..bytes.len().min(16)]
        );
        *seq += 1;
        self.total += 1;
    }
    /// Polls until `total` frames arrived, or panics after `timeout`.
    fn drain_until(&mut self, inbox: &mut Inbox, total: u64, timeout: Duration) {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        while self.total < total {
            if inbox.poll(&mut |s, b| self.check(s, b)) == 0 {
                backoff.snooze();
                assert!(
                    start.elapsed() < timeout,
                    "only {} of {total} frames arrived within {timeout:?}",
                    self.total
                );
            } else {
                backoff.reset();
            }
        }
    }
}

/// Sends `frames` frames from each outbox (one thread each) and checks in
/// the calling thread that all arrive intact, in per-sender order.
fn stream(inbox: &mut Inbox, outboxes: Vec<Outbox>, frames: u64, len_of: fn(u64) -> usize) {
    let senders = outboxes.len() as u64;
    let mut checker = Checker::new(len_of);
    std::thread::scope(|s| {
        for mut out in outboxes {
            s.spawn(move || {
                for seq in 0..frames {
                    send_frame(&mut out, seq, len_of(seq));
                }
            });
        }
        checker.drain_until(inbox, frames * senders, Duration::from_secs(300));
    });
    assert_eq!(inbox.poll(&mut |_, _| panic!("extra frame")), 0);
    assert_eq!(checker.next.len() as u64, senders);
    assert!(checker.next.values().all(|&n| n == frames));
}

fn queue_only(slots: u32) -> InboxConfig {
    InboxConfig {
        fastbox_peers: 0,
        queue_slots: slots,
        ..InboxConfig::default()
    }
}

fn small_fastbox() -> InboxConfig {
    InboxConfig {
        fastbox_bytes: 4096,
        ..InboxConfig::default()
    }
}

#[test]
fn fastbox_frames_of_every_size_arrive_intact_in_order() {
    let mut inbox = Inbox::create(&test_name("fb-every-size"), &InboxConfig::default()).unwrap();
    let out = Outbox::connect(inbox.name(), 5).unwrap();
    assert!(out.uses_fastbox());
    assert_eq!(out.max_frame(), 16384);
    // Every size 0..=16384, twice (the 64 KiB ring wraps ~8000 times).
    stream(&mut inbox, vec![out], 2 * 16385, |seq| {
        (seq % 16385) as usize
    });
}

#[test]
fn fastbox_millions_of_frames_wrap_around() {
    let mut inbox = Inbox::create(&test_name("fb-millions"), &small_fastbox()).unwrap();
    let out = Outbox::connect(inbox.name(), 0).unwrap();
    assert!(out.uses_fastbox());
    assert_eq!(out.max_frame(), 1024);
    // Every size 0..=1024 about 2000 times; the 64-slot ring wraps ~500k times.
    stream(&mut inbox, vec![out], 2_000_000, |seq| {
        (seq.wrapping_mul(7919) % 1025) as usize
    });
}

#[test]
fn queue_frames_of_every_size_arrive_intact_in_order() {
    let mut inbox = Inbox::create(&test_name("q-every-size"), &queue_only(64)).unwrap();
    let out = Outbox::connect(inbox.name(), 3).unwrap();
    assert!(!out.uses_fastbox());
    assert_eq!(out.max_frame(), 1024 - 16);
    stream(&mut inbox, vec![out], 1_000_000, |seq| {
        (seq % 1009) as usize
    });
}

#[test]
fn queue_many_producers_keep_per_sender_fifo() {
    let mut inbox = Inbox::create(&test_name("q-8-producers"), &queue_only(256)).unwrap();
    let outs: Vec<Outbox> = (0..8)
        .map(|s| Outbox::connect(inbox.name(), s * 1000 + 1).unwrap())
        .collect();
    assert!(outs.iter().all(|o| !o.uses_fastbox()));
    stream(&mut inbox, outs, 100_000, |seq| (seq % 300) as usize);
}

#[test]
fn more_senders_than_fastboxes_fall_back_to_the_queue() {
    let cfg = InboxConfig {
        fastbox_peers: 2,
        ..small_fastbox()
    };
    let mut inbox = Inbox::create(&test_name("fallback"), &cfg).unwrap();
    let outs: Vec<Outbox> = (10..15)
        .map(|s| Outbox::connect(inbox.name(), s).unwrap())
        .collect();
    let fast: Vec<bool> = outs.iter().map(Outbox::uses_fastbox).collect();
    assert_eq!(fast, [true, true, false, false, false]);
    assert_eq!(outs[0].max_frame(), 1024);
    assert_eq!(outs[4].max_frame(), 1008);
    stream(&mut inbox, outs, 20_000, |seq| (seq % 1009) as usize);
}

#[test]
fn full_fastbox_refuses_then_recovers() {
    let mut inbox = Inbox::create(&test_name("fb-full"), &small_fastbox()).unwrap();
    let mut out = Outbox::connect(inbox.name(), 1).unwrap();
    let mut sent = 0u64;
    while out.try_send(&sent.to_le_bytes(), &[]) {
        sent += 1;
    }
    // 64 slots of one 8-byte frame each, one slot kept free.
    assert_eq!(sent, 63);
    assert!(!out.try_send(&[], &[]), "a full ring took a frame");
    let mut got = Vec::new();
    assert_eq!(
        inbox.poll(&mut |s, b| {
            assert_eq!(s, 1);
            got.push(u64::from_le_bytes(b.try_into().unwrap()));
        }),
        63
    );
    assert_eq!(got, (0..63).collect::<Vec<_>>());
    assert!(out.try_send(&[7; 8], &[]));
    assert_eq!(inbox.poll(&mut |_, b| assert_eq!(b, [7; 8])), 1);
}

#[test]
fn full_queue_refuses_then_recovers() {
    let mut inbox = Inbox::create(&test_name("q-full"), &queue_only(4)).unwrap();
    let mut a = Outbox::connect(inbox.name(), 1).unwrap();
    let mut b = Outbox::connect(inbox.name(), 2).unwrap();
    assert!(a.try_send(b"a0", &[]) && b.try_send(b"b0", &[]));
    assert!(a.try_send(b"a1", &[]) && b.try_send(b"b1", &[]));
    assert!(!a.try_send(b"a2", &[]) && !b.try_send(b"b2", &[]));
    let mut got = Vec::new();
    assert_eq!(inbox.poll(&mut |s, f| got.push((s, f.to_vec()))), 4);
    assert_eq!(
        got,
        [
            (1, b"a0".to_vec()),
            (2, b"b0".to_vec()),
            (1, b"a1".to_vec()),
            (2, b"b1".to_vec())
        ]
    );
    assert!(b.try_send(b"b2", &[]));
    assert_eq!(
        inbox.poll(&mut |s, f| assert_eq!((s, f), (2, &b"b2"[..]))),
        1
    );
    assert_eq!(inbox.poll(&mut |_, _| panic!("extra frame")), 0);
}

#[test]
fn reconnect_and_duplicate_senders() {
    let mut inbox = Inbox::create(&test_name("reconnect"), &small_fastbox()).unwrap();
    let mut checker = Checker::new(|_| 20);
    let mut a = Outbox::connect(inbox.name(), 3).unwrap();
    assert!(a.uses_fastbox());
    // A second live handle of the same sender must not share the ring.
    let b = Outbox::connect(inbox.name(), 3).unwrap();
    assert!(!b.uses_fastbox());
    drop(b);
    for seq in 0..40 {
        send_frame(&mut a, seq, 20);
    }
    checker.drain_until(&mut inbox, 40, Duration::from_secs(10));
    drop(a);
    // Reattach: the same fastbox, resumed where `a` stopped.
    let mut c = Outbox::connect(inbox.name(), 3).unwrap();
    assert!(c.uses_fastbox());
    for seq in 40..300 {
        send_frame(&mut c, seq, 20);
        if seq % 50 == 0 {
            inbox.poll(&mut |s, b| checker.check(s, b));
        }
    }
    checker.drain_until(&mut inbox, 300, Duration::from_secs(10));
    // Another sender gets the next fastbox.
    let d = Outbox::connect(inbox.name(), 4).unwrap();
    assert!(d.uses_fastbox());
    assert_eq!(
        inbox.parts.header().fastbox_claimed.load(Ordering::Relaxed),
        2
    );
}

#[test]
fn connect_errors_are_clear() {
    let missing = test_name("missing");
    match Outbox::connect(&missing, 0) {
        Err(e @ ShmError::NoSuchInbox { .. }) => assert!(e.to_string().contains(&missing)),
        other => panic!("expected NoSuchInbox, got {other:?}"),
    }

    let store_name = test_name("a-datastore");
    let _store = crate::StoreWriter::create(&store_name, 1 << 16, 64).unwrap();
    match Outbox::connect(&store_name, 0) {
        Err(ShmError::Segment(SegmentError::WrongKind {
            found: 1,
            expected: 2,
            ..
        })) => {}
        other => panic!("expected WrongKind, got {other:?}"),
    }

    let inbox = Inbox::create(&test_name("bad-version"), &InboxConfig::default()).unwrap();
    inbox
        .seg
        .header()
        .layout_version
        .store(crate::layout::LAYOUT_VERSION + 7, Ordering::Relaxed);
    match Outbox::connect(inbox.name(), 0) {
        Err(e @ ShmError::Segment(SegmentError::LayoutVersion { .. })) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&format!(
                    "layout version {}",
                    crate::layout::LAYOUT_VERSION + 7
                )),
                "{msg}"
            );
        }
        other => panic!("expected LayoutVersion, got {other:?}"),
    }

    let inbox = Inbox::create(&test_name("bad-geometry"), &InboxConfig::default()).unwrap();
    inbox
        .parts
        .header()
        .fastbox_bytes
        .store(1 << 20, Ordering::Relaxed);
    match Outbox::connect(inbox.name(), 0) {
        Err(e @ ShmError::LayoutMismatch { .. }) => {
            assert!(e.to_string().contains("inconsistent layout"), "{e}")
        }
        other => panic!("expected LayoutMismatch, got {other:?}"),
    }

    let inbox = Inbox::create(&test_name("bad-sender"), &InboxConfig::default()).unwrap();
    assert!(matches!(
        Outbox::connect(inbox.name(), 1 << 24),
        Err(ShmError::BadSenderId { .. })
    ));
    assert!(matches!(
        Inbox::create(inbox.name(), &InboxConfig::default()),
        Err(ShmError::Segment(SegmentError::Create { .. }))
    ));
    let bad_cfg = InboxConfig {
        fastbox_bytes: 5000,
        ..InboxConfig::default()
    };
    assert!(matches!(
        Inbox::create(&test_name("bad-cfg"), &bad_cfg),
        Err(ShmError::InvalidConfig { .. })
    ));

    // Dropping the inbox removes it.
    let name = inbox.name().to_owned();
    drop(inbox);
    assert!(matches!(
        Outbox::connect(&name, 0),
        Err(ShmError::NoSuchInbox { .. })
    ));
}

#[test]
fn queue_slot_of_a_dead_sender_is_recycled() {
    let mut inbox = Inbox::create(&test_name("q-recycle"), &queue_only(8)).unwrap();
    // Ticket 0 reserved by sender 41, which never publishes it.
    inbox.queue.reserve_for_test(0, 41);
    // Sender 41 is alive (holds its lock) while this handle lives.
    let alive = Outbox::connect(inbox.name(), 41).unwrap();
    let mut out = Outbox::connect(inbox.name(), 1).unwrap();
    for seq in 0..3 {
        send_frame(&mut out, seq, 10);
    }
    let mut checker = Checker::new(|_| 10);
    for _ in 0..3 * STALL_CHECK_POLLS {
        assert_eq!(inbox.poll(&mut |s, b| checker.check(s, b)), 0);
    }
    assert_eq!(inbox.recycled, 0, "recycled the slot of a live sender");
    // Sender 41 goes away without publishing: the slot is recycled within
    // one check period.
    drop(alive);
    for _ in 0..STALL_CHECK_POLLS {
        inbox.poll(&mut |s, b| checker.check(s, b));
    }
    assert_eq!(inbox.recycled, 1);
    assert_eq!(checker.total, 3);
    // A producer that died before moving the enqueue hint past its ticket:
    // once its slot is recycled, the next sender must not get stuck on it.
    checker.drain_until(&mut inbox, 3, Duration::from_secs(10));
    let hint = inbox.queue_head;
    inbox.queue.reserve_for_test(hint, 42);
    for _ in 0..STALL_CHECK_POLLS {
        assert_eq!(inbox.poll(&mut |s, b| checker.check(s, b)), 0);
    }
    assert_eq!(inbox.recycled, 2);
    // The queue keeps working past the lap.
    for seq in 3..40 {
        send_frame(&mut out, seq, 10);
        inbox.poll(&mut |s, b| checker.check(s, b));
    }
    checker.drain_until(&mut inbox, 40, Duration::from_secs(10));
}

// ----------------------------------------------------------------------------
// Across processes
// ----------------------------------------------------------------------------

const ENV_A: &str = "WEFT_SHM_TEST_INBOX_A";
const ENV_B: &str = "WEFT_SHM_TEST_INBOX_B";
const PINGPONG_ROUNDS: u64 = 100_000;

/// Connects, retrying while the inbox is not there or not published yet.
fn connect_retry(name: &str, sender_id: u32, timeout: Duration) -> Outbox {
    let start = Instant::now();
    loop {
        match Outbox::connect(name, sender_id) {
            Ok(out) => return out,
            Err(e) if start.elapsed() > timeout => panic!("cannot connect to {name}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Waits for one frame and returns its first 8 bytes as a u64.
fn recv_u64(inbox: &mut Inbox, from: u32) -> u64 {
    let mut got = None;
    let mut backoff = Backoff::default();
    let start = Instant::now();
    while got.is_none() {
        if inbox.poll(&mut |s, b| {
            assert_eq!(s, from);
            assert!(got.is_none(), "more than one frame in flight");
            got = Some(u64::from_le_bytes(b.try_into().unwrap()));
        }) == 0
        {
            backoff.snooze();
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "peer went silent"
            );
        }
    }
    got.unwrap()
}

#[test]
fn cross_process_pingpong() {
    if child_role() == Some("pingpong") {
        let a = std::env::var(ENV_A).unwrap();
        let b = std::env::var(ENV_B).unwrap();
        let mut inbox = Inbox::create_for(&b, &with_lines(), 1).unwrap();
        let mut out = connect_retry(&a, 1, Duration::from_secs(20));
        assert!(out.uses_fastbox());
        assert!(inbox.pair_host().pair(&mut out), "no pair line");
        for i in 0..PINGPONG_ROUNDS {
            let v = recv_u64(&mut inbox, 0);
            assert_eq!(v, i, "child got frame {v}, expected {i}");
            assert!(out.try_send(&(v + 1).to_le_bytes(), &[]));
        }
        return;
    }
    let a = test_name("pp-a");
    let b = test_name("pp-b");
    let _cleanup = UnlinkOnDrop(b.clone());
    let mut inbox = Inbox::create_for(&a, &with_lines(), 0).unwrap();
    let mut child = spawn_child(
        "inbox::tests::cross_process_pingpong",
        "pingpong",
        &[(ENV_A, a.clone()), (ENV_B, b.clone())],
        false,
    );
    let mut out = connect_retry(&b, 0, Duration::from_secs(20));
    assert!(out.uses_fastbox());
    assert!(inbox.pair_host().pair(&mut out), "no pair line");
    assert!(out.uses_pair_line());
    let start = Instant::now();
    // Our half of the line (in our inbox, at the child's index): its sequence
    // number moves with every frame that goes through the line.
    let mut by_line = 0;
    for i in 0..PINGPONG_ROUNDS {
        let before = pair_line(&inbox, 1).halves[0].frame.load(Ordering::Relaxed);
        assert!(out.try_send(&i.to_le_bytes(), &[]));
        if pair_line(&inbox, 1).halves[0].frame.load(Ordering::Relaxed) != before {
            by_line += 1;
        }
        let v = recv_u64(&mut inbox, 1);
        assert_eq!(v, i + 1, "parent got {v}, expected {}", i + 1);
    }
    let elapsed = start.elapsed();
    let status = child.wait(Duration::from_secs(60));
    assert!(status.success(), "ping-pong child failed: {status}");
    // Only the first frames, before the child listened, took the ring.
    assert!(
        by_line >= PINGPONG_ROUNDS - 2,
        "{by_line} of {PINGPONG_ROUNDS} frames by the pair line"
    );
    println!(
        "cross-process ping-pong: {PINGPONG_ROUNDS} round trips, {:.3} us one way (unoptimised build)",
        elapsed.as_secs_f64() * 1e6 / (2 * PINGPONG_ROUNDS) as f64
    );
}

const DEAD_SENDER: u32 = 7;

fn dead_sender_len(seq: u64) -> usize {
    (seq.wrapping_mul(7919) % 1009) as usize
}

/// Child role: stream frames to inbox A forever (until killed).
fn run_dead_sender_child() {
    let a = std::env::var(ENV_A).unwrap();
    let mut out = connect_retry(&a, DEAD_SENDER, Duration::from_secs(20));
    let start = Instant::now();
    for seq in 0.. {
        send_frame(&mut out, seq, dead_sender_len(seq));
        // Never outlive a parent that forgot us.
        if seq % 1024 == 0 && start.elapsed() > Duration::from_secs(120) {
            std::process::exit(5);
        }
    }
}

/// Kills a sender mid-stream, then checks that everything it published
/// arrived intact and in order, and that a successor with the same sender id
/// carries on through the same inbox.
fn dead_sender_case(test_path: &str, tag: &str, cfg: &InboxConfig, expect_fastbox: bool) {
    let a = test_name(tag);
    let mut inbox = Inbox::create(&a, cfg).unwrap();
    let mut child = spawn_child(test_path, "dead-sender", &[(ENV_A, a.clone())], false);
    let mut checker = Checker::new(dead_sender_len);
    checker.drain_until(&mut inbox, 20_000, Duration::from_secs(60));
    let mut killed_mid_slot = false;
    if !expect_fastbox {
        // Aim the kill at the window between reserving a queue slot and
        // publishing it: stop the child, and kill it if it stopped there.
        let pid = child.id() as i32;
        for attempt in 0..2000u32 {
            // Keep the child busy sending for a varying while.
            let until = Instant::now() + Duration::from_micros(u64::from(attempt % 97) * 3);
            while Instant::now() < until {
                inbox.poll(&mut |s, b| checker.check(s, b));
            }
            // SAFETY: plain kill(2) on our own child, which is not reaped yet.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            std::thread::sleep(Duration::from_micros(200));
            while inbox.poll(&mut |s, b| checker.check(s, b)) > 0 {}
            if inbox.queue.busy_owner(inbox.queue_head) == Some(DEAD_SENDER) {
                killed_mid_slot = true;
                break;
            }
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    }
    child.kill();
    // Everything published before the kill is in the inbox now.
    let mut idle = 0;
    while idle < 3 * STALL_CHECK_POLLS {
        if inbox.poll(&mut |s, b| checker.check(s, b)) == 0 {
            idle += 1;
        } else {
            idle = 0;
        }
    }
    let delivered = checker.total;
    assert!(delivered >= 20_000);
    let mut out = Outbox::connect(&a, DEAD_SENDER).unwrap();
    assert_eq!(out.uses_fastbox(), expect_fastbox);
    for seq in delivered..delivered + 5000 {
        send_frame(&mut out, seq, dead_sender_len(seq));
        inbox.poll(&mut |s, b| checker.check(s, b));
    }
    checker.drain_until(&mut inbox, delivered + 5000, Duration::from_secs(30));
    assert_eq!(inbox.poll(&mut |_, _| panic!("extra frame")), 0);
    println!(
        "{tag}: {delivered} frames before the kill, {} queue slot(s) recycled",
        inbox.recycled
    );
    assert_eq!(inbox.recycled, u64::from(killed_mid_slot));
}

#[test]
fn dead_fastbox_sender_leaves_the_inbox_consistent() {
    if child_role() == Some("dead-sender") {
        return run_dead_sender_child();
    }
    dead_sender_case(
        "inbox::tests::dead_fastbox_sender_leaves_the_inbox_consistent",
        "dead-fb",
        &small_fastbox(),
        true,
    );
}

#[test]
fn dead_queue_sender_leaves_the_inbox_consistent() {
    if child_role() == Some("dead-sender") {
        return run_dead_sender_child();
    }
    dead_sender_case(
        "inbox::tests::dead_queue_sender_leaves_the_inbox_consistent",
        "dead-q",
        &queue_only(16),
        false,
    );
}

/// The pair line at `index` of `inbox`'s table.
fn pair_line(inbox: &Inbox, index: usize) -> &crate::layout::PairLine {
    let g = inbox.parts.geometry;
    assert!(index < inbox.parts.cfg.pair_lines as usize);
    // SAFETY: inside the mapping the inbox owns (geometry), 64-byte aligned;
    // only atomics are read through it.
    unsafe {
        &*inbox
            .parts
            .base
            .add(g.pair_offset + index * crate::layout::PAIR_LINE_BYTES)
            .cast::<crate::layout::PairLine>()
    }
}

/// The default geometry with pair lines.
fn with_lines() -> InboxConfig {
    InboxConfig {
        pair_lines: 256,
        ..InboxConfig::default()
    }
}

/// Lengths that mix pair-line frames (up to 24 bytes) with ring frames.
fn mixed_len(seq: u64) -> usize {
    match seq % 11 {
        0 => 200,
        4 => 25,
        7 => 3000,
        _ => (seq % 25) as usize,
    }
}

/// Two paired endpoints stream to each other at once, in frames of mixed
/// sizes: every frame arrives intact, in order, and the small ones used the
/// line in both directions.
#[test]
fn pair_lines_carry_small_frames_in_order_both_ways() {
    const FRAMES: u64 = 200_000;
    let names = [test_name("pair-0"), test_name("pair-1")];
    let cfg = with_lines();
    let mut inboxes: Vec<Inbox> = (0..2)
        .map(|i| Inbox::create_for(&names[i], &cfg, i as u32).unwrap())
        .collect();
    let mut outs: Vec<Outbox> = (0..2)
        .map(|i| Outbox::connect(&names[1 - i], i as u32).unwrap())
        .collect();
    for (inbox, out) in inboxes.iter().zip(outs.iter_mut()) {
        assert!(inbox.pair_host().pair(out));
        assert!(out.uses_pair_line());
        assert!(!inbox.pair_host().pair(out), "paired twice");
    }
    std::thread::scope(|s| {
        for (inbox, mut out) in inboxes.iter_mut().zip(outs.drain(..)) {
            s.spawn(move || {
                let mut checker = Checker::new(mixed_len);
                let mut seq = 0;
                let start = Instant::now();
                while seq < FRAMES || checker.total < FRAMES {
                    if seq < FRAMES {
                        let len = mixed_len(seq);
                        let (head, head_len, rest) = frame_parts(out.sender_id(), seq, len);
                        if out.try_send(&head[..head_len], rest) {
                            seq += 1;
                        }
                    }
                    inbox.poll(&mut |s, b| checker.check(s, b));
                    assert!(start.elapsed() < Duration::from_secs(300), "stuck");
                }
                assert_eq!(inbox.poll(&mut |_, _| panic!("extra frame")), 0);
            });
        }
    });
    let line = pair_line(&inboxes[0], 1);
    for (side, half) in line.halves.iter().enumerate() {
        let ack = half.ack.load(Ordering::Acquire);
        assert_ne!(
            ack & crate::layout::PAIR_LISTENING,
            0,
            "side {side} not listening"
        );
        assert_ne!(
            half.frame.load(Ordering::Acquire),
            0,
            "side {side} never used the line"
        );
    }
}

/// No line without owner ids, with the lines turned off, or for a sender id
/// beyond the table; such pairs still talk through the rings.
#[test]
fn pair_lines_need_owner_ids_and_room() {
    let cases: [(&str, u32, u32, u32); 3] = [
        ("noowner", crate::layout::NO_OWNER, 256, 1),
        ("off", 0, 0, 1),
        ("beyond", 0, 4, 9),
    ];
    for (tag, owner, lines, sender) in cases {
        let cfg = InboxConfig {
            pair_lines: lines,
            ..InboxConfig::default()
        };
        let name = test_name(&format!("nopair-{tag}"));
        let mut inbox = Inbox::create_for(&name, &cfg, owner).unwrap();
        let other = test_name(&format!("nopair-{tag}-other"));
        let mine = Inbox::create_for(&other, &cfg, sender).unwrap();
        let mut out = Outbox::connect(&name, sender).unwrap();
        assert!(!mine.pair_host().pair(&mut out), "{tag}: paired");
        assert!(!out.uses_pair_line(), "{tag}");
        assert!(out.try_send(&[7; 8], &[]));
        let mut got = Vec::new();
        inbox.poll(&mut |s, b| got.push((s, b.to_vec())));
        assert_eq!(got, [(sender, vec![7; 8])], "{tag}");
    }
}

/// Hostile input: an inbox segment corrupted at random (fastbox control words, headers
/// and data, queue slot states and lengths, the header) after senders queued frames.
/// The consumer must not panic nor hang, and hands out no frame longer than its limits.
#[test]
fn fuzz_consumer_of_corrupted_segments() {
    let cfg = InboxConfig {
        fastbox_peers: 2,
        fastbox_bytes: 4096,
        queue_slots: 8,
        queue_slot_bytes: 256,
        pair_lines: 0,
    };
    let limit = cfg.fastbox_max_frame().max(cfg.queue_slot_bytes as usize);
    let mut round = 0u64;
    let (mut delivered, mut polls) = (0u64, 0u64);
    weft_fuzz::run("inbox-consumer", 5, |m| {
        round += 1;
        let name = test_name(&format!("fuzz{}", round % 4));
        let _ = crate::unlink(&name);
        let _gone = UnlinkOnDrop(name.clone());
        let mut inbox = Inbox::create(&name, &cfg).unwrap();
        // Senders 0 and 1 get fastboxes, 2 and 3 the queue.
        let mut outs: Vec<Outbox> = (0..4)
            .map(|id| Outbox::connect(&name, id).unwrap())
            .collect();
        for seq in 0..m.below(12) as u64 {
            let k = m.below(4);
            let len = m.below(200);
            let (head, head_len, rest) = frame_parts(k as u32, seq, len);
            let _ = outs[k].try_send(&head[..head_len], rest);
        }
        let fd = rustix::shm::open(
            name.as_str(),
            rustix::shm::OFlags::RDWR,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let file = std::fs::File::from(fd);
        // SAFETY: a second mapping of a segment this test made; only this thread
        // touches either mapping while the inbox is polled below.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&file) }.unwrap();
        let len = map.len();
        m.corrupt(&mut map, len, 6);
        for _ in 0..4 {
            polls += 1;
            delivered += inbox.poll(&mut |_, bytes| {
                assert!(bytes.len() <= limit, "a frame of {} bytes", bytes.len())
            }) as u64;
        }
    });
    println!("fuzz inbox-consumer: {delivered} frames delivered in {polls} polls");
}

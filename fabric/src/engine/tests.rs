//! Tests of the engine: frame headers, hostile frames from a peer, stale control frames.

use super::wire::{short_header, Hdr, CMA_WRITE, EAGER, FIN, RTS, RTS_RDMA, SHORT};
use super::*;
use proptest::prelude::*;

/// The engine of rank 0 of 2 (no inbox of its own, rank 1 reached by `resolve`).
fn rank0(
    eager_limit: usize,
    single_copy: SingleCopy,
    cma_split: usize,
    resolve: Resolver,
) -> Engine {
    let cfg = Config {
        eager_limit,
        single_copy,
        keep_registrations: false,
        cma_split,
        tcp_eager_limit: eager_limit,
    };
    Engine::new(
        0,
        2,
        None,
        vec![0, 1],
        cfg,
        resolve,
        Box::new(|_| None),
        None,
        None,
    )
}

/// A FIN that names a send's slot with another generation (a late frame for an
/// earlier request of that slot) does not complete the send now in it.
#[test]
fn a_stale_fin_does_not_complete_a_reused_request() {
    let name = format!("/weft-test-{}-engine-stale", std::process::id());
    let _ = weft_shm::unlink(&name);
    let _inbox = weft_shm::Inbox::create(&name, &weft_shm::InboxConfig::default()).expect("inbox");
    let n = name.clone();
    let resolve: Resolver = Box::new(move |_| match weft_shm::Outbox::connect(&n, 0) {
        Ok(o) => Resolved::Shm(Box::new(o)),
        Err(e) => Resolved::Unreachable(e.to_string()),
    });
    let mut e = rank0(64, SingleCopy::None, 0, resolve);
    let big = vec![7u8; 4096];
    let fin = |aux| {
        let h = Hdr {
            kind: FIN,
            src: 1,
            ctx: 0,
            tag: 3,
            aux,
            len: 0,
        };
        h.encode().to_vec()
    };
    let first = e
        .send(big.as_ptr(), big.len(), 1, 5, 3)
        .unwrap()
        .expect("a rendezvous");
    let old = e.st.wire_id(first);
    e.st.on_frame_from(1, &fin(old));
    assert!(matches!(e.take(first), Some(Ok(_))));
    // The next send takes the same slot; the first send's FIN comes again, late.
    let second = e
        .send(big.as_ptr(), big.len(), 1, 5, 3)
        .unwrap()
        .expect("a rendezvous");
    assert_eq!(second, first, "the slot is reused");
    e.st.on_frame_from(1, &fin(old));
    assert!(
        e.take(second).is_none(),
        "a stale FIN completed the send in its slot"
    );
    e.st.on_frame_from(1, &fin(e.st.wire_id(second)));
    assert!(
        matches!(e.take(second), Some(Ok(_))),
        "its own FIN must complete it"
    );
    drop(e);
    let _ = weft_shm::unlink(&name);
}

/// Found by the fuzz below: a CMA_WRITE of 32 to 39 bytes read its serial past the
/// payload's end (a panic); it is dropped like any short frame now.
#[test]
fn a_short_cma_write_is_dropped() {
    let resolve: Resolver = Box::new(|_| Resolved::Unreachable("none".into()));
    let mut e = rank0(256, SingleCopy::Cma, 0, resolve);
    for len in [0, 31, 32, 34, 39] {
        let h = Hdr {
            kind: CMA_WRITE,
            src: 1,
            ctx: 0,
            tag: 0,
            aux: 0,
            len: 0,
        };
        let mut f = h.encode().to_vec();
        f.extend(std::iter::repeat_n(0xee, len));
        e.st.on_frame_from(1, &f);
    }
    assert_eq!(e.backlog(), 0);
}

/// Hostile input: frames of every kind from a peer with random headers and payloads
/// (lengths that lie, unknown request ids, wrong contexts, rendezvous offers naming
/// our own memory or a process that does not exist), interleaved with posted
/// receives, eager sends to that peer, progress, takes and cancels. No panic, and no
/// completed receive reports more bytes than its buffer holds.
#[test]
fn fuzz_hostile_frames_from_a_peer() {
    use weft_fuzz::{run, Mutator};
    use weft_shm::{Inbox, InboxConfig, Outbox};
    const CTX: u64 = 7;
    let name = format!("/weft-test-{}-engine-fuzz", std::process::id());
    let _ = weft_shm::unlink(&name);
    // Rank 1's inbox: what the engine sends it piles up there, unread.
    let _peer_inbox = Inbox::create(
        &name,
        &InboxConfig {
            fastbox_bytes: 4096,
            queue_slots: 8,
            ..InboxConfig::default()
        },
    )
    .expect("inbox");
    let engine = |m: &mut Mutator| {
        let n = name.clone();
        let resolve: Resolver = Box::new(move |r| match r {
            1 => match Outbox::connect(&n, 0) {
                Ok(o) => Resolved::Shm(Box::new(o)),
                Err(e) => Resolved::Unreachable(e.to_string()),
            },
            _ => Resolved::Unreachable("no such peer".into()),
        });
        let copy = [SingleCopy::Cma, SingleCopy::None][m.below(2)];
        rank0(256, copy, [0, 64, 1 << 16][m.below(3)], resolve)
    };
    let pid = std::process::id() as i32;
    let mut m0 = Mutator::new(9);
    let mut e = engine(&mut m0);
    // Receive buffers outlive the engine that may write into them.
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    let mut ids: Vec<(u32, usize)> = Vec::new();
    let (mut frames, mut completed) = (0u64, 0u64);
    run("engine-frames", 6, |m| {
        if m.below(500) == 0 {
            e = engine(m);
            ids.clear();
            bufs.clear();
        }
        match m.below(12) {
            0..=2 => {
                let cap = [0, 1, 8, 64, 300, 70_000][m.below(6)];
                bufs.push(vec![0u8; cap]);
                let b = bufs.last_mut().expect("just pushed");
                let src = [Some(1), None, Some(0)][m.below(3)];
                let tag = [Some(m.below(4) as u32), None][m.below(2)];
                let ctx = if m.below(8) == 0 { m.next_u64() } else { CTX };
                let id = e.recv(b.as_mut_ptr(), cap, ctx, src, tag);
                ids.push((id, cap));
            }
            3..=7 => {
                let kind = match m.below(12) {
                    k @ 0..=9 => k as u8,
                    _ => m.next_u64() as u8,
                };
                let src = if m.below(10) == 0 {
                    m.below(4) as u32
                } else {
                    1
                };
                let ctx = if m.below(8) == 0 { m.next_u64() } else { CTX };
                let aux = if m.below(4) == 0 {
                    m.next_u64() as u32
                } else {
                    m.below(8) as u32
                };
                let mut payload: Vec<u8> = (0..m.below(120)).map(|_| m.next_u64() as u8).collect();
                let len = match m.below(4) {
                    0 => payload.len() as u64,
                    1 => m.below(100_000) as u64,
                    2 => m.next_u64(),
                    _ => m.below(64) as u64,
                };
                // A rendezvous offer names our own memory (the only process it may
                // read) or a pid that cannot exist; a write request never a real one.
                if (kind == RTS || kind == RTS_RDMA) && payload.len() >= 12 {
                    let src_buf = bufs.first().map_or(0, |b| b.as_ptr() as u64);
                    let addr = if m.below(2) == 0 {
                        src_buf
                    } else {
                        m.next_u64()
                    };
                    payload[..8].copy_from_slice(&addr.to_le_bytes());
                    let p = if m.below(2) == 0 { pid } else { i32::MAX };
                    payload[8..12].copy_from_slice(&p.to_le_bytes());
                }
                if kind == CMA_WRITE && payload.len() >= 16 {
                    payload[12..16].copy_from_slice(&i32::MAX.to_le_bytes());
                }
                let frame: Vec<u8> = if kind == SHORT {
                    let mut f = short_header(ctx, m.below(4) as u32).to_vec();
                    f.extend_from_slice(&payload);
                    f
                } else {
                    let h = Hdr {
                        kind,
                        src,
                        ctx,
                        tag: m.below(4) as u32,
                        aux,
                        len,
                    };
                    let mut f = h.encode().to_vec();
                    f.extend_from_slice(&payload);
                    f
                };
                let cut = if m.below(10) == 0 {
                    m.below(frame.len() + 1)
                } else {
                    frame.len()
                };
                frames += 1;
                e.st.on_frame_from(1, &frame[..cut]);
            }
            8 => {
                let out = [1u8; 64];
                let _ = e.send(out.as_ptr(), m.below(64), 1, CTX, m.below(4) as u32);
            }
            9 => {
                e.progress();
            }
            10 if !ids.is_empty() => {
                // A taken request's id is free again: it leaves the list.
                let i = m.below(ids.len());
                let (id, cap) = ids[i];
                if let Some(r) = e.take(id) {
                    ids.swap_remove(i);
                    if let Ok(st) = r {
                        completed += 1;
                        assert!(
                            st.count <= cap,
                            "{} bytes reported in a {cap}-byte buffer",
                            st.count
                        );
                    }
                }
            }
            _ if !ids.is_empty() => {
                let i = m.below(ids.len());
                if e.cancel_recv(ids[i].0) {
                    ids.swap_remove(i);
                }
            }
            _ => {}
        }
    });
    drop(e);
    drop(bufs);
    let _ = weft_shm::unlink(&name);
    println!("fuzz engine-frames: {frames} hostile frames, {completed} receives completed");
}

/// A split single-copy receive leaves its copies to the caller (a wait loop runs them
/// without the engine lock), and, when the sender does not take its half within
/// `SPLIT_TAKEOVER`, the receiver copies that half itself: the data arrives exact.
#[test]
fn a_split_copy_is_left_to_the_caller_and_taken_over_from_a_silent_sender() {
    use weft_shm::{Inbox, InboxConfig, Outbox};
    const CTX: u64 = 9;
    const LEN: usize = 2 << 20;
    let own = format!("/weft-test-{}-engine-split-own", std::process::id());
    let peer = format!("/weft-test-{}-engine-split-peer", std::process::id());
    let _ = weft_shm::unlink(&own);
    let _ = weft_shm::unlink(&peer);
    let inbox = Inbox::create_for(&own, &InboxConfig::default(), 0).expect("own inbox");
    // Rank 1 never reads its inbox: it is a sender that never progresses.
    let _peer_inbox = Inbox::create(&peer, &InboxConfig::default()).expect("peer inbox");
    let p = peer.clone();
    let resolve: Resolver = Box::new(move |_| match Outbox::connect(&p, 0) {
        Ok(o) => Resolved::Shm(Box::new(o)),
        Err(e) => Resolved::Unreachable(e.to_string()),
    });
    let cfg = Config {
        eager_limit: 64,
        single_copy: SingleCopy::Cma,
        keep_registrations: false,
        cma_split: 64 << 10,
        tcp_eager_limit: 64,
    };
    let mut e = Engine::new(
        0,
        2,
        Some(inbox),
        vec![0, 1],
        cfg,
        resolve,
        // Rank 1 is reported gone (its process, this one, lives on).
        Box::new(|r| (r == 1).then(|| "test: reported gone".to_string())),
        None,
        None,
    );
    // CMA works with rank 1 (its "memory" is this process's: the copies read it here).
    e.st.path(1).expect("a path to rank 1");
    e.st.peers[1].cma_ok = true;
    let data: Vec<u8> = (0..LEN).map(|i| (i * 31 % 251) as u8).collect();
    let mut buf = vec![0u8; LEN];
    let id = e.recv(buf.as_mut_ptr(), LEN, CTX, Some(1), Some(4));
    let mut rts = Hdr {
        kind: RTS,
        src: 1,
        ctx: CTX,
        tag: 4,
        aux: 77,
        len: LEN as u64,
    }
    .encode()
    .to_vec();
    rts.extend_from_slice(&(data.as_ptr() as u64).to_le_bytes());
    rts.extend_from_slice(&(std::process::id() as i32).to_le_bytes());
    e.st.on_frame_from(1, &rts);
    // Matched and split, but nothing copied yet: the head read waits for the caller.
    assert!(e.has_copies(), "the head read was done under the engine");
    assert!(buf.iter().all(|&b| b == 0));
    let jobs = e.take_copies();
    assert_eq!(jobs.len(), 1);
    // Taken out: the request is not failed under the running copy, even with its
    // sender reported gone.
    e.fail_if_gone(id);
    assert!(e.take(id).is_none(), "failed while its copy runs");
    let done = jobs.into_iter().map(CopyJob::run).collect();
    e.copies_done(done);
    assert!(e.take(id).is_none(), "complete without the sender's half");
    // Rank 1 never takes its half: after SPLIT_TAKEOVER the receiver does.
    std::thread::sleep(split::SPLIT_TAKEOVER * 2);
    for _ in 0..3 {
        e.progress();
    }
    let st = e.take(id).expect("complete").expect("no error");
    assert_eq!(st.count, LEN);
    assert!(buf == data, "the data arrived changed");
    drop(e);
    let _ = weft_shm::unlink(&own);
    let _ = weft_shm::unlink(&peer);
}

/// What the matching property test does, one step at a time.
#[derive(Debug, Clone)]
enum MatchOp {
    /// Post a receive from `src` (any when `None`) with `tag` (any when `None`), on
    /// context 0 or 1.
    Post {
        ctx: u64,
        src: Option<u32>,
        tag: Option<u32>,
    },
    /// A message from rank `src` arrives with `tag` on context 0 or 1.
    Arrive { ctx: u64, src: u32, tag: u32 },
    /// Cancel the `i`-th receive posted so far (modulo their number).
    Cancel(usize),
    /// Probe for `src`/`tag` on context 0 or 1.
    Probe {
        ctx: u64,
        src: Option<u32>,
        tag: Option<u32>,
    },
}

fn match_op() -> impl Strategy<Value = MatchOp> {
    let src = prop_oneof![Just(None), (1u32..4).prop_map(Some)];
    let tag = prop_oneof![Just(None), (0u32..3).prop_map(Some)];
    let ctx = prop_oneof![4 => Just(0u64), 1 => Just(1u64)];
    prop_oneof![
        3 => (ctx.clone(), src.clone(), tag.clone()).prop_map(|(ctx, src, tag)| MatchOp::Post { ctx, src, tag }),
        3 => (ctx.clone(), 1u32..4, 0u32..3).prop_map(|(ctx, src, tag)| MatchOp::Arrive { ctx, src, tag }),
        1 => any::<usize>().prop_map(MatchOp::Cancel),
        1 => (ctx, src, tag).prop_map(|(ctx, src, tag)| MatchOp::Probe { ctx, src, tag }),
    ]
}

/// The reference: MPI's matching rules written as plainly as possible. A receive takes
/// the earliest-arrived matching message; a message goes to the earliest-posted matching
/// receive; a receive that took nothing can be cancelled; a probe sees the earliest
/// matching message not taken.
#[derive(Default)]
struct MatchModel {
    /// Receives still waiting: (receive number, ctx, src, tag).
    posted: Vec<(usize, u64, Option<u32>, Option<u32>)>,
    /// Messages not taken: (message number, ctx, src, tag).
    unexpected: Vec<(u64, u64, u32, u32)>,
    /// What each receive got: the message number, or `None` if cancelled.
    outcome: std::collections::HashMap<usize, Option<u64>>,
}

impl MatchModel {
    fn fits(want: (u64, Option<u32>, Option<u32>), got: (u64, u32, u32)) -> bool {
        want.0 == got.0 && want.1.is_none_or(|s| s == got.1) && want.2.is_none_or(|t| t == got.2)
    }
    fn post(&mut self, r: usize, ctx: u64, src: Option<u32>, tag: Option<u32>) {
        match self
            .unexpected
            .iter()
            .position(|&(_, c, s, t)| Self::fits((ctx, src, tag), (c, s, t)))
        {
            Some(i) => {
                let (m, ..) = self.unexpected.remove(i);
                self.outcome.insert(r, Some(m));
            }
            None => self.posted.push((r, ctx, src, tag)),
        }
    }
    fn arrive(&mut self, m: u64, ctx: u64, src: u32, tag: u32) {
        match self
            .posted
            .iter()
            .position(|&(_, c, s, t)| Self::fits((c, s, t), (ctx, src, tag)))
        {
            Some(i) => {
                let (r, ..) = self.posted.remove(i);
                self.outcome.insert(r, Some(m));
            }
            None => self.unexpected.push((m, ctx, src, tag)),
        }
    }
    fn cancel(&mut self, r: usize) -> bool {
        match self.posted.iter().position(|&(p, ..)| p == r) {
            Some(i) => {
                self.posted.remove(i);
                self.outcome.insert(r, None);
                true
            }
            None => false,
        }
    }
    fn probe(&self, ctx: u64, src: Option<u32>, tag: Option<u32>) -> Option<(u32, u32)> {
        self.unexpected
            .iter()
            .find(|&&(_, c, s, t)| Self::fits((ctx, src, tag), (c, s, t)))
            .map(|&(_, _, s, t)| (s, t))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Tag matching against the reference model: posted receives against unexpected
    /// messages, wildcards on source and tag, contexts that never match each other, no
    /// overtaking between two ranks, cancellation and probes, in any interleaving.
    #[test]
    fn matching_follows_the_reference_model(ops in proptest::collection::vec(match_op(), 1..60)) {
        let resolve: Resolver = Box::new(|_| Resolved::Unreachable("no transport in this test".into()));
        let cfg = Config {
            eager_limit: 64,
            single_copy: SingleCopy::None,
            keep_registrations: false,
            cma_split: 0,
            tcp_eager_limit: 64,
        };
        let mut e = Engine::new(0, 4, None, vec![0, 1, 2, 3], cfg, resolve, Box::new(|_| None), None, None);
        let mut model = MatchModel::default();
        // Each receive's buffer (8 bytes: the number of the message it got) and engine id.
        let mut bufs: Vec<Box<[u8; 8]>> = Vec::new();
        let mut ids: Vec<u32> = Vec::new();
        let mut next_msg = 1u64;
        for op in &ops {
            match *op {
                MatchOp::Post { ctx, src, tag } => {
                    bufs.push(Box::new([0u8; 8]));
                    let b = bufs.last_mut().expect("just pushed");
                    ids.push(e.recv(b.as_mut_ptr(), 8, ctx, src, tag));
                    model.post(ids.len() - 1, ctx, src, tag);
                }
                MatchOp::Arrive { ctx, src, tag } => {
                    let h = Hdr { kind: EAGER, src, ctx, tag, aux: 0, len: 8 };
                    let mut f = h.encode().to_vec();
                    f.extend_from_slice(&next_msg.to_le_bytes());
                    e.st.on_frame_from(src, &f);
                    model.arrive(next_msg, ctx, src, tag);
                    next_msg += 1;
                }
                MatchOp::Cancel(i) if !ids.is_empty() => {
                    let r = i % ids.len();
                    if model.outcome.contains_key(&r) {
                        continue; // completed or cancelled already: its id may be reused
                    }
                    prop_assert_eq!(e.cancel_recv(ids[r]), model.cancel(r), "cancel of receive {}", r);
                }
                MatchOp::Cancel(_) => {}
                MatchOp::Probe { ctx, src, tag } => {
                    let got = e.iprobe(ctx, src, tag).map(|s| (s.source, s.tag));
                    prop_assert_eq!(got, model.probe(ctx, src, tag), "probe {:?}", op);
                }
            }
        }
        // Every receive the model says got a message has it, with its source and tag;
        // the others are still pending (then cancelled here) or were cancelled.
        for (r, &id) in ids.iter().enumerate() {
            match model.outcome.get(&r) {
                Some(Some(m)) => {
                    let st = e.take(id);
                    prop_assert!(matches!(st, Some(Ok(_))), "receive {} should have completed: {:?}", r, st.is_some());
                    prop_assert_eq!(u64::from_le_bytes(*bufs[r]), *m, "receive {} got the wrong message", r);
                }
                Some(None) => {}
                None => {
                    prop_assert!(e.take(id).is_none(), "receive {} completed with no message for it", r);
                    prop_assert!(e.cancel_recv(id), "receive {} could not be cancelled", r);
                }
            }
        }
    }
}

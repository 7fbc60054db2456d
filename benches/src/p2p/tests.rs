use super::reference::{bw_ratio_size, latency_ratio_size, ratio_comment};
use super::*;
use std::sync::{Arc, Barrier};
use weft_shm::{Inbox, InboxConfig};

fn parse_ok(bench: Bench, args: &[&str]) -> Args {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    parse(bench, &args).unwrap()
}

#[test]
fn round_trip_marks_give_the_one_way_distribution() {
    // 100 round trips of 10 cycles, then one of 1000: 2000 cycles in 4 ms, so a cycle
    // is 2 µs and one way is half a round trip.
    let mut marks = vec![0u64];
    for k in 1..=100 {
        marks.push(k * 10);
    }
    marks.push(2000);
    let d = one_way_of_marks(&marks, 0.004).unwrap();
    assert_eq!(d.min_us, 10.0);
    assert_eq!(d.median_us, 10.0);
    assert_eq!(d.p99_us, 10.0);
    // 98 round trips of 10 cycles and 2 of 1000, in 2980 µs: a cycle is 1 µs, and the
    // two slow ones are the top 2 %.
    let mut marks: Vec<u64> = (0..=98).map(|k| k * 10).collect();
    marks.extend([1980, 2980]);
    let d = one_way_of_marks(&marks, 2980e-6).unwrap();
    assert_eq!((d.min_us, d.median_us), (5.0, 5.0));
    assert!((d.p99_us - 500.0).abs() < 1e-9, "{d:?}");
    assert!(one_way_of_marks(&[5], 1.0).is_none());
    assert!(one_way_of_marks(&[], 1.0).is_none());
    assert!(one_way_of_marks(&[5, 5], 1.0).is_none(), "no time passed");
}

#[test]
fn options_parse() {
    let a = parse_ok(Bench::Bw, &[]);
    assert_eq!((a.iters, a.warmup, a.window), (None, None, 64));
    assert!(!a.no_limit && !a.sweep.json);
    assert_eq!(a.bind_to, Bind::Auto);
    let a = parse_ok(
        Bench::Latency,
        &[
            "--sizes",
            "8,4194304",
            "--json",
            "--iters",
            "50",
            "--warmup",
            "0",
            "--no-limit",
            "--plot",
            "x.svg",
        ],
    );
    assert_eq!(Sweep::new(&a.sweep, vec![]).sizes(), &[8, 4 << 20]);
    assert_eq!((a.iters, a.warmup), (Some(50), Some(0)));
    assert!(a.no_limit && a.sweep.json && a.sweep.plot.is_some());
    let bad = |args: &[&str]| {
        let v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse(Bench::Mr, &v).is_err()
    };
    assert!(bad(&["--iters", "0"]));
    assert!(parse_ok(Bench::Latency, &["--percentiles"]).percentiles);
    let e = parse(Bench::Bw, &["--percentiles".to_string()]).unwrap_err();
    assert!(
        e.to_string()
            .contains("--percentiles is for `weft bench latency`"),
        "{e}"
    );
    assert!(bad(&["--window", "0"]));
    assert!(bad(&["--window", "1025"]));
    assert!(bad(&["--sizes", "8,lots"]));
    assert!(bad(&["--frobnicate"]));
    let e = parse(Bench::Bibw, &["--help".to_owned()]).unwrap_err();
    assert!(e.to_string().contains("weft bench bibw"), "{e}");
}

#[test]
fn default_sweeps_and_iterations_follow_osu() {
    let lat = Bench::Latency.default_sizes();
    assert_eq!((lat[0], lat.last()), (0, Some(&(4 << 20))));
    assert_eq!(Bench::Bw.default_sizes()[0], 1);
    assert_eq!(Bench::Mr.default_sizes()[0], 0);
    assert!(!Bench::Bibw.measures(0) && Bench::Mr.measures(0));
    let r = |b: Bench, s| {
        let r = b.reps(s, None, None);
        (r.iters, r.warmup)
    };
    assert_eq!(r(Bench::Latency, 8192), (10_000, 100));
    assert_eq!(r(Bench::Latency, 8193), (1_000, 10));
    assert_eq!(r(Bench::Bw, 8), (100, 10));
    assert_eq!(r(Bench::Bibw, 1 << 20), (20, 2));
    let o = Bench::Mr.reps(4 << 20, Some(7), Some(1));
    assert_eq!((o.iters, o.warmup, o.total()), (7, 1, 8));
    assert_eq!(Bench::Latency.reps(0, None, Some(3)).warmup, 3);
}

#[test]
fn receive_slots_and_groups() {
    assert_eq!(recv_slots(8, 64), 64);
    assert_eq!(recv_slots(16384, 64), 64);
    assert_eq!(recv_slots(32768, 64), 32);
    assert_eq!(recv_slots(4 << 20, 64), 1);
    assert_eq!(recv_slots(0, 64), 64);
    assert_eq!(recv_slots(8, 3), 3);
    assert_eq!(slot_stride(0), 64);
    assert_eq!(slot_stride(65), 128);
    assert_eq!(groups(64, 64).collect::<Vec<_>>(), vec![64]);
    assert_eq!(groups(64, 32).collect::<Vec<_>>(), vec![32, 32]);
    assert_eq!(groups(10, 4).collect::<Vec<_>>(), vec![4, 4, 2]);
    assert_eq!(groups(3, 1).collect::<Vec<_>>(), vec![1, 1, 1]);
    for (w, s) in [(64, 7), (1, 1), (1024, 1000)] {
        assert_eq!(groups(w, s).sum::<usize>(), w as usize);
        assert!(groups(w, s).all(|n| n >= 1 && n <= s));
    }
    let slots = RecvSlots::new(100, 64);
    assert_eq!((slots.stride, slots.slots), (128, 64));
    assert_eq!(slots.slot_of(65).len(), 100);
    assert_eq!(slots.buf.as_slice().as_ptr() as usize % SLOT_ALIGN, 0);
}

#[test]
fn stamps_differ_between_windows_and_from_the_fills() {
    for w in 0..200 {
        let (a, b) = stamp_bytes(w);
        let (c, d) = stamp_bytes(w + 1);
        assert!(a != c && b != d && a != b);
        for fill in [SEND_FILL, RECV_FILL] {
            assert!(a != fill && b != fill);
        }
    }
}

#[test]
fn data_check_catches_stale_and_short_messages() {
    for size in [1usize, 2, 4096] {
        let mut buf = vec![RECV_FILL; size];
        stamp(&mut buf, 9);
        check_stamp(&buf, size, size, 9).unwrap();
        // The previous window's data, or nothing at all, is refused.
        let e = check_stamp(&buf, size, size, 10).unwrap_err();
        assert!(e.contains("rank 0 wrote"), "{e}");
        let fresh = vec![RECV_FILL; size];
        assert!(check_stamp(&fresh, size, size, 9).is_err());
    }
    let e = check_stamp(&[0; 8], 7, 8, 0).unwrap_err();
    assert!(e.contains("holds 7 bytes, 8 were sent"), "{e}");
    check_stamp(&[], 0, 0, 3).unwrap();
}

fn line(us: f64) -> CacheLine {
    CacheLine {
        one_way: Summary::of_us(vec![us]).unwrap(),
        busy: None,
        cpus: ("0".into(), "1".into()),
    }
}

#[test]
fn the_latency_ratio_shows_the_busy_line_when_measured() {
    let mut before = line(0.05);
    before.busy = Summary::of_us(vec![0.25]);
    let r = Reference::CacheLine {
        before: Some(before),
        after: None,
    };
    let c = ratio_comment(&[(8, 0.2)], &r).unwrap();
    assert!(c.starts_with("weft/limit at 8 B: 4.00"), "{c}");
    assert!(
        c.ends_with(
            "\n(the cache line with 20 ns of work per turn on each side: 0.250 us one way)"
        ),
        "{c}"
    );
    let c = ratio_comment(
        &[(8, 0.2)],
        &Reference::CacheLine {
            before: Some(line(0.05)),
            after: None,
        },
    )
    .unwrap();
    assert!(!c.contains("work per turn"), "{c}");
}

#[test]
fn ratios_use_8_bytes_and_4_mib() {
    let memcpy = Reference::Memcpy {
        before: vec![(8, 100.0), (4 << 20, 10_000.0)],
        after: None,
    };
    let c = ratio_comment(&[(8, 10.0), (4 << 20, 8_000.0)], &memcpy).unwrap();
    assert!(c.starts_with("weft/memcpy at 4194304 B: 0.80"), "{c}");
    let c = ratio_comment(&[(8, 50.0)], &memcpy).unwrap();
    assert!(c.starts_with("weft/memcpy at 8 B: 0.50"), "{c}");
    let r = Reference::CacheLine {
        before: Some(line(0.1)),
        after: None,
    };
    let c = ratio_comment(&[(0, 0.15), (8, 0.2), (16, 0.3)], &r).unwrap();
    assert!(c.starts_with("weft/limit at 8 B: 2.00"), "{c}");
    let c = ratio_comment(&[(0, 0.15), (64, 0.3)], &r).unwrap();
    assert!(c.starts_with("weft/limit at 64 B: 3.00"), "{c}");
    assert!(ratio_comment(&[(8, 1.0)], &Reference::None).is_none());
}

#[test]
fn ratios_take_the_better_floor_and_warn_of_drift() {
    let r = Reference::CacheLine {
        before: Some(line(0.1)),
        after: Some(line(0.05)),
    };
    let c = ratio_comment(&[(8, 0.2)], &r).unwrap();
    assert!(c.starts_with("weft/limit at 8 B: 4.00"), "{c}");
    assert!(c.contains("0.100 before the sweep and 0.050 after"), "{c}");
    assert!(
        c.contains("\nwarning: the cache-line one-way time moved"),
        "{c}"
    );
    let r = Reference::CacheLine {
        before: Some(line(0.1)),
        after: Some(line(0.11)),
    };
    let c = ratio_comment(&[(8, 0.2)], &r).unwrap();
    assert!(
        c.starts_with("weft/limit at 8 B: 2.00") && !c.contains("warning"),
        "{c}"
    );
    let m = Reference::Memcpy {
        before: vec![(4 << 20, 10_000.0)],
        after: Some((4 << 20, 20_000.0)),
    };
    let c = ratio_comment(&[(4 << 20, 8_000.0)], &m).unwrap();
    assert!(c.starts_with("weft/memcpy at 4194304 B: 0.40"), "{c}");
    assert!(c.contains("warning: the memcpy bandwidth moved"), "{c}");
    assert_eq!(latency_ratio_size(&[0, 16, 64]), Some(16));
    assert_eq!(bw_ratio_size(&[1, 4 << 20, 8 << 20]), Some(4 << 20));
    assert_eq!(bw_ratio_size(&[1, 2048]), Some(2048));
}

/// Runs `case` on two fabric endpoints in two threads of this process, connected
/// through shared memory, with the given eager limit.
fn pair(name: &str, eager: usize, case: fn(&Communicator)) {
    let names: Vec<String> = (0..2)
        .map(|r| format!("/weft-bench-p2p-{}-{name}-{r}", std::process::id()))
        .collect();
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2u32)
        .map(|me| {
            let names = names.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let inbox = Inbox::create(&names[me as usize], &InboxConfig::default()).unwrap();
                barrier.wait();
                let peers = names.iter().cloned().map(Some).collect();
                let f = Fabric::from_parts(me, 2, Some(inbox), vec![0, 1], peers, eager, true);
                case(&f.world());
                barrier.wait();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_failed_data_check_fails_both_ranks() {
    // Rank 1 expects 16-byte messages where rank 0 sends 8: its check of the last
    // window fails, and the ack carries the failure to rank 0.
    pair("check", 4096, |world| {
        let reps = Reps {
            iters: 2,
            warmup: 0,
        };
        let size = if world.rank() == 0 { 8 } else { 16 };
        let mut sbuf = AlignedBuf::filled(16, SEND_FILL);
        let mut slots = RecvSlots::new(16, 4);
        let e = unidirectional(
            world,
            Pair::of_two(world),
            size,
            4,
            reps,
            sbuf.as_mut_slice(),
            &mut slots,
        )
        .unwrap_err();
        if world.rank() == 0 {
            assert!(e.contains("rank 1 found the data"), "{e}");
        } else {
            assert!(e.contains("holds 8 bytes, 16 were sent"), "{e}");
        }
    });
}

const SIZES: &[usize] = &[0, 1, 8, 4096, 8193, 1 << 20];

#[test]
fn kernels_run_between_two_endpoints() {
    pair("kernels", 4096, |world| {
        let reps = Reps {
            iters: 3,
            warmup: 1,
        };
        let mut sbuf = AlignedBuf::filled(1 << 20, SEND_FILL);
        let mut rbuf = AlignedBuf::filled(1 << 20, RECV_FILL);
        for &size in SIZES {
            let timed = size == 8;
            let l = latency(
                world,
                size,
                reps,
                timed,
                sbuf.as_slice(),
                rbuf.as_mut_slice(),
            );
            let l = l.unwrap();
            assert!(l.mean_us > 0.0);
            // Rank 0 times each round trip when asked; rank 1 never does.
            assert_eq!(l.dist.is_some(), timed && world.rank() == 0, "{l:?}");
            let mut slots = RecvSlots::new(size, 5);
            let t = unidirectional(
                world,
                Pair::of_two(world),
                size,
                5,
                reps,
                sbuf.as_mut_slice(),
                &mut slots,
            );
            assert!(t.unwrap() > Duration::ZERO);
            if size > 0 {
                // The last message of the last window carries its stamp.
                if world.rank() == 1 {
                    check_stamp(slots.slot_of(4), size, size, reps.total() - 1).unwrap();
                }
                let mut slots = RecvSlots::new(size, 5);
                let t = bidirectional(world, size, 5, reps, sbuf.as_slice(), &mut slots);
                assert!(t.unwrap() > Duration::ZERO);
            }
        }
        sync(world).unwrap();
    });
}

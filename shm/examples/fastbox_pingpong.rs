//! Micro benchmark of the shared-memory transport: two threads on two cores,
//! each with its own inbox, talking through fastboxes.
//!
//! Prints the one-way latency of 8-byte frames (half the round trip), the
//! streaming rate of 8-byte frames, the bandwidth of 16 KiB frames (received
//! into a buffer, so two copies), and for reference the one-way latency of
//! two threads bouncing one cache line, the floor of any shared-memory path,
//! also with 20, 50 and 100 ns of work per turn: that floor holds only for a
//! side that answers at once, and a few tens of nanoseconds of work (any
//! matching) cost a transfer about what a ring's does.
//!
//! `cargo run --release -p weft-shm --example fastbox_pingpong [-- --iters N]`

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Instant;

use weft_shm::{Inbox, InboxConfig, Outbox};

/// Pins the calling thread to `cpu` if the machine has it.
fn pin(cpu: usize) {
    // SAFETY: `cpu_set_t` is a plain bit set; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit inside `set`; cpu < CPU_SETSIZE here.
    unsafe { libc::CPU_SET(cpu % libc::CPU_SETSIZE as usize, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is us.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        eprintln!(
            "note: cannot pin to cpu {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Waits for one frame on `inbox`, handing it to `f`.
#[inline(always)]
fn recv(inbox: &mut Inbox, f: &mut dyn FnMut(u32, &[u8])) {
    loop {
        // Wait on loads only, then poll: a poll is long enough that spinning on it
        // delays the moment a frame is seen.
        while inbox.quiet() {
            std::hint::spin_loop();
        }
        if inbox.poll(f) > 0 {
            return;
        }
    }
}

/// Sends, spinning while the ring is full.
#[inline(always)]
fn send(out: &mut Outbox, header: &[u8], payload: &[u8]) {
    while !out.try_send(header, payload) {
        std::hint::spin_loop();
    }
}

struct Results {
    latency_us: f64,
    rate_mps: f64,
    bandwidth_mbs: f64,
    /// (segment bytes, bytes of memory touched) of the echo side's inbox.
    inbox_bytes: (u64, u64),
}

/// Size and allocated (touched) bytes of the segment `name` on tmpfs.
fn segment_usage(name: &str) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/dev/shm{name}")).map_or((0, 0), |m| (m.size(), m.blocks() * 512))
}

fn run(iters: u64, cpus: (usize, usize)) -> Results {
    let pid = std::process::id();
    let a_name = format!("/weft-example-pingpong-{pid}-a");
    let b_name = format!("/weft-example-pingpong-{pid}-b");
    let cfg = InboxConfig::from_env().expect("WEFT_SHM_* settings");
    let mut a = Inbox::create_for(&a_name, &cfg, 0).expect("create inbox a");
    let b = Inbox::create_for(&b_name, &cfg, 1).expect("create inbox b");
    let (a_host, b_host) = (a.pair_host(), b.pair_host());
    let barrier = Barrier::new(2);
    let big = 16 * 1024;
    let big_frames = (iters / 4).max(1000);

    std::thread::scope(|s| {
        // The echo side: owns inbox b, sends to a.
        s.spawn(|| {
            let mut b = b;
            pin(cpus.1);
            let mut to_a = Outbox::connect(&a_name, 1).expect("connect a");
            barrier.wait();
            b_host.pair(&mut to_a);
            // Latency: echo every frame.
            let mut frame = [0u8; 8];
            for _ in 0..iters + iters / 10 {
                recv(&mut b, &mut |_, f| frame.copy_from_slice(f));
                send(&mut to_a, &frame, &[]);
            }
            // Rate: receive a stream of 8-byte frames, then ack.
            let mut n = 0u64;
            while n < iters {
                n += b.poll(&mut |_, f| {
                    black_box(f);
                }) as u64;
            }
            send(&mut to_a, &[1], &[]);
            // Bandwidth: receive 16 KiB frames into a buffer, then ack.
            let mut buf = vec![0u8; big];
            let mut n = 0u64;
            while n < big_frames {
                n += b.poll(&mut |_, f| buf[..f.len()].copy_from_slice(f)) as u64;
            }
            black_box(&buf);
            send(&mut to_a, &[2], &[]);
        });

        pin(cpus.0);
        let mut to_b = Outbox::connect(&b_name, 0).expect("connect b");
        barrier.wait();
        a_host.pair(&mut to_b);
        let mut got = 0u64;
        let warmup = iters / 10;
        for i in 0..warmup {
            send(&mut to_b, &i.to_le_bytes(), &[]);
            recv(&mut a, &mut |_, f| {
                got = u64::from_le_bytes(f.try_into().unwrap())
            });
        }
        let start = Instant::now();
        for i in 0..iters {
            send(&mut to_b, &i.to_le_bytes(), &[]);
            recv(&mut a, &mut |_, f| {
                got = u64::from_le_bytes(f.try_into().unwrap())
            });
        }
        let latency_us = start.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64;
        assert_eq!(got, iters - 1);

        let start = Instant::now();
        for i in 0..iters {
            send(&mut to_b, &i.to_le_bytes(), &[]);
        }
        recv(&mut a, &mut |_, f| assert_eq!(f, [1]));
        let rate_mps = iters as f64 / start.elapsed().as_secs_f64() / 1e6;

        let payload = vec![0x5au8; big];
        let start = Instant::now();
        for _ in 0..big_frames {
            send(&mut to_b, &[], &payload);
        }
        recv(&mut a, &mut |_, f| assert_eq!(f, [2]));
        let bandwidth_mbs = (big_frames * big as u64) as f64 / start.elapsed().as_secs_f64() / 1e6;
        Results {
            latency_us,
            rate_mps,
            bandwidth_mbs,
            inbox_bytes: segment_usage(&b_name),
        }
    })
}

/// Cost of sending and receiving one 8-byte frame in one thread (no
/// cross-core traffic): the transport's own instructions.
fn same_thread_cost_ns(iters: u64) -> f64 {
    let name = format!("/weft-example-pingpong-{}-self", std::process::id());
    let mut inbox = Inbox::create(&name, &InboxConfig::default()).expect("create inbox");
    let mut out = Outbox::connect(&name, 0).expect("connect");
    let mut sum = 0u64;
    let start = Instant::now();
    for i in 0..iters {
        send(&mut out, &i.to_le_bytes(), &[]);
        recv(&mut inbox, &mut |_, f| sum += f[0] as u64);
    }
    black_box(sum);
    start.elapsed().as_secs_f64() * 1e9 / iters as f64
}

/// Busy work of about `n` dependent multiply-xor steps, standing for what a fabric does
/// between seeing a message and answering it (no memory traffic, no timer reads: reading
/// the TSC in the loop would hold back the store that follows).
/// Nothing at all for 0, so the plain ping-pong runs exactly as without it.
#[inline(always)]
fn work(seed: u64, n: u64) {
    let mut x = seed;
    for k in 0..n {
        x = black_box(x.wrapping_mul(3) ^ k);
    }
}

/// Steps of [`work`] that take about `ns` nanoseconds on this core.
fn steps_for_ns(ns: f64) -> u64 {
    if ns <= 0.0 {
        return 0;
    }
    let (reps, n) = (200_000u64, 256u64);
    let start = Instant::now();
    for i in 0..reps {
        work(i, n);
    }
    let per_step = start.elapsed().as_secs_f64() * 1e9 / (reps * n) as f64;
    (ns / per_step).round().max(1.0) as u64
}

/// One-way latency of two threads bouncing one cache line, each doing `steps` of
/// [`work`] between seeing the other's value and writing its own.
fn cacheline_floor(iters: u64, cpus: (usize, usize), steps: u64) -> f64 {
    #[repr(align(128))]
    struct Line(AtomicU64);
    let line = Line(AtomicU64::new(0));
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            pin(cpus.1);
            barrier.wait();
            for i in 0..iters {
                while line.0.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                work(i, steps);
                line.0.store(2 * i + 2, Ordering::Release);
            }
        });
        pin(cpus.0);
        barrier.wait();
        let start = Instant::now();
        for i in 0..iters {
            line.0.store(2 * i + 1, Ordering::Release);
            while line.0.load(Ordering::Acquire) != 2 * i + 2 {
                std::hint::spin_loop();
            }
            work(i, steps);
        }
        start.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64
    })
}

fn main() {
    let mut iters = 1_000_000u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--iters" => {
                iters = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--iters takes a number")
            }
            _ => {
                eprintln!("usage: fastbox_pingpong [--iters N]");
                std::process::exit(2);
            }
        }
    }
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpus = (0, if ncpu > 1 { 1 } else { 0 });
    if ncpu < 2 {
        eprintln!("note: one cpu only; both threads share it (numbers are meaningless)");
    }
    let own = same_thread_cost_ns(iters);
    let floor = cacheline_floor(iters, cpus, 0);
    let r = run(iters, cpus);
    println!(
        "# weft-shm fastbox, two threads on cpus {} and {}",
        cpus.0, cpus.1
    );
    println!("{:<40} {:>12}", "measure", "value");
    println!("{:<40} {:>9.1} ns", "8 B send + poll in one thread", own);
    println!("{:<40} {:>9.3} us", "cache-line ping-pong, one way", floor);
    // The floor holds only when each side answers at once: with a turnaround of a few
    // tens of nanoseconds (any matching), a transfer costs about what a ring's does.
    for ns in [20.0, 50.0, 100.0] {
        let t = cacheline_floor(iters / 2, cpus, steps_for_ns(ns));
        println!(
            "{:<40} {:>9.3} us",
            format!("  the same, {ns:.0} ns of work per turn"),
            t
        );
    }
    println!(
        "{:<40} {:>9.3} us",
        "8 B frame ping-pong, one way", r.latency_us
    );
    println!("{:<40} {:>9.2} M/s", "8 B frame streaming rate", r.rate_mps);
    println!(
        "{:<40} {:>9.0} MB/s",
        "16 KiB frame bandwidth", r.bandwidth_mbs
    );
    let fresh = format!("/weft-example-pingpong-{}-fresh", std::process::id());
    let fresh_inbox = Inbox::create(&fresh, &InboxConfig::default()).expect("create inbox");
    let (size, touched_new) = segment_usage(fresh_inbox.name());
    drop(fresh_inbox);
    println!(
        "inbox segment {} KiB; touched: {} KiB when new, {} KiB after this run (one sender)",
        size / 1024,
        touched_new / 1024,
        r.inbox_bytes.1 / 1024
    );
}

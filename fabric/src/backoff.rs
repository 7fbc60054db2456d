//! Waiting: how a wait loop backs off ([`Backoff`]: spin, then yield, then nap, checking
//! for dead peers by the clock), and how long it spins before yielding on this machine
//! ([`spin_limit`]: briefly when the job's processes outnumber its CPUs).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Spins of a wait loop before it yields (see [`spin_limit`]).
static SPIN_LIMIT: AtomicU32 = AtomicU32::new(Backoff::SPIN);

/// Spins after which a waiting loop of this process should yield the CPU: 16,384 when
/// the host runs at most as many of the job's processes as it has CPUs (logical nodes
/// on one machine count together), 16 when it is oversubscribed
/// (then the process waited for may need this CPU: Open MPI yields when idle in that
/// case too). Set by [`Fabric::init`](crate::Fabric::init); libraries that wait on their own (shared-memory
/// flags) use it.
pub fn spin_limit() -> u32 {
    Backoff::spin_limit()
}

/// Spins before yielding when the node is oversubscribed.
const OVERSUBSCRIBED_SPIN: u32 = 16;

/// Notes whether this host runs more of the job's processes (`local`) than it has CPUs
/// for them (`WEFT_OVERSUBSCRIBED`: `on`, `off`, or by default `auto`, which compares
/// with the CPUs of this process's cgroup cpuset, else the machine's online CPUs).
pub(crate) fn note_oversubscription(local: u32) -> Result<(), weft_tunables::BadTunable> {
    let set = crate::setup::oversubscribed_tunable()?;
    let over = set.unwrap_or_else(|| {
        let cpus = host_cpus();
        let over = local as usize > cpus;
        if over {
            tracing::debug!("{local} processes on {cpus} CPUs: waiting loops yield early");
        }
        over
    });
    // Relaxed: read as a hint by wait loops.
    SPIN_LIMIT.store(
        if over {
            OVERSUBSCRIBED_SPIN
        } else {
            Backoff::SPIN
        },
        Ordering::Relaxed,
    );
    Ok(())
}

/// The CPUs this host gives the job: its cgroup's cpuset (a container or a batch
/// system's allocation) when there is one, else the machine's online CPUs; not this
/// process's affinity (a process bound to one core is not oversubscribed because of it).
fn host_cpus() -> usize {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let online = read("/sys/devices/system/cpu/online")
        .and_then(|s| cpu_list_len(s.trim()))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let cpuset = read("/proc/self/cgroup")
        .and_then(|c| cpuset_file(&c))
        .and_then(|f| read(&f))
        .and_then(|s| cpu_list_len(s.trim()));
    cpuset.map_or(online, |c| c.min(online))
}

/// The file that lists this process's cgroup cpuset, from `/proc/self/cgroup`: cgroup v2
/// (`0::/path`: `cpuset.cpus.effective` under `/sys/fs/cgroup/path`) or v1's cpuset
/// controller (`N:cpuset:/path`).
fn cpuset_file(cgroup: &str) -> Option<String> {
    for line in cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        let path = path.trim_end_matches('/');
        if ctl.split(',').any(|c| c == "cpuset") {
            return Some(format!("/sys/fs/cgroup/cpuset{path}/cpuset.effective_cpus"));
        }
        if ctl.is_empty() {
            let v2 = format!("/sys/fs/cgroup{path}/cpuset.cpus.effective");
            if std::path::Path::new(&v2).exists() {
                return Some(v2);
            }
        }
    }
    None
}

/// The number of CPUs in a Linux CPU list such as `0-3,8,10-11`.
fn cpu_list_len(s: &str) -> Option<usize> {
    let mut n = 0;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                b.parse::<usize>()
                    .ok()?
                    .checked_sub(a.parse::<usize>().ok()?)?
                    + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// How a wait loop backs off: it spins (lowest latency) for a while, then yields the CPU
/// at each poll, then, after a long idle stretch, sleeps briefly between polls so that an
/// idle waiter costs almost nothing.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    spins: u32,
    /// When `snooze` last said to check for dead peers (once past the spin phase).
    checked: Option<Instant>,
}

impl Backoff {
    /// Spins before yielding.
    const SPIN: u32 = 1 << 14;

    /// Spins before yielding in this process: [`Backoff::SPIN`], or a few when the node
    /// runs more processes than it has CPUs (a spinning waiter would then burn the time
    /// slice of the process it waits for; see [`spin_limit`]).
    #[inline]
    fn spin_limit() -> u32 {
        // Relaxed: a setting written once at init.
        SPIN_LIMIT.load(Ordering::Relaxed)
    }
    /// Polls before sleeping (roughly a second of yields).
    const YIELD: u32 = 1 << 20;
    /// Once yielding or sleeping, how often to check for dead peers: by the clock, since a
    /// yield on a loaded machine can take milliseconds.
    pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(5);

    /// Whether the next `snooze` only spins (neither yields nor sleeps).
    #[inline]
    pub(crate) fn spinning(&self) -> bool {
        self.spins < Self::spin_limit()
    }

    /// Waits a little; returns true when it is time to check for dead peers: every 1024
    /// calls while spinning, then every [`Backoff::CHECK_EVERY`].
    #[inline]
    pub(crate) fn snooze(&mut self) -> bool {
        self.spins = self.spins.saturating_add(1);
        if self.spins <= Self::spin_limit() {
            // No pause instruction while spinning: it costs up to ~140 cycles on recent
            // x86, which would show directly in the latency of the next message.
            return self.spins % 1024 == 0;
        }
        if self.spins > Self::YIELD {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::thread::yield_now();
        }
        // The first check comes CHECK_EVERY after the first yield, not at it: when
        // processes outnumber CPUs most waits last a few yields, and a check costs system
        // calls (whether the server is still there).
        let now = Instant::now();
        match self.checked {
            None => {
                self.checked = Some(now);
                false
            }
            Some(t) if now.duration_since(t) < Self::CHECK_EVERY => false,
            Some(_) => {
                self.checked = Some(now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpuset_file_comes_from_cgroup_v1_or_v2() {
        assert_eq!(
            cpuset_file("4:memory:/x\n3:cpuset:/job/7\n0::/\n").as_deref(),
            Some("/sys/fs/cgroup/cpuset/job/7/cpuset.effective_cpus")
        );
        assert_eq!(
            cpuset_file("3:cpuset:/\n").as_deref(),
            Some("/sys/fs/cgroup/cpuset/cpuset.effective_cpus")
        );
        assert_eq!(cpuset_file("1:cpu:/\n"), None);
        assert!(host_cpus() >= 1);
    }

    #[test]
    fn cpu_lists_count_their_cpus() {
        assert_eq!(cpu_list_len("0-3,8,10-11"), Some(7));
        assert_eq!(cpu_list_len("0"), Some(1));
        assert_eq!(cpu_list_len("0-1"), Some(2));
        assert_eq!(cpu_list_len("x"), None);
        assert_eq!(cpu_list_len(""), None);
    }

    #[test]
    fn backoff_reports_every_1024_calls_then_by_the_clock() {
        let mut b = Backoff::default();
        let ticks = (0..4096).filter(|_| b.snooze()).count();
        assert_eq!(ticks, 4);
        // Past the spin phase: the first yield starts the clock without reporting, then
        // reports come at most every 5 ms (measured by the reports' own clock readings,
        // so that a loaded machine that deschedules the test cannot fail it).
        b.spins = Backoff::SPIN;
        assert!(!b.snooze(), "the first yield reported");
        let mut last = b.checked.expect("the first yield sets the clock");
        let t = Instant::now();
        let (mut calls, mut reports) = (0u64, 0u32);
        while t.elapsed() < Duration::from_millis(20) {
            calls += 1;
            if b.snooze() {
                let now = b.checked.expect("a report sets the clock");
                assert!(
                    now.duration_since(last) >= Backoff::CHECK_EVERY,
                    "reported again {:?} after the last report",
                    now.duration_since(last)
                );
                last = now;
                reports += 1;
            }
        }
        // Far fewer reports than calls: at most one per 5 ms (and the 20 ms loop made
        // many calls unless the machine starved it).
        assert!(
            u64::from(reports) < calls.max(2),
            "{reports} reports in {calls} calls"
        );
        std::thread::sleep(Backoff::CHECK_EVERY);
        assert!(b.snooze(), "did not report after 5 ms");
    }
}

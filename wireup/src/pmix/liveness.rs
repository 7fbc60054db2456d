//! Which of the job's processes have ended, under a PMIx host: the host's events, and
//! for hosts that send none, a liveness check of the processes of this node.

use super::*;

/// A neighbour's pid and start time (once read), and when it was last checked.
pub(super) type PidCheck = (Option<(u32, u64)>, Instant);

/// The processes the host reported ended, and whether the host itself is lost.
#[derive(Debug, Default)]
pub(super) struct Ends {
    /// Events read so far.
    pub(super) seen: usize,
    /// Ended ranks and why.
    pub(super) gone: HashMap<Rank, String>,
    /// Why the connection to the host's server is lost, if it is.
    pub(super) lost: Option<String>,
}

/// The key under which each process publishes its pid and start time to its node.
pub(super) const PID_KEY: &str = "weft.pid";
/// The key a process commits (scope Local) as it finalizes: a neighbour whose process is
/// then found gone finalized cleanly ([`weft_wireup::FINALIZED`]), it did not die.
pub(super) const FIN_KEY: &str = "weft.finalized";

/// How often a wait checks that the participants on this node are alive.
pub(super) const LIVENESS_EVERY: Duration = Duration::from_millis(100);

/// The start time (clock ticks since boot) and state of process `pid`, from
/// `/proc/<pid>/stat`, or `None` when there is no such process.
pub(super) fn proc_start(pid: u32) -> Option<(u64, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((start, state))
}

/// How long a failed host fence waits for the event naming a dead participant.
pub(super) const EVENT_GRACE: Duration = Duration::from_millis(500);

impl Link {
    /// Reads the host's new events into `ends`.
    pub(super) fn read_events(&self) {
        let n = self.px.event_count();
        let mut ends = lock(&self.live.ends);
        if n == ends.seen {
            return;
        }
        let new = self.px.events_since(ends.seen);
        ends.seen += new.len();
        let me = self.px.rank();
        for ev in new {
            self.note_event(&mut ends, &ev, me);
        }
        if !ends.gone.is_empty() || ends.lost.is_some() {
            // SYNC: pairs with the Acquire in `gone`: set after `ends` holds the news,
            // which `gone` then reads under the lock.
            self.live.any_end.store(true, Ordering::Release);
        }
    }

    fn note_event(&self, ends: &mut Ends, ev: &Event, me: Rank) {
        let ns = self.px.nspace();
        if ev.kind == EventKind::ConnectionLost {
            // A lost connection whose source is another process of the job is that
            // process's to its server (Slurm's plugin reports a dead task so): that
            // process ended, the host is not lost.
            let another = ev
                .source
                .as_ref()
                .is_some_and(|(n, r)| n == ns && *r != me && *r < self.size());
            if ev.affected.is_empty() && !another {
                ends.lost.get_or_insert_with(|| {
                    format!(
                        "is unreachable: the connection to the host's PMIx server is lost ({})",
                        ev.message
                    )
                });
                return;
            }
        } else if ev.kind != EventKind::ProcEnded {
            tracing::debug!("PMIx event ignored: {ev:?}");
            return;
        }
        let mut ranks: Vec<u32> = ev
            .affected
            .iter()
            .filter(|(n, _)| n == ns)
            .map(|&(_, r)| r)
            .collect();
        if ranks.is_empty() {
            if let Some((n, r)) = &ev.source {
                if n == ns {
                    ranks.push(*r);
                }
            }
        }
        let code = ev
            .exit_code
            .map(|c| format!(", exit code {c}"))
            .unwrap_or_default();
        let why = format!("ended: the host reports {}{code}", ev.message);
        for r in ranks {
            if r == weft_pmix::RANK_WILDCARD {
                // The whole job: every other process.
                for o in 0..self.size() {
                    if o != me {
                        ends.gone.entry(o).or_insert_with(|| why.clone());
                    }
                }
            } else if r != me && r < self.size() {
                ends.gone.entry(r).or_insert_with(|| why.clone());
                if self.live.neighbours.contains(&r) {
                    // Its inbox's name is nobody's to remove now but ours.
                    let _ = weft_shm::unlink(&format!("{}r{r}", self.prefix));
                }
            }
        }
    }

    /// Why `rank` is gone, if the host said so (a termination event), or why every
    /// process is (the host's server is lost). Cheap while nothing has ended.
    pub(crate) fn gone(&self, rank: Rank) -> Option<String> {
        self.read_events();
        self.check_alive(rank, false);
        // SYNC: pairs with the Release in `read_events`.
        if !self.live.any_end.load(Ordering::Acquire) {
            return None;
        }
        let ends = lock(&self.live.ends);
        ends.gone.get(&rank).cloned().or_else(|| ends.lost.clone())
    }

    /// Why the host's server is lost, if it is.
    pub(crate) fn lost(&self) -> Option<String> {
        self.read_events();
        lock(&self.live.ends).lost.clone()
    }

    /// Checks that `rank`, when it runs on this node, is alive (at most every
    /// [`LIVENESS_EVERY`] unless `now`); if its process is gone, records why.
    pub(super) fn check_alive(&self, rank: Rank, now: bool) {
        if !self.live.neighbours.contains(&rank) {
            return;
        }
        let pid = {
            let mut pids = lock(&self.live.pids);
            let due = Instant::now() - LIVENESS_EVERY;
            let e = pids.entry(rank).or_insert((None, due));
            if !now && e.1 > due {
                return;
            }
            e.1 = Instant::now();
            if e.0.is_none() {
                let here = PGetOpts {
                    local_only: true,
                    ..PGetOpts::default()
                };
                e.0 = self
                    .px
                    .get(Some(rank), PID_KEY, here)
                    .ok()
                    .and_then(|v| v.as_bytes().and_then(|b| postcard::from_bytes(b).ok()));
            }
            e.0
        };
        let Some((pid, start)) = pid else { return };
        let dead = match proc_start(pid) {
            None => true,
            Some((s, state)) => (start != 0 && s != start) || state == 'Z' || state == 'X',
        };
        if dead {
            // Its inbox's name is nobody's to remove now but ours.
            let _ = weft_shm::unlink(&format!("{}r{rank}", self.prefix));
            let here = PGetOpts {
                local_only: true,
                ..PGetOpts::default()
            };
            let finalized = self.px.get(Some(rank), FIN_KEY, here).is_ok();
            let mut ends = lock(&self.live.ends);
            ends.gone.entry(rank).or_insert_with(|| {
                if finalized {
                    crate::FINALIZED.to_owned()
                } else {
                    format!("ended: its process (pid {pid} on this node) is gone")
                }
            });
            // SYNC: pairs with the Acquire in `gone`.
            self.live.any_end.store(true, Ordering::Release);
        }
    }

    /// Checks the liveness of those of `ranks` (`None`: the job) on this node.
    pub(super) fn check_neighbours(&self, ranks: Option<&[Rank]>, now: bool) {
        for &r in &self.live.neighbours {
            if ranks.is_none_or(|rs| rs.contains(&r)) {
                self.check_alive(r, now);
            }
        }
    }

    /// The first of `ranks` (`None`: the whole job) that is gone, and why.
    /// [`Link::first_gone`] without the processes that finalized: a participant that
    /// finalized completed the collectives it joined (its fence completion may reach it
    /// before this process's does), and one that never joined is for the host to fail.
    pub(super) fn first_failed(&self, ranks: Option<&[Rank]>) -> Option<(Rank, String)> {
        self.read_events();
        // SYNC: pairs with the Release in `read_events`.
        if !self.live.any_end.load(Ordering::Acquire) {
            return None;
        }
        let ends = lock(&self.live.ends);
        let me = self.px.rank();
        let counts = |r: Rank| r != me && r < self.size && ranks.is_none_or(|rs| rs.contains(&r));
        ends.gone
            .iter()
            .filter(|(r, why)| counts(**r) && why.as_str() != crate::FINALIZED)
            .min_by_key(|(r, _)| **r)
            .map(|(r, why)| (*r, why.clone()))
            .or_else(|| {
                let lost = ends.lost.clone()?;
                (0..self.size).find(|&r| counts(r)).map(|r| (r, lost))
            })
    }

    pub(super) fn first_gone(&self, ranks: Option<&[Rank]>) -> Option<(Rank, String)> {
        self.read_events();
        // SYNC: pairs with the Release in `read_events`.
        if !self.live.any_end.load(Ordering::Acquire) {
            return None;
        }
        let ends = lock(&self.live.ends);
        let all: Vec<Rank>;
        let ranks = match ranks {
            Some(r) => r,
            None => {
                all = (0..self.size).collect();
                &all
            }
        };
        let me = self.px.rank();
        ranks.iter().filter(|&&r| r != me).find_map(|&r| {
            ends.gone
                .get(&r)
                .or(ends.lost.as_ref())
                .map(|why| (r, why.clone()))
        })
    }
}

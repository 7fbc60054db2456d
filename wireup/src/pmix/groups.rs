//! Groups under a PMIx host: the host's PMIx groups where it has them, else Weft's own
//! construct over the host's fence; decided by the leader when members may be left out;
//! PGCIDs from the host, or derived without a server; the events of a group's members'
//! ends.

use super::*;

/// A construct decided by its leader: its members, leader, this member's contribution
/// (digest, count of groups led), the key contributions go under, directives, timeout.
struct Construct<'a> {
    members: &'a [Rank],
    leader: Rank,
    mine: (u64, u64),
    key: &'a str,
    directives: &'a GroupDirectives,
    timeout: Option<Duration>,
}

/// The outcome of a construct decided by its leader ([`Link::decide_by_leader`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum Decision {
    /// Complete: its members, those left out, the leader's count of groups led.
    Done {
        members: Vec<Rank>,
        left_out: Vec<Rank>,
        count: u64,
    },
    /// A member ended and the directives do not let it be left out.
    Gone { rank: Rank, reason: String },
    /// Members did not arrive in time.
    Timeout { missing: Vec<Rank> },
    /// The contributions disagree or are corrupt.
    Invalid { reason: String },
}

/// Whether a construct went to the host's PMIx groups.
#[derive(Debug, Clone, Copy)]
enum AtHost {
    /// Constructed there, with the PGCID the host assigned (if one was asked for).
    Yes(Option<u64>),
    /// The host has no PMIx groups.
    No,
}

/// [`Link::host_groups`]: not known yet, the host has PMIx groups, it has none.
pub(super) const HOST_GROUPS_UNKNOWN: u8 = 0;
const HOST_GROUPS_YES: u8 = 1;
const HOST_GROUPS_NO: u8 = 2;

/// How long a member waits for another's contribution after the collective that brought
/// it, when no timeout was given (a host that did not bring it is asked directly).
const HOST_DATA_WAIT: Duration = Duration::from_secs(60);

/// The id of Weft's group `id` at the host: Weft's own, prefixed so that it cannot be
/// taken for a namespace or a group of another PMIx program.
fn host_group_id(id: &str) -> String {
    format!("weft.grp:{id}")
}

/// How much longer than the construct's timeout a member waits for its leader's decision.
const DECISION_GRACE: Duration = Duration::from_secs(5);
/// How long `weft info`'s probe construct (and destruct) of this process alone may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// A group whose members' ends this process must be told of (see [`Link::take_events`]).
#[derive(Debug)]
pub(super) struct Watched {
    id: String,
    /// Its members (the live ones, with `notify`).
    members: Vec<Rank>,
    leader: Option<Rank>,
    /// Made with `notify_termination`.
    notify: bool,
    /// Members whose end was already reported.
    lost: Vec<Rank>,
}

/// PGCIDs under a PMIx host, where no root server hands them out: the world's is 1; a
/// group's comes from its leader's rank and the count `c` of groups with a PGCID that
/// leader led before. Each rank owns `K = (2^22 - 2) / size` ids below 2^22 (where
/// collective libraries can still derive child ids from them): `2 + leader * K + c`;
/// past those, `2^48 | leader << 24 | (c - K)`, up to 2^24 more. Distinct (leader, c)
/// give distinct ids, and none has the derived-id or collective-plane bits (62, 63).
pub(crate) fn pgcid(size: u32, leader: Rank, c: u64) -> Option<u64> {
    let k = ((1u64 << 22) - 2) / u64::from(size.max(1));
    if c < k {
        return Some(2 + u64::from(leader) * k + c);
    }
    let c2 = c - k;
    (c2 < 1 << 24 && leader < 1 << 24).then(|| (1 << 48) | (u64::from(leader) << 24) | c2)
}

impl Link {
    /// Constructs the group `cid` names (see the module's documentation).
    pub(crate) fn group_construct(
        &self,
        size: u32,
        cid: &CollId,
        directives: &GroupDirectives,
        timeout: Option<Duration>,
        while_waiting: impl FnMut(),
    ) -> Result<GroupInfo, GroupError> {
        const OP: &str = "group construct";
        let id = cid.name.clone();
        let invalid = |reason: String| GroupError::Invalid {
            op: OP,
            id: id.clone(),
            reason,
        };
        let members = cid.procs.ranks(size);
        let leader = directives.leader.unwrap_or(members[0]);
        if !members.contains(&leader) {
            return Err(invalid(format!("the leader {leader} is not a member")));
        }
        let me = self.px.rank();
        let count = if me == leader && directives.assign_context_id {
            // Relaxed: a counter of this process's own constructs.
            self.groups.led.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        let shape = postcard::to_stdvec(&(&members, directives)).unwrap_or_default();
        let mine = (digest(&shape), count);
        let key = format!("weft.grp/{:016x}/{}", digest(id.as_bytes()), cid.seq);
        let host = |e: PmixError| GroupError::Aborted {
            op: OP,
            id: id.clone(),
            reason: format!("the host's PMIx server: {e}"),
        };
        let bytes = postcard::to_stdvec(&mine).unwrap_or_default();
        self.px.put(PScope::Global, &key, &bytes).map_err(host)?;
        self.px.commit().map_err(host)?;
        let mut progress = while_waiting;
        if directives.optional || directives.ft_collective || directives.notify_termination {
            // Members may be left out: the leader decides who is in (a fence cannot).
            let c = Construct {
                members: &members,
                leader,
                mine,
                key: &key,
                directives,
                timeout,
            };
            let (members, left_out, leaders) = self.decide_by_leader(cid, &c, &mut progress)?;
            // The PGCID, where the host assigns them, from its construct over the members
            // the leader kept: the host stays the one authority for the job's ids.
            let at_host = if directives.assign_context_id {
                self.host_construct(&id, &members, directives, timeout, &mut progress)?
            } else {
                AtHost::No
            };
            return self.constructed(
                size,
                &id,
                (members, left_out),
                (leader, leaders),
                directives,
                at_host,
            );
        }
        // The host's construct where it has PMIx groups (it moves the members' committed
        // data as a collecting fence does), else a collecting fence.
        let at_host = self.host_construct(&id, &members, directives, timeout, &mut progress)?;
        if matches!(at_host, AtHost::No) {
            match self.host_fence(Some(&members), true, timeout, &mut progress) {
                Ok(()) => {}
                Err(Ok((rank, reason))) => {
                    return Err(GroupError::ProcGone {
                        op: OP,
                        id: id.clone(),
                        rank,
                        reason,
                    })
                }
                Err(Err(PmixError::Timeout { .. })) => {
                    return Err(GroupError::Timeout {
                        op: OP,
                        id: id.clone(),
                        missing: Vec::new(),
                    })
                }
                Err(Err(e)) => return Err(host(e)),
            }
        }
        let mut leaders = 0;
        for &m in &members {
            // Here after the fence or the host's construct; a host that did not bring
            // it is asked directly.
            let opts = GetOpts {
                timeout: Some(timeout.unwrap_or(HOST_DATA_WAIT)),
                ..GetOpts::default()
            };
            let got = self
                .fetch(m, &key, opts, &mut progress)
                .map_err(|e| invalid(format!("reading rank {m}'s contribution: {e}")))?;
            let (d, c): (u64, u64) = got
                .as_bytes()
                .and_then(|b| postcard::from_bytes(b).ok())
                .ok_or_else(|| invalid(format!("rank {m}'s contribution is corrupt")))?;
            if d != mine.0 {
                return Err(invalid(format!(
                    "rank {m} constructs it with other members or directives"
                )));
            }
            if m == leader {
                leaders = c;
            }
        }
        self.constructed(
            size,
            &id,
            (members, Vec::new()),
            (leader, leaders),
            directives,
            at_host,
        )
    }

    /// Whether the host's server has PMIx groups: `None` until a construct found out.
    pub(crate) fn host_has_groups(&self) -> Option<bool> {
        // Relaxed: a cached answer of the host's, the same whichever thread reads it.
        match self.groups.host_groups.load(Ordering::Relaxed) {
            HOST_GROUPS_YES => Some(true),
            HOST_GROUPS_NO => Some(false),
            _ => None,
        }
    }

    /// Which groups this process gets, in words (for `weft info`); a host not asked yet
    /// is asked by a construct and destruct of this process alone.
    pub(crate) fn groups_report(&self) -> String {
        if self.host_has_groups().is_none() {
            let id = format!("weft.probe/{}", self.px.rank());
            let me = [self.px.rank()];
            let t = Some(PROBE_TIMEOUT);
            let d = GroupDirectives::default();
            if let Ok(AtHost::Yes(_)) = self.host_construct(&id, &me, &d, t, &mut || {}) {
                if let Err(e) = self.host_destruct(&id, &me, false, t, &mut || {}) {
                    tracing::warn!("destructing the probe group {id:?}: {e}");
                }
            }
        }
        match self.host_has_groups() {
            Some(true) => "the host's PMIx groups (PMIx_Group_construct/destruct), PGCIDs \
                           assigned by the host"
                .into(),
            Some(false) => "Weft's own construct over the host's fence (the host's PMIx \
                            server has no PMIx groups, as Open MPI 4.1's runtime and Slurm \
                            22.05 have none); PGCIDs derived from the leader, unique within \
                            the job"
                .into(),
            None => "not known: the host failed a probe construct (see the log)".into(),
        }
    }

    /// Constructs group `id` over `members` at the host (`PMIx_Group_construct`), when
    /// the host has PMIx groups: [`AtHost::No`] when it has none (found now, or known
    /// from an earlier construct; every member finds the same, support being the
    /// host's).
    fn host_construct(
        &self,
        id: &str,
        members: &[Rank],
        directives: &GroupDirectives,
        timeout: Option<Duration>,
        progress: &mut dyn FnMut(),
    ) -> Result<AtHost, GroupError> {
        const OP: &str = "group construct";
        if self.host_has_groups() == Some(false) {
            return Ok(AtHost::No);
        }
        // Always with a context id: OpenPMIx's server keeps the directives of the first
        // local caller only, so members that differ in `assign_context_id` would get
        // different answers; the same directives everywhere let the construct complete,
        // and the members' digests (checked next) tell the disagreement to every member.
        let opts = weft_pmix::GroupOpts {
            assign_context_id: true,
            notify_termination: directives.notify_termination,
            timeout,
        };
        let out = self.host_collective(Some(members), progress, |wait| {
            self.px
                .group_construct_with(&host_group_id(id), members, opts, wait)
        });
        let gone = |rank, reason| GroupError::ProcGone {
            op: OP,
            id: id.to_owned(),
            rank,
            reason,
        };
        // Relaxed: see `host_has_groups`.
        match out {
            Ok(pgcid) => {
                self.groups
                    .host_groups
                    .store(HOST_GROUPS_YES, Ordering::Relaxed);
                lock(&self.groups.at_host).insert(id.to_owned());
                Ok(AtHost::Yes(pgcid.filter(|_| directives.assign_context_id)))
            }
            Err(Err(PmixError::NotSupported { .. })) => {
                self.groups
                    .host_groups
                    .store(HOST_GROUPS_NO, Ordering::Relaxed);
                Ok(AtHost::No)
            }
            Err(Ok((rank, reason))) => Err(gone(rank, reason)),
            Err(Err(PmixError::Timeout { .. })) => Err(GroupError::Timeout {
                op: OP,
                id: id.to_owned(),
                missing: Vec::new(),
            }),
            Err(Err(e @ PmixError::Invalid { .. })) => Err(GroupError::Invalid {
                op: OP,
                id: id.to_owned(),
                reason: format!(
                    "members construct it with other members or directives ({e}; its log \
                     names them)"
                ),
            }),
            Err(Err(e)) => Err(GroupError::Aborted {
                op: OP,
                id: id.to_owned(),
                reason: format!("the host's PMIx server failed it ({e}); its log may say why"),
            }),
        }
    }

    /// Destructs group `id` at the host if it was constructed there (a collective of its
    /// members); `Ok(false)` when it was not (its destruct is local).
    /// With `notify_termination`, members already known ended are not waited for.
    pub(crate) fn host_destruct(
        &self,
        id: &str,
        members: &[Rank],
        notify_termination: bool,
        timeout: Option<Duration>,
        progress: &mut dyn FnMut(),
    ) -> Result<bool, GroupError> {
        const OP: &str = "group destruct";
        if !lock(&self.groups.at_host).contains(id) {
            return Ok(false);
        }
        let members: Vec<Rank> = members
            .iter()
            .copied()
            .filter(|&r| !notify_termination || self.first_gone(Some(&[r])).is_none())
            .collect();
        let out = self.host_collective(Some(&members), progress, |wait| {
            self.px
                .group_destruct_with(&host_group_id(id), timeout, wait)
        });
        match out {
            Ok(()) => {
                lock(&self.groups.at_host).remove(id);
                Ok(true)
            }
            Err(Ok((rank, reason))) => Err(GroupError::ProcGone {
                op: OP,
                id: id.to_owned(),
                rank,
                reason,
            }),
            Err(Err(PmixError::Timeout { .. })) => Err(GroupError::Timeout {
                op: OP,
                id: id.to_owned(),
                missing: Vec::new(),
            }),
            Err(Err(e)) => Err(GroupError::Aborted {
                op: OP,
                id: id.to_owned(),
                reason: format!("the host's PMIx server: {e}"),
            }),
        }
    }

    /// The group constructed as `id` with `members` (and `left_out`): its PGCID (the
    /// host's, or from the leader's count), and its watch for member-failed events.
    fn constructed(
        &self,
        size: u32,
        id: &str,
        (members, left_out): (Vec<Rank>, Vec<Rank>),
        (leader, leaders): (Rank, u64),
        directives: &GroupDirectives,
        at_host: AtHost,
    ) -> Result<GroupInfo, GroupError> {
        let id = id.to_owned();
        let pgcid = if let AtHost::Yes(Some(p)) = at_host {
            Some(p)
        } else if directives.assign_context_id {
            Some(
                pgcid(size, leader, leaders).ok_or_else(|| GroupError::Invalid {
                    op: "group construct",
                    id: id.clone(),
                    reason: format!(
                    "rank {leader} led more groups than PGCIDs are left for it under a PMIx host"
                ),
                })?,
            )
        } else {
            None
        };
        if directives.notify_termination || directives.leader.is_some() {
            lock(&self.groups.watched).push(Watched {
                id: id.clone(),
                members: members.clone(),
                leader: directives.leader,
                notify: directives.notify_termination,
                lost: Vec::new(),
            });
        }
        Ok(GroupInfo {
            id,
            members,
            pgcid,
            leader: directives.leader,
            left_out,
            directives: directives.clone(),
        })
    }

    /// A construct whose membership the leader decides (directives `optional`,
    /// `notify_termination`, `ft_collective`): the leader reads each member's
    /// contribution (waiting up to the timeout; with `optional` one that has not come by
    /// then is left out, with `notify_termination` or `ft_collective` one that ended is),
    /// checks them, and publishes the outcome, which the other members read. Returns the
    /// members, those left out, and the leader's count of groups led.
    fn decide_by_leader(
        &self,
        cid: &CollId,
        c: &Construct<'_>,
        while_waiting: &mut dyn FnMut(),
    ) -> Result<(Vec<Rank>, Vec<Rank>, u64), GroupError> {
        const OP: &str = "group construct";
        let (leader, timeout) = (c.leader, c.timeout);
        let id = &cid.name;
        let me = self.px.rank();
        let dkey = format!("weft.grpd/{:016x}/{}", digest(id.as_bytes()), cid.seq);
        let host = |e: PmixError| GroupError::Aborted {
            op: OP,
            id: id.clone(),
            reason: format!("the host's PMIx server: {e}"),
        };
        let decision = if me == leader {
            let d = self.gather_contributions(c, while_waiting);
            let bytes = postcard::to_stdvec(&d).unwrap_or_default();
            self.px.put(PScope::Global, &dkey, &bytes).map_err(host)?;
            self.px.commit().map_err(host)?;
            d
        } else {
            let opts = GetOpts {
                timeout: timeout.map(|t| t + DECISION_GRACE),
                ..GetOpts::default()
            };
            match self.fetch(leader, &dkey, opts, while_waiting) {
                Ok(v) => v
                    .as_bytes()
                    .and_then(|b| postcard::from_bytes(b).ok())
                    .ok_or_else(|| GroupError::Invalid {
                        op: OP,
                        id: id.clone(),
                        reason: format!("the leader's (rank {leader}) decision is corrupt"),
                    })?,
                Err(GetError::ProcGone { reason, .. }) => {
                    return Err(GroupError::ProcGone {
                        op: OP,
                        id: id.clone(),
                        rank: leader,
                        reason,
                    })
                }
                Err(GetError::Timeout { .. }) => {
                    return Err(GroupError::Timeout {
                        op: OP,
                        id: id.clone(),
                        missing: vec![leader],
                    })
                }
                Err(e) => {
                    return Err(GroupError::Aborted {
                        op: OP,
                        id: id.clone(),
                        reason: format!("reading the leader's (rank {leader}) decision: {e}"),
                    })
                }
            }
        };
        match decision {
            Decision::Done {
                members,
                left_out,
                count,
            } => {
                if left_out.contains(&me) {
                    return Err(GroupError::Invalid {
                        op: OP,
                        id: id.clone(),
                        reason: format!(
                            "rank {me} was left out: the leader (rank {leader}) completed the \
                             group without it"
                        ),
                    });
                }
                Ok((members, left_out, count))
            }
            Decision::Gone { rank, reason } => Err(GroupError::ProcGone {
                op: OP,
                id: id.clone(),
                rank,
                reason,
            }),
            Decision::Timeout { missing } => Err(GroupError::Timeout {
                op: OP,
                id: id.clone(),
                missing,
            }),
            Decision::Invalid { reason } => Err(GroupError::Invalid {
                op: OP,
                id: id.clone(),
                reason,
            }),
        }
    }

    /// The leader's side of [`Link::decide_by_leader`].
    fn gather_contributions(&self, c: &Construct<'_>, while_waiting: &mut dyn FnMut()) -> Decision {
        let (members, leader, mine, key) = (c.members, c.leader, c.mine, c.key);
        let directives = c.directives;
        let deadline = c.timeout.map(|t| Instant::now() + t);
        let tolerant = directives.notify_termination || directives.ft_collective;
        let (mut joined, mut left_out, mut missing) = (Vec::new(), Vec::new(), Vec::new());
        for &m in members {
            if m == leader {
                joined.push(m);
                continue;
            }
            let opts = GetOpts {
                timeout: deadline.map(|d| {
                    d.saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1))
                }),
                ..GetOpts::default()
            };
            match self.fetch(m, key, opts, while_waiting) {
                Ok(v) => {
                    let theirs: Option<(u64, u64)> =
                        v.as_bytes().and_then(|b| postcard::from_bytes(b).ok());
                    match theirs {
                        Some((d, _)) if d == mine.0 => joined.push(m),
                        Some(_) => {
                            return Decision::Invalid {
                                reason: format!(
                                    "rank {m} constructs it with other members or directives"
                                ),
                            }
                        }
                        None => {
                            return Decision::Invalid {
                                reason: format!("rank {m}'s contribution is corrupt"),
                            }
                        }
                    }
                }
                Err(GetError::ProcGone { .. }) if tolerant => left_out.push(m),
                Err(GetError::ProcGone { reason, .. }) => {
                    return Decision::Gone { rank: m, reason }
                }
                Err(GetError::Timeout { .. }) if directives.optional => left_out.push(m),
                Err(GetError::Timeout { .. }) => missing.push(m),
                Err(e) => {
                    return Decision::Invalid {
                        reason: format!("reading rank {m}'s contribution: {e}"),
                    }
                }
            }
        }
        if !missing.is_empty() {
            return Decision::Timeout { missing };
        }
        Decision::Done {
            members: joined,
            left_out,
            count: mine.1,
        }
    }

    /// Stops watching group `id` (its destruct).
    pub(crate) fn forget_group(&self, id: &str) {
        lock(&self.groups.watched).retain(|g| g.id != id);
    }

    /// The group events due to this process since the last call: for each watched group
    /// a member of which ended, leader-failed (to every member, when it led the group)
    /// and member-failed (with `notify_termination`: to the leader, or every member when
    /// there is none), as Weft's servers send them.
    pub(crate) fn take_events(&self) -> Vec<crate::Event> {
        let mut watched = lock(&self.groups.watched);
        if watched.is_empty() {
            return Vec::new();
        }
        for g in watched.iter() {
            for &r in &g.members {
                self.check_alive(r, false);
            }
        }
        self.read_events();
        let ends = lock(&self.live.ends);
        let me = self.px.rank();
        let mut out = Vec::new();
        for g in watched.iter_mut() {
            let dead: Vec<(Rank, String)> = g
                .members
                .iter()
                .filter(|r| !g.lost.contains(r))
                .filter_map(|&r| ends.gone.get(&r).map(|why| (r, why.clone())))
                .collect();
            for (rank, why) in dead {
                g.lost.push(rank);
                if g.notify {
                    g.members.retain(|&r| r != rank);
                }
                let mut events = Vec::new();
                if g.leader == Some(rank) {
                    g.leader = None;
                    events.push((g.members.clone(), EventCode::LeaderFailed));
                }
                if g.notify {
                    let to = match g.leader {
                        Some(l) => vec![l],
                        None => g.members.clone(),
                    };
                    events.push((to, EventCode::MemberFailed));
                }
                for (to, code) in events {
                    if to.contains(&me) {
                        out.push(crate::Event {
                            code,
                            group: Some(g.id.clone()),
                            rank: Some(rank),
                            pset: None,
                            members: g.members.clone(),
                            reason: format!("rank {rank} {why}"),
                            proc: None,
                        });
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgcids_under_a_pmix_host_are_distinct_and_stay_clear_of_the_reserved_ones() {
        for size in [1u32, 2, 3, 7, 4096] {
            let k = ((1u64 << 22) - 2) / u64::from(size);
            let mut seen = std::collections::HashSet::new();
            let leaders: std::collections::BTreeSet<u32> = [0, size / 2, size - 1].into();
            // Both sides of each leader's first range, and into the second one.
            for &l in &leaders {
                for c in [0, 1, k - 1, k, k + 1, k + 1000] {
                    let id = pgcid(size, l, c).expect("an id");
                    assert!(id >= 2, "the world's id (1) or none: {id}");
                    assert_eq!(id >> 62, 0, "a reserved bit: {id:#x}");
                    if c < k {
                        assert!(id < 1 << 22, "derivable ids stay below 2^22: {id:#x}");
                    }
                    assert!(
                        seen.insert(id),
                        "size {size} leader {l} count {c}: {id:#x} twice"
                    );
                }
            }
        }
        let size = 4;
        let k = ((1u64 << 22) - 2) / 4;
        assert_eq!(pgcid(size, 0, k + (1 << 24)), None, "exhausted");
    }
}

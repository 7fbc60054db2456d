//! The PMIx backend of [`Client`](crate::Client): a process started by an engine that
//! hosts a PMIx server (`mpirun`, `prterun`, `srun --mpi=pmix`) takes its identity, job
//! information and card exchange from that server through `weft-pmix`.
//!
//! What maps how:
//! - job information: size and rank from `PMIx_Init` and `pmix.job.size`; nodes and
//!   placement from `PMIx_Resolve_nodes`/`PMIx_Resolve_peers` (local ranks in rank order
//!   on each node); app numbers from `pmix.appnum`; one process set, `weft://world`;
//! - put/commit: each committed value as a PMIx byte object (Weft's encoding of the
//!   [`Value`]) with the same scope, then `PMIx_Commit`;
//! - fence: `PMIx_Fence` over the ranks, collecting the data in mode Full, not in Sparse
//!   and SyncOnly (Sparse gets fetch on demand);
//! - get: after a Full fence that covered the owner, from what the fence delivered only
//!   (`PMIX_OPTIONAL`: a key it does not hold is `NotFound` at once, as with Weft's
//!   servers); otherwise a direct fetch through the host's servers, waiting up to the
//!   get's timeout for the owner to commit; `local_only`/`immediate` never ask the server.
//!
//! - groups: Weft's own construct over the host's fence (Open MPI 4.1's runtime and
//!   Slurm 22.05 have no PMIx groups): each member puts a digest of the membership and
//!   directives (and the leader its count of groups it led), a collecting fence among
//!   the members moves them, and each member checks the others' digests; the PGCID is
//!   computed from the leader and its count ([`pgcid`]), the same at every member and
//!   unique within the job without a server; a destruct is local (no PGCID is reused).
//!
//! - the transports' shared secret: rank 0 makes one at init and puts it (Global); the
//!   others fetch it on first use.
//!
//! Fences and group constructs run `PMIx_Fence_nb` and keep the client's progress hook
//! running while they wait (a transport's handshakes), as waits on Weft's servers do;
//! gets block in `PMIx_Get`.
//!
//! Not mapped yet (errors say so): events, runtime process sets, the address TCP
//! listens on across nodes (loopback unless `WEFT_TCP_ADDR`/`WEFT_TCP_IF` say), and the
//! `optional`, `notify_termination` and `ft_collective` group directives.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use weft_pmix::{keys as pk, GetOpts as PGetOpts, Pmix, PmixError, PmixValue, Scope as PScope};

use crate::client::{lock, CommitError, FenceError, GetError, GetOpts, InitError};
use crate::group::GroupError;
use crate::job::{AppInfo, JobInfo, NodeInfo, ProcInfo, Pset, PSET_WORLD};
use crate::launcher::WORLD_PGCID;
use crate::proto::{CollId, GroupDirectives, GroupInfo};
use crate::proto::{FenceMode, Procs};
use crate::value::{Scope, Value};
use crate::Rank;

/// The connection to the host's PMIx server, and what the backend remembers.
#[derive(Debug)]
pub(crate) struct Link {
    px: Pmix,
    /// The ranks covered by the last fence of mode Full (`None`: none since the last
    /// fence of another mode): their committed data is here.
    full: Mutex<Option<Procs>>,
    /// The scope of each key this process committed: PMIx shows a process all of its
    /// own data, Weft hides a Remote key on its owner's node, the owner included.
    mine: Mutex<HashMap<String, Scope>>,
    /// Groups with a PGCID this process led (the next one's count).
    led: AtomicU64,
    /// The transports' secret, once known (see [`Link::transport_secret`]).
    secret: std::sync::OnceLock<Option<[u64; 2]>>,
}

/// The key under which rank 0 publishes the job's transport secret.
const SECRET_KEY: &str = "weft.transport-secret";

/// How long a process waits for rank 0's secret (it is put during rank 0's init).
const SECRET_WAIT: Duration = Duration::from_secs(60);

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

/// FNV-1a over bytes.
fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Why the backend cannot go on: the host's message, named as coming from PMIx.
fn init_err(what: &str, e: PmixError) -> InitError {
    InitError::Pmix {
        reason: format!("{what}: {e}"),
    }
}

fn job_u32(px: &Pmix, rank: Option<Rank>, key: &str) -> Result<Option<u32>, PmixError> {
    let opts = PGetOpts {
        local_only: true,
        ..PGetOpts::default()
    };
    match px.get(rank, key, opts) {
        Ok(v) => Ok(v.as_u32()),
        Err(PmixError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Connects to the host's server and builds the job's information from it.
pub(crate) fn connect() -> Result<(Rank, JobInfo, Link), InitError> {
    let px = Pmix::init().map_err(|e| init_err("connecting to the host's PMIx server", e))?;
    let rank = px.rank();
    let size = job_u32(&px, None, pk::JOB_SIZE)
        .map_err(|e| init_err("reading the job size", e))?
        .ok_or_else(|| InitError::Pmix {
            reason: "the host's PMIx server gives no job size (pmix.job.size)".into(),
        })?;
    let names = px
        .nodes()
        .map_err(|e| init_err("reading the job's nodes", e))?;
    let mut placed: Vec<Option<(u32, u32)>> = vec![None; size as usize];
    for (i, name) in names.iter().enumerate() {
        let peers = px
            .peers_on(name)
            .map_err(|e| init_err(&format!("reading the ranks on node {name}"), e))?;
        for (local, &r) in peers.iter().enumerate() {
            if let Some(slot) = placed.get_mut(r as usize) {
                *slot = Some((i as u32, local as u32));
            }
        }
    }
    let program = std::env::args().next().unwrap_or_default();
    let mut procs = Vec::with_capacity(size as usize);
    let mut apps: Vec<AppInfo> = Vec::new();
    for r in 0..size {
        let Some((node, local_rank)) = placed[r as usize] else {
            return Err(InitError::Pmix {
                reason: format!(
                    "the host's PMIx server places rank {r} on none of its nodes {names:?}"
                ),
            });
        };
        let app = job_u32(&px, Some(r), pk::APPNUM)
            .map_err(|e| init_err("reading app numbers", e))?
            .unwrap_or(0);
        match apps.get_mut(app as usize) {
            Some(a) => a.size += 1,
            None => {
                while apps.len() < app as usize {
                    apps.push(AppInfo {
                        size: 0,
                        first_rank: r,
                        program: String::new(),
                        pset: None,
                    });
                }
                apps.push(AppInfo {
                    size: 1,
                    first_rank: r,
                    program: program.clone(),
                    pset: None,
                });
            }
        }
        procs.push(ProcInfo {
            node,
            local_rank,
            app,
            cpuset: None,
        });
    }
    if rank == 0 {
        // The transports' secret: made here, read by the others on demand (direct
        // modex); only the job's processes can ask the host's servers for it.
        let secret = [crate::server::random_u64(), crate::server::random_u64()];
        let bytes = postcard::to_stdvec(&secret).unwrap_or_default();
        px.put(PScope::Global, SECRET_KEY, &bytes)
            .and_then(|()| px.commit())
            .map_err(|e| init_err("publishing the transports' secret", e))?;
    }
    let job = JobInfo {
        nspace: px.nspace().to_owned(),
        nodes: names
            .iter()
            .enumerate()
            .map(|(i, h)| NodeInfo {
                id: i as u32,
                hostname: h.clone(),
            })
            .collect(),
        procs,
        apps,
        psets: vec![Pset {
            name: PSET_WORLD.to_owned(),
            members: (0..size).collect(),
        }],
        world_pgcid: WORLD_PGCID,
    };
    Ok((
        rank,
        job,
        Link {
            px,
            full: Mutex::new(None),
            mine: Mutex::new(HashMap::new()),
            led: AtomicU64::new(0),
            secret: std::sync::OnceLock::new(),
        },
    ))
}

impl Link {
    /// A secret shared by the job's processes (rank 0 made it at init; the others fetch
    /// it once through the host), or `None` if it cannot be had (then the transports
    /// that need it stay closed, saying why).
    pub(crate) fn transport_secret(&self) -> Option<[u64; 2]> {
        *self.secret.get_or_init(|| {
            let deadline = std::time::Instant::now() + SECRET_WAIT;
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let opts = PGetOpts {
                    timeout: Some(left),
                    ..PGetOpts::default()
                };
                match self.px.get(Some(0), SECRET_KEY, opts) {
                    Ok(v) => return v.as_bytes().and_then(|b| postcard::from_bytes(b).ok()),
                    // Some hosts (Slurm) answer a fetch that arrives before the owner's
                    // commit with "not found" instead of waiting: ask again.
                    Err(PmixError::NotFound { .. }) if !left.is_zero() => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => {
                        tracing::warn!("the transports' secret from rank 0: {e}");
                        return None;
                    }
                }
            }
        })
    }

    /// Puts the committed entries and commits them.
    pub(crate) fn commit(&self, entries: &[(Scope, String, Value)]) -> Result<(), CommitError> {
        let mut mine = lock(&self.mine);
        for (scope, key, value) in entries {
            mine.insert(key.clone(), *scope);
            let scope = match scope {
                Scope::Local => PScope::Local,
                Scope::Remote => PScope::Remote,
                Scope::Global => PScope::Global,
            };
            let bytes = postcard::to_stdvec(value).map_err(|e| CommitError::Pmix {
                reason: format!("encoding {key:?}: {e}"),
            })?;
            self.px
                .put(scope, key, &bytes)
                .map_err(|e| CommitError::Pmix {
                    reason: e.to_string(),
                })?;
        }
        self.px.commit().map_err(|e| CommitError::Pmix {
            reason: e.to_string(),
        })
    }

    /// A fence over `procs` (normalized and checked by the caller).
    pub(crate) fn fence(
        &self,
        procs: &Procs,
        mode: FenceMode,
        timeout: Option<Duration>,
        while_waiting: impl FnMut(),
    ) -> Result<(), FenceError> {
        let ranks = match procs {
            Procs::All => None,
            Procs::List(v) => Some(v.as_slice()),
        };
        let collect = mode == FenceMode::Full;
        match self.px.fence_with(ranks, collect, timeout, while_waiting) {
            Ok(()) => {
                *lock(&self.full) = collect.then(|| procs.clone());
                Ok(())
            }
            // PMIx does not say who was missing.
            Err(PmixError::Timeout { .. }) => Err(FenceError::Timeout {
                missing: Vec::new(),
            }),
            Err(e) => Err(FenceError::Pmix {
                reason: e.to_string(),
            }),
        }
    }

    /// Reads `key` of `rank` (see the module's documentation).
    pub(crate) fn get(&self, rank: Rank, key: &str, opts: GetOpts) -> Result<Value, GetError> {
        let delivered = lock(&self.full).as_ref().is_some_and(|p| p.contains(rank));
        let here_only = opts.local_only || opts.immediate || (delivered && !opts.refresh);
        let popts = PGetOpts {
            timeout: opts.timeout,
            local_only: here_only,
            refresh: opts.refresh,
        };
        let not_found = |reason: String| GetError::NotFound {
            rank,
            key: key.to_owned(),
            reason,
        };
        if rank == self.px.rank() && lock(&self.mine).get(key) == Some(&Scope::Remote) {
            return Err(not_found(
                "it was put with scope Remote: visible only on other nodes".into(),
            ));
        }
        match self.px.get(Some(rank), key, popts) {
            Ok(PmixValue::Bytes(b)) => postcard::from_bytes(&b).map_err(|e| GetError::Corrupt {
                rank,
                key: key.to_owned(),
                reason: e.to_string(),
            }),
            Ok(other) => Err(GetError::Corrupt {
                rank,
                key: key.to_owned(),
                reason: format!("not a value Weft put (PMIx value {other:?})"),
            }),
            Err(PmixError::NotFound { .. }) if delivered && !opts.local_only && !opts.immediate => {
                Err(not_found(
                    "not among what it committed before the last Full fence (PMIx host)".into(),
                ))
            }
            Err(PmixError::NotFound { .. }) => Err(not_found(if here_only {
                "not on this node (local-only get, PMIx host)".into()
            } else {
                "the host's PMIx server has no such key of it".into()
            })),
            Err(PmixError::Timeout { .. }) => Err(GetError::Timeout {
                rank,
                key: key.to_owned(),
                missing: vec![rank],
            }),
            Err(e) => Err(GetError::Failed {
                rank,
                key: key.to_owned(),
                reason: e.to_string(),
            }),
        }
    }

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
        if directives.optional || directives.notify_termination || directives.ft_collective {
            return Err(invalid(
                "the optional, notify_termination and ft_collective directives are not \
                 supported under a PMIx host yet"
                    .into(),
            ));
        }
        let members = cid.procs.ranks(size);
        let leader = directives.leader.unwrap_or(members[0]);
        if !members.contains(&leader) {
            return Err(invalid(format!("the leader {leader} is not a member")));
        }
        let me = self.px.rank();
        let count = if me == leader && directives.assign_context_id {
            // Relaxed: a counter of this process's own constructs.
            self.led.fetch_add(1, Ordering::Relaxed)
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
        match self
            .px
            .fence_with(Some(&members), true, timeout, while_waiting)
        {
            Ok(()) => {}
            Err(PmixError::Timeout { .. }) => {
                return Err(GroupError::Timeout {
                    op: OP,
                    id: id.clone(),
                    missing: Vec::new(),
                })
            }
            Err(e) => return Err(host(e)),
        }
        let here = PGetOpts {
            local_only: true,
            ..PGetOpts::default()
        };
        let mut leaders = 0;
        for &m in &members {
            let got = self.px.get(Some(m), &key, here).map_err(host)?;
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
        let pgcid = if directives.assign_context_id {
            Some(pgcid(size, leader, leaders).ok_or_else(|| {
                invalid(format!(
                    "rank {leader} led more groups than PGCIDs are left for it under a PMIx host"
                ))
            })?)
        } else {
            None
        };
        Ok(GroupInfo {
            id: id.clone(),
            members,
            pgcid,
            leader: directives.leader,
            left_out: Vec::new(),
            directives: directives.clone(),
        })
    }

    /// `PMIx_Finalize`.
    pub(crate) fn finalize(&self) -> Result<(), String> {
        self.px.finalize_shared().map_err(|e| e.to_string())
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

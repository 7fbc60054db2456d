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
//! Not mapped yet (errors say so): groups, events, runtime process sets, the transports'
//! shared secret (so no TCP between nodes), and the progress hook while a PMIx call
//! blocks.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use weft_pmix::{keys as pk, GetOpts as PGetOpts, Pmix, PmixError, PmixValue, Scope as PScope};

use crate::client::{lock, CommitError, FenceError, GetError, GetOpts, InitError};
use crate::job::{AppInfo, JobInfo, NodeInfo, ProcInfo, Pset, PSET_WORLD};
use crate::launcher::WORLD_PGCID;
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
        },
    ))
}

impl Link {
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
    ) -> Result<(), FenceError> {
        let ranks = match procs {
            Procs::All => None,
            Procs::List(v) => Some(v.as_slice()),
        };
        let collect = mode == FenceMode::Full;
        match self.px.fence(ranks, collect, timeout) {
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

    /// `PMIx_Finalize`.
    pub(crate) fn finalize(&self) -> Result<(), String> {
        self.px.finalize_shared().map_err(|e| e.to_string())
    }
}

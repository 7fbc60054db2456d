//! Weft's wire-up client: the PMIx-style library with which processes exchange business
//! cards, and the protocol it shares with the runtime (crate `weft-runtime`: the launcher,
//! `weft run`, and one server per node).
//!
//! A job is launched by `weft_runtime::launcher::run`: it starts one server per (logical)
//! node, each server starts its node's processes, and each process calls
//! [`Client::init`] to connect to its server (or, under another engine's launcher, to
//! that engine's PMIx server). Cards are published with [`Client::put`] and [`Client::commit`], made
//! available with [`Client::fence`] (Full, Sparse or SyncOnly) and read with
//! [`Client::get`]; job-level information ([`JobInfo`]) is available right after init from
//! the node's shared-memory datastore, with no round trip.
//!
//! ```no_run
//! use std::time::Duration;
//! use weft_wireup::{Client, FenceMode, GetOpts, Procs, Scope};
//! let wire = Client::init()?;
//! wire.put(Scope::Remote, "my.card", vec![1u8, 2, 3])?;
//! wire.commit()?;
//! wire.fence(Procs::All, FenceMode::Sparse, Some(Duration::from_secs(30)))?;
//! let card = wire.get(1, "my.card", GetOpts::default())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

mod client;
mod conn;
mod connect;
mod control;
mod cpulist;
mod event;
#[doc(hidden)]
pub mod frame;
mod group;
mod handoff;
#[doc(hidden)]
pub mod job;
#[doc(hidden)]
pub mod marker;
mod names;
#[cfg(feature = "pmix")]
mod pmix;
#[doc(hidden)]
pub mod proto;
mod publish;
mod spawn;
mod value;

/// Tunables of the wire-up client, listed by `weft info`.
pub const TUNABLES: &[weft_tunables::Tunable] = &[
    weft_tunables::Tunable::new(
        "WEFT_WIREUP",
        "auto",
        "wire-up backend of Client::init: weft (weft run's servers), pmix (the host engine's PMIx server), auto (weft under weft run, else pmix when the environment names a PMIx server)",
    ),
    weft_tunables::Tunable::new(
        "WEFT_WIREUP_REQUEST_TIMEOUT",
        "60s",
        "how long a request to the node's server that has no timeout of its own (group queries, group leave, leader claims, process-set definitions and deletions) waits for the answer",
    ),
];

/// The reason a rank reported gone gives when it finalized cleanly (every other reason
/// is a failure: an exit before finalize, a signal, a lost connection).
pub const FINALIZED: &str = "has finalized";

#[doc(hidden)]
pub use client::keys;
pub use client::{
    backend_choice, in_a_job, Client, CommitError, FenceError, FinalizeError, GetError, GetOpts,
    InitError,
};
pub use conn::ConnError;
pub use connect::ConnectError;
pub use control::ControlError;
pub use cpulist::{CpuList, CpuListError};
pub use event::{EventCodes, EventFlow, EventResults, HandlerId, RequestError, EVENT_CACHE};
pub use group::{GroupError, PendingConstruct, PendingDestruct};
pub use job::{AppInfo, JobInfo, NodeInfo, ProcInfo, Pset, PSET_SELF, PSET_WORLD};
pub use names::{Names, NamesError, NsId, ProcId, ProcSel, MAX_NSPACE_LEN};
pub use proto::{
    AllocOp, AllocRequest, Allocation, ConnectFailure, Connection, Event, EventCode, FenceMode,
    GroupDirectives, GroupInfo, JobAction, NameFailure, NameRange, NameValue, Persistence, Procs,
    Published, SessionRef, SpawnApp, SpawnOptions, PROTOCOL_VERSION,
};
pub use publish::{LookupOptions, NameError};
pub use spawn::{SpawnError, Spawned};
pub use value::{Scope, Value};

/// A process's rank within its job (its namespace).
pub type Rank = u32;

/// Names of the environment variables the launcher sets for every process.
pub mod env {
    /// The process's rank in the job.
    pub const RANK: &str = "WEFT_RANK";
    /// The number of processes in the job.
    pub const SIZE: &str = "WEFT_SIZE";
    /// The process's rank among the processes of its node.
    pub const LOCAL_RANK: &str = "WEFT_LOCAL_RANK";
    /// The number of processes on the process's node.
    pub const LOCAL_SIZE: &str = "WEFT_LOCAL_SIZE";
    /// The id of the node the process runs on.
    pub const NODE: &str = "WEFT_NODE";
    /// The job's namespace.
    pub const NSPACE: &str = "WEFT_NSPACE";
    /// The job's namespace id in its runtime (a number, 1 under a plain `weft run`): the
    /// process's hello names it beside its rank.
    pub const NSID: &str = "WEFT_NSID";
    /// Path of the node server's Unix socket.
    pub const SERVER_SOCKET: &str = "WEFT_SERVER_SOCKET";
    /// The per-process token that proves the process's identity to its server.
    pub const TOKEN: &str = "WEFT_TOKEN";
    /// Name of the node's shared-memory datastore segment.
    pub const DATASTORE: &str = "WEFT_DATASTORE";
    /// The app context (0-based) the process belongs to.
    pub const APPNUM: &str = "WEFT_APPNUM";
    /// The pid of the node's server (the process's parent).
    pub const SERVER_PID: &str = "WEFT_SERVER_PID";
    /// The number of the job's processes on this machine, when the launcher knows it
    /// (logical nodes on one machine); otherwise the node's process count applies.
    pub const HOST_PROCS: &str = "WEFT_HOST_PROCS";
    /// Set (to 1) when the job stops in init for a debugger: the server's welcome comes
    /// once the job is released, so the process waits for it without a time limit.
    pub const HELD: &str = "WEFT_HELD";
}

//! Weft: a communication fabric for HPC.
//!
//! This facade re-exports the layers: `wireup` (the PMIx-style wire-up client, over
//! `weft run`'s servers or a host engine's PMIx server), `fabric` (sessions, groups,
//! communicators and tagged point-to-point over shared memory, verbs and TCP),
//! `collectives` (barrier, bcast, allreduce, ... and their non-blocking forms; dup and
//! split) and `runtime` (the launcher and the per-node servers, which also host MPICH
//! programs over PMI-1). Depend on this crate and reach the layers through it.
//!
//! Cargo features: `shm`, `tcp`, `verbs` and `collectives` are on by default; `pmix` (the PMIx client backend: run under `mpirun` or `srun --mpi=pmix`;
//! links libpmix) and `runtime` (the launcher and servers as a library; pulls tokio) are
//! off. The `weft` command is the `weft-cli` package.
//!
//! ```no_run
//! use weft::prelude::*;
//! let fabric = Fabric::init()?;
//! let world = fabric.world();
//! let right = (world.rank() + 1) % world.size();
//! world.send(&[world.rank() as u64], right, Tag(7))?;
//! let mut got = [0u64; 1];
//! let status = world.recv(&mut got, Source::Any, Tag(7))?;
//! let mut sum = [0u64; 1];
//! world.allreduce(&[world.rank() as u64], &mut sum, Op::Sum)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

#[cfg(feature = "collectives")]
pub use weft_collectives as collectives;
pub use weft_fabric as fabric;
#[cfg(feature = "runtime")]
pub use weft_runtime as runtime;
pub use weft_wireup as wireup;

/// Every component's tunables, by component: what `weft info` prints, and what
/// [`tunables_markdown`] writes into `docs/tunables.md` (a test keeps the two equal).
pub const TUNABLE_TABLES: &[(&str, &[weft_tunables::Tunable])] = &[
    #[cfg(feature = "runtime")]
    (
        "the launcher and servers (weft-runtime)",
        weft_runtime::TUNABLES,
    ),
    ("the wire-up client (weft-wireup)", weft_wireup::TUNABLES),
    ("shared memory (weft-shm)", weft_shm::TUNABLES),
    ("the fabric (weft-fabric)", weft_fabric::TUNABLES),
    #[cfg(feature = "verbs")]
    ("verbs (weft-verbs)", weft_verbs::TUNABLES),
    #[cfg(feature = "tcp")]
    ("TCP (weft-tcp)", weft_tcp::TUNABLES),
    #[cfg(feature = "collectives")]
    ("collectives (weft-collectives)", weft_collectives::TUNABLES),
];

/// The tunables reference (`docs/tunables.md`), made from [`TUNABLE_TABLES`].
pub fn tunables_markdown() -> String {
    let mut md = String::from(
        "# Tunables\n\n\
         Generated from the tables `weft info` prints (`weft::TUNABLE_TABLES`); a test fails \
         when this file and the tables disagree (`WEFT_BLESS=1 cargo test --test docs` \
         writes it anew). Syntax, for all of them: unset, empty or `auto` is the default; \
         sizes take binary suffixes (`64k`, `4m`, `1g`, also `KiB`); durations take `ms` or \
         `s` (a bare number is milliseconds); switches are `on`/`off` (or `1`/`0`, \
         `true`/`false`, `yes`/`no`).\n",
    );
    for (component, table) in TUNABLE_TABLES {
        md.push_str(&format!(
            "\n## {component}\n\n| Variable | Default | Meaning |\n|---|---|---|\n"
        ));
        for t in table.iter() {
            let meaning = t.meaning.replace('|', "\\|");
            md.push_str(&format!("| `{}` | `{}` | {meaning} |\n", t.name, t.default));
        }
    }
    md
}

/// The names most programs need.
pub mod prelude {
    #[cfg(feature = "collectives")]
    pub use weft_collectives::{
        CollError, Collectives, Element, FabricGroup, Loc, NonBlocking, Op, SplitType,
    };
    pub use weft_fabric::{
        wait_all, wait_any, CommError, Communicator, ErrHandler, Fabric, Group, GroupCompare, Info,
        InterComm, InterCommError, P2pError, Pod, Request, Session, SessionError, Source, Status,
        Tag, ThreadLevel,
    };
    pub use weft_wireup::{
        Client, FenceError, FenceMode, GetError, GetOpts, GroupDirectives, ProcId, Procs, Scope,
        SpawnApp, Value,
    };
}

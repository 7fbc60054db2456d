//! Weft: a communication fabric for HPC.
//!
//! This facade re-exports the layers: [`wireup`] (the PMIx-style wire-up client, over
//! `weft run`'s servers or a host engine's PMIx server), [`runtime`] (the launcher and
//! the per-node servers, which also host MPICH programs over PMI-1), [`fabric`]
//! (sessions, groups, communicators and tagged point-to-point over shared memory, verbs
//! and TCP) and [`collectives`] (barrier, bcast, allreduce, ... and their non-blocking
//! forms; dup and split). Depend on this crate and reach the layers through it.
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

pub use weft_collectives as collectives;
pub use weft_fabric as fabric;
pub use weft_runtime as runtime;
pub use weft_wireup as wireup;

/// The names most programs need.
pub mod prelude {
    pub use weft_collectives::{
        CollError, Collectives, Element, FabricGroup, Loc, NonBlocking, Op, SplitType,
    };
    pub use weft_fabric::{
        wait_all, wait_any, CommError, Communicator, ErrHandler, Fabric, Group, GroupCompare, Info,
        P2pError, Pod, Request, Session, SessionError, Source, Status, Tag, ThreadLevel,
    };
    pub use weft_wireup::{
        Client, FenceError, FenceMode, GetError, GetOpts, GroupDirectives, Procs, Scope, Value,
    };
}

//! Weft's runtime: the launcher (`weft run`, [`launcher::run`]) and the per-node wire-up
//! server (`weft server`, [`server::run`]) that starts a node's processes, keeps its
//! datastore and runs fences, gets, groups and process sets with the other nodes'
//! servers. Processes talk to it through `weft-wireup`'s client, whose protocol
//! (`weft_wireup::proto`) both sides share; the messages only servers and the launcher
//! exchange, and the async frame codec, are this crate's ([`wire`]), and so is the
//! machine's topology ([`topology`], hwloc), so that an application links neither.
#![forbid(unsafe_code)]

pub mod jobdir;
pub mod launcher;
mod process;
pub mod topology;
#[doc(hidden)]
pub mod wire;

/// Tunables of the launcher and servers, listed by `weft info`.
pub const TUNABLES: &[weft_tunables::Tunable] = &[
    weft_tunables::Tunable::new(
        "WEFT_LOG",
        "warn",
        "log filter of the launcher and servers (error, warn, info, debug)",
    ),
    weft_tunables::Tunable::new(
        "WEFT_RUN_GRACE_MS",
        "1000",
        "after a process fails, how long before the others are terminated (SIGTERM, SIGKILL 0.5 s later); ms, or with a unit ms or s",
    ),
    weft_tunables::Tunable::new(
        "WEFT_PMIX_QUICKACK",
        "on",
        "acknowledge at once what hosted PMIx clients send to the node's server (TCP_QUICKACK on its ends of their connections): OpenPMIx 4.2's client does not set TCP_NODELAY, so a small request behind an unacknowledged one otherwise waits for the delayed ACK, up to 40 ms",
    ),
    weft_tunables::Tunable::new(
        "WEFT_DATASTORE_BYTES",
        "256m",
        "size of each node's datastore segment (sparse; an eighth is kept for processes' ends)",
    ),
];

/// A launcher tunable's value, or its default (with a warning naming the variable) when
/// the value set is not valid.
pub(crate) fn tunable_or_default<T>(
    name: &str,
    read: impl Fn(weft_tunables::Lookup<'_>) -> Result<T, weft_tunables::BadTunable>,
) -> T {
    read(&weft_tunables::env).unwrap_or_else(|e| {
        let d = weft_tunables::find(TUNABLES, name).default;
        eprintln!("weft: {e}; using the default, {d}");
        read(&|_: &str| None).unwrap_or_else(|e| panic!("the default of {name}: {e}"))
    })
}
mod modex;
pub mod server;

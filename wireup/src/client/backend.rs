//! Which wire-up service a client uses (`WEFT_WIREUP`, the environment) and what each
//! brings: [`Backend`], chosen once by [`Client::init`](crate::Client::init).

use weft_shm::StoreReader;

use super::InitError;
use crate::conn::Conn;
use crate::env;
use crate::job::NodeNet;

/// Which wire-up service a process uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Choice {
    /// Weft's own servers (`weft run`).
    Weft,
    /// A host engine's PMIx server.
    Pmix,
}

/// The wire-up service a [`Client`](crate::Client) uses, chosen once by
/// [`Client::init`](crate::Client::init).
#[derive(Debug)]
#[cfg_attr(
    feature = "pmix",
    expect(
        clippy::large_enum_variant,
        reason = "one per process, inside its Client: boxing would only add an indirection"
    )
)]
pub(crate) enum Backend {
    /// Weft's own servers (`weft run`).
    Native {
        /// The connection to the node's server.
        conn: Conn,
        /// The node's datastore.
        store: StoreReader,
        /// The node's address and the transports' secret, from the datastore (absent
        /// only under a server that predates them).
        net: Option<NodeNet>,
        /// The server's pid when it is this process's parent (as under `weft run`): a
        /// parent that changes means the server died.
        server_pid: Option<rustix::process::Pid>,
    },
    /// A host engine's PMIx server (mpirun, prterun, srun).
    #[cfg(feature = "pmix")]
    Pmix(crate::pmix::Link),
}

/// Why a request that only Weft's servers answer fails under a PMIx host.
#[cfg(feature = "pmix")]
pub(super) const NOT_UNDER_PMIX: &str =
    "this process runs under a PMIx host (mpirun, prterun or srun), \
    not `weft run`: group queries, invitations, joins and leader claims, and runtime process \
    sets are not mapped onto PMIx yet";

/// The PMIx server contact in this process's environment (its namespace, and the
/// `PMIX_SERVER_URI*` variable naming the server), if there is one.
#[cfg(feature = "pmix")]
fn pmix_contact() -> Option<(String, Option<String>)> {
    weft_pmix::server_contact().map(|c| (c.nspace, c.uri_var))
}

/// The PMIx server contact in this process's environment (its namespace, and the
/// `PMIX_SERVER_URI*` variable naming the server), if there is one: read as
/// `weft_pmix::server_contact` reads it, so that a build without the `pmix` feature
/// still tells that it runs under a PMIx host.
#[cfg(not(feature = "pmix"))]
fn pmix_contact() -> Option<(String, Option<String>)> {
    let nspace = std::env::var("PMIX_NAMESPACE").ok()?;
    let uri = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("PMIX_SERVER_URI"))
        .max();
    Some((nspace, uri))
}

/// `WEFT_WIREUP` (`weft`, `pmix` or `auto`, the default: Weft's servers when `weft run`
/// started the process, else a PMIx server whose contact is in the environment).
pub(super) fn backend() -> Result<Choice, InitError> {
    let t = weft_tunables::find(crate::TUNABLES, "WEFT_WIREUP");
    let choice = t
        .choice(&["weft", "pmix", "auto"])
        .map_err(|e| InitError::BadEnv {
            var: e.name,
            value: e.value,
            reason: format!("expected {}", e.expected),
        })?;
    Ok(match choice {
        "weft" => Choice::Weft,
        "pmix" => Choice::Pmix,
        _ if std::env::var_os(env::RANK).is_none() && pmix_contact().is_some() => Choice::Pmix,
        _ => Choice::Weft,
    })
}

/// Whether this process was started as a rank of a job: by `weft run`, or by a host
/// engine whose PMIx server `Client::init` would use. Programs that launch themselves
/// when started alone (the benchmarks) ask this.
pub fn in_a_job() -> bool {
    std::env::var_os(env::RANK).is_some()
        || (matches!(backend(), Ok(Choice::Pmix)) && pmix_contact().is_some())
}

/// The wire-up backend `Client::init` would choose in this environment, and why (for
/// `weft info`).
pub fn backend_choice() -> String {
    match backend() {
        Ok(Choice::Weft) if std::env::var_os(env::RANK).is_some() => {
            "weft (started by `weft run`)".into()
        }
        Ok(Choice::Weft) => {
            "weft (no PMIx server in the environment; start programs with `weft run`)".into()
        }
        Ok(Choice::Pmix) => match pmix_contact() {
            Some((nspace, uri_var)) => format!(
                "pmix (the host's PMIx server: namespace {nspace}, {}){}",
                uri_var.as_deref().unwrap_or("no PMIX_SERVER_URI* variable"),
                if cfg!(feature = "pmix") {
                    ""
                } else {
                    ", but this build has no PMIx backend (the `pmix` feature of weft-wireup is off)"
                }
            ),
            None => "pmix (WEFT_WIREUP=pmix, but no PMIx server in the environment)".into(),
        },
        Err(e) => format!("none: {e}"),
    }
}

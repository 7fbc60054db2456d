//! Starting a new job from a running process (`Client::spawn`): the caller's server asks
//! the runtime to plan and start the job on its servers, and answers once every process
//! of it was started (as `PMIx_Spawn` does: started, not yet initialized).

use crate::client::Client;
use crate::names::NsId;
use crate::proto::{ClientMsg, ServerMsg, SpawnApp, SpawnOptions, WireError};
use crate::ConnError;

/// A job started by [`Client::spawn`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spawned {
    /// Its namespace id in the runtime.
    pub ns: NsId,
    /// Its namespace's name (what its processes read as their nspace).
    pub nspace: String,
}

/// Why a spawn failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The request names nothing to start, or an app of no process.
    #[error("spawn: {0}")]
    Invalid(String),
    /// The runtime refused or could not start the job.
    #[error("spawn refused: {0}")]
    Refused(String),
    /// The connection to the server failed (or there is none: under a PMIx host such as
    /// `mpirun` or `srun`, there is no Weft runtime to spawn in).
    #[error(transparent)]
    Conn(#[from] ConnError),
}

impl Client {
    /// Starts a new job of `apps` in this process's runtime and returns its namespace once
    /// every process of it was started. Its processes get the caller's job's environment
    /// plus each app's `env`; `weft run` waits for them before it exits (its exit status
    /// stays the first job's). It runs in the caller's session and ends with the caller's
    /// job ([`Client::spawn_with`] chooses otherwise).
    pub fn spawn(&self, apps: &[SpawnApp]) -> Result<Spawned, SpawnError> {
        self.spawn_with(apps, &SpawnOptions::default())
    }

    /// [`Client::spawn`] in the allocation session `opts.session` (on its nodes; an
    /// unknown one is refused, naming it), and outliving the caller's job when
    /// `opts.separate`.
    pub fn spawn_with(
        &self,
        apps: &[SpawnApp],
        opts: &SpawnOptions,
    ) -> Result<Spawned, SpawnError> {
        if apps.is_empty() {
            return Err(SpawnError::Invalid("no app to start".into()));
        }
        if let Some(a) = apps.iter().find(|a| a.np == 0 || a.program.is_empty()) {
            return Err(SpawnError::Invalid(format!(
                "app {:?} with {} processes: every app needs a program and at least one process",
                a.program, a.np
            )));
        }
        let apps = apps.to_vec();
        let opts = opts.clone();
        let reply = self
            .server("spawn")
            .and_then(|c| c.call_bounded("spawn", |req| ClientMsg::Spawn { req, apps, opts }));
        self.dispatch_events();
        match reply? {
            ServerMsg::Spawned { ns, nspace, .. } => Ok(Spawned { ns, nspace }),
            ServerMsg::Failed { error, .. } => Err(SpawnError::Refused(match error {
                WireError::Invalid { reason, .. }
                | WireError::Aborted { reason, .. }
                | WireError::ProcGone { reason, .. } => reason,
                WireError::Timeout { missing, .. } => format!("timed out waiting for {missing:?}"),
            })),
            other => Err(SpawnError::Refused(format!("unexpected reply {other:?}"))),
        }
    }
}

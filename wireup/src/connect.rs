//! Connecting processes of several jobs, the native counterpart of `PMIx_Connect` and
//! `PMIx_Disconnect`: every process named makes the same call, and each gets the same
//! [`Connection`] (the processes, their nodes, and a context id unique in the runtime).
//! Connected processes may read each other's data and learn of each other's end; a
//! disconnect undoes that.

use std::time::Duration;

use crate::client::{ms, Backend, Client};
use crate::names::{ProcId, ProcSel};
use crate::proto::{ClientMsg, ConnectFailure, Connection, ServerMsg};
use crate::ConnError;
use crate::{GetError, GetOpts, Value};

/// Why a connect or disconnect failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The request is wrong: no process named, the caller not among them, a job or rank
    /// the runtime does not have.
    #[error("{op}: {reason}")]
    Invalid {
        /// The call.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A process named ended before it made the call: it cannot complete.
    #[error("{op} failed: {reason}")]
    ProcGone {
        /// The call.
        op: &'static str,
        /// Which process, and why it ended.
        reason: String,
    },
    /// The timeout passed before every process named made the call.
    #[error("{op} timed out: {reason}")]
    Timeout {
        /// The call.
        op: &'static str,
        /// Who had not made it (as far as this node knows).
        reason: String,
    },
    /// The connection to the server failed (or there is none: under a PMIx host such as
    /// `mpirun`, use `PMIx_Connect`).
    #[error(transparent)]
    Conn(#[from] ConnError),
}

impl Client {
    /// Connects with `procs` (whole jobs or single processes of any jobs of the runtime;
    /// the caller must be among them): returns once every process named made this call
    /// with the same set (in any order), each getting the same [`Connection`]. A process
    /// named that ends first fails the call for all, naming it; `timeout` bounds the wait
    /// (`None`: no limit but the processes' lives). Each caller's timeout is its own, and
    /// the first to pass fails the call for every process, as a participant that left
    /// would.
    pub fn connect(
        &self,
        procs: &[ProcSel],
        timeout: Option<Duration>,
    ) -> Result<Connection, ConnectError> {
        match self.connect_call("connect", procs, false, timeout)? {
            Some(c) => Ok(c),
            None => Err(ConnectError::Invalid {
                op: "connect",
                reason: "the server answered a connect as a disconnect".into(),
            }),
        }
    }

    /// Disconnects from `procs`, which must name the same processes as the connect: a
    /// collective like it. Afterwards a process of another job named there can no longer
    /// be read from (unless another connect still joins the two jobs).
    pub fn disconnect(
        &self,
        procs: &[ProcSel],
        timeout: Option<Duration>,
    ) -> Result<(), ConnectError> {
        self.connect_call("disconnect", procs, true, timeout)
            .map(|_| ())
    }

    /// Why process `p` is gone (died or finalized), if its end has reached this node: a
    /// process of this job ([`gone_reason`](Self::gone_reason)) or of a job connected
    /// with it ([`Client::connect`]); `None` for any other. A lookup in the node's shared
    /// memory, like `gone_reason`. Under a PMIx host, only this job's processes are
    /// known.
    pub fn gone_proc(&self, p: ProcId) -> Option<String> {
        if p.ns == self.ns() {
            return self.gone_reason(p.rank);
        }
        match self.backend() {
            Backend::Native { store, .. } => store
                .get(&crate::client::keys::gone_proc(p))
                .map(|b| String::from_utf8_lossy(b).into_owned()),
            #[cfg(feature = "pmix")]
            Backend::Pmix(_) => None,
        }
    }

    /// Reads `key` of process `p`, of this job ([`get`](Self::get)) or of a job connected
    /// with it ([`Client::connect`]): from its server (the owner's node's, as for a
    /// get of another node's rank), which waits for the owner to commit it as `opts`
    /// say. A process of a job not connected with this one is refused, naming its
    /// namespace. Under a PMIx host, only this job's processes.
    pub fn get_proc(&self, p: ProcId, key: &str, opts: GetOpts) -> Result<Value, GetError> {
        if p.ns == self.ns() {
            return self.get(p.rank, key, opts);
        }
        match self.backend() {
            Backend::Native { conn, .. } => self.get_from_server(conn, p, key, opts),
            #[cfg(feature = "pmix")]
            Backend::Pmix(_) => Err(GetError::Failed {
                rank: p.rank,
                key: key.to_owned(),
                reason: format!("{p} is of another job: under a PMIx host, read it with PMIx_Get"),
            }),
        }
    }

    fn connect_call(
        &self,
        op: &'static str,
        procs: &[ProcSel],
        disconnect: bool,
        timeout: Option<Duration>,
    ) -> Result<Option<Connection>, ConnectError> {
        let me = self.me();
        if !procs.iter().any(|p| p.contains(me)) {
            return Err(ConnectError::Invalid {
                op,
                reason: format!("the caller ({me}) is not among the processes named"),
            });
        }
        let procs = procs.to_vec();
        let timeout_ms = ms(timeout);
        let reply = self.server(op).and_then(|c| {
            c.call(
                op,
                |req| ClientMsg::Connect {
                    req,
                    procs,
                    disconnect,
                    timeout_ms,
                },
                timeout,
            )
        });
        self.dispatch_events();
        match reply? {
            ServerMsg::Connected { result, .. } => result.map_err(|f| match f {
                ConnectFailure::Invalid(reason) => ConnectError::Invalid { op, reason },
                ConnectFailure::Gone(reason) => ConnectError::ProcGone { op, reason },
                ConnectFailure::Timeout(reason) => ConnectError::Timeout { op, reason },
            }),
            other => Err(ConnectError::Invalid {
                op,
                reason: format!("unexpected reply {other:?}"),
            }),
        }
    }
}

//! Runtime control from a running process, the native counterparts of
//! `PMIx_Job_control` and `PMIx_Allocation_request`: signal, pause, resume, terminate or
//! kill jobs and processes of the runtime ([`Client::job_control`]), and carve allocation
//! sessions out of its free logical nodes ([`Client::allocate`]), to spawn jobs into
//! ([`Client::spawn_with`]).

use crate::client::Client;
use crate::names::ProcSel;
use crate::proto::{AllocOp, AllocRequest, Allocation, ClientMsg, JobAction, ServerMsg, WireError};
use crate::ConnError;

/// Why a runtime-control call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The request itself is wrong (no target, an unknown job, a signal that is none).
    #[error("{op}: {reason}")]
    Invalid {
        /// The call.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The runtime could not do it (too few free nodes, an unknown session).
    #[error("{op} refused: {reason}")]
    Refused {
        /// The call.
        op: &'static str,
        /// Why.
        reason: String,
    },
    /// The connection to the server failed (or there is none: under a PMIx host such as
    /// `mpirun`, use its PMIx calls).
    #[error(transparent)]
    Conn(#[from] ConnError),
}

/// The reason carried by a server's error.
fn reason(error: WireError) -> String {
    match error {
        WireError::Invalid { reason, .. }
        | WireError::Aborted { reason, .. }
        | WireError::ProcGone { reason, .. } => reason,
        WireError::Timeout { missing, .. } => format!("timed out waiting for {missing:?}"),
    }
}

/// The error of a reply that is not call `op`'s answer: the server's refusal of the
/// request, or a reply of another kind.
fn not_done(op: &'static str, reply: ServerMsg) -> ControlError {
    match reply {
        ServerMsg::Failed { error, .. } => ControlError::Invalid {
            op,
            reason: reason(error),
        },
        other => ControlError::Refused {
            op,
            reason: format!("unexpected reply {other:?}"),
        },
    }
}

impl Client {
    /// Applies `action` to `targets`: whole jobs ([`ProcSel::All`]) or single processes,
    /// of any job of the runtime (the caller's own included). Returns once the runtime
    /// took the request; the signals are delivered on every node right after. A job
    /// terminated this way ends with exit status 143 and takes the jobs it spawned
    /// (unless they were spawned separate).
    pub fn job_control(&self, targets: &[ProcSel], action: JobAction) -> Result<(), ControlError> {
        const OP: &str = "job control";
        if targets.is_empty() {
            return Err(ControlError::Invalid {
                op: OP,
                reason: "no target".into(),
            });
        }
        if let JobAction::Signal(s) = action {
            if !(1..=64).contains(&s) {
                return Err(ControlError::Invalid {
                    op: OP,
                    reason: format!("{s} is not a signal number"),
                });
            }
        }
        let targets = targets.to_vec();
        let reply = self.server(OP).and_then(|c| {
            c.call_bounded(OP, |req| ClientMsg::JobControl {
                req,
                targets,
                action,
            })
        });
        self.dispatch_events();
        match reply? {
            ServerMsg::Done { .. } => Ok(()),
            other => Err(not_done(OP, other)),
        }
    }

    /// Asks the runtime for an allocation session, or to extend or release one: the
    /// answer is the session (its number, allocation id and nodes; after a release, no
    /// longer active). A new session holds logical nodes no other child session holds,
    /// and ends with the caller's job unless asked [`separate`](AllocRequest::separate);
    /// its jobs end with it.
    pub fn allocate(&self, request: &AllocRequest) -> Result<Allocation, ControlError> {
        const OP: &str = "allocation";
        let invalid = |reason: &str| ControlError::Invalid {
            op: OP,
            reason: reason.into(),
        };
        match request.op {
            AllocOp::New | AllocOp::Extend if request.nodes == Some(0) => {
                return Err(invalid("a request for 0 nodes"))
            }
            AllocOp::Extend | AllocOp::Release
                if request.session.is_none() && request.alloc_id.is_none() =>
            {
                return Err(invalid(
                    "no session named (a session number or allocation id)",
                ))
            }
            _ => {}
        }
        let request = request.clone();
        let reply = self
            .server(OP)
            .and_then(|c| c.call_bounded(OP, |req| ClientMsg::Allocate { req, request }));
        self.dispatch_events();
        match reply? {
            ServerMsg::Allocated { result, .. } => {
                result.map_err(|reason| ControlError::Refused { op: OP, reason })
            }
            other => Err(not_done(OP, other)),
        }
    }
}

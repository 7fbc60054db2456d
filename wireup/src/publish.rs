//! Publishing names for other processes of the runtime to look up (`Client::publish`,
//! `Client::lookup`, `Client::unpublish`; PMIx's publish/lookup): the runtime's root
//! server keeps them, so a name published by one job is found by another (a port an MPI
//! program accepts on, for one its client connects to).

use std::time::Duration;

use crate::client::Client;
use crate::proto::{
    ClientMsg, NameFailure, NameOp, NameRange, NameValue, Persistence, Published, ServerMsg,
};
use crate::ConnError;

/// How [`Client::lookup`] looks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookupOptions {
    /// Where to look (names published with a narrower range than the caller can see are
    /// not found).
    pub range: NameRange,
    /// Wait this long for every key to be published (`None`: answer at once with what is
    /// published).
    pub wait: Option<Duration>,
}

/// Why a name-service call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The runtime refused the request: the keys not found, published already, or still
    /// missing when the wait ended, or why the request was malformed.
    #[error("{op}: {failure}")]
    Refused {
        /// The call.
        op: &'static str,
        /// Why.
        failure: NameFailure,
    },
    /// The connection to the server failed (or there is none: under a PMIx host such as
    /// `mpirun`, use its PMIx name service).
    #[error(transparent)]
    Conn(#[from] ConnError),
}

/// How much longer than a lookup's own wait the client waits for the server's answer.
const ANSWER_MARGIN: Duration = Duration::from_secs(5);

impl Client {
    /// Publishes `entries` (key, bytes) for processes within `range` to look up, kept
    /// as long as `persist` says: all or none (a key published already in that reach
    /// fails the call, naming it).
    pub fn publish(
        &self,
        entries: &[(&str, &[u8])],
        range: NameRange,
        persist: Persistence,
    ) -> Result<(), NameError> {
        if let Some(bad) = entries.iter().find(|(k, _)| k.is_empty()) {
            return Err(invalid(
                "publish",
                format!("an empty key (value {:?})", bad.1),
            ));
        }
        if entries.is_empty() {
            return Err(invalid("publish", "nothing to publish".into()));
        }
        let op = NameOp::Publish {
            range,
            persist,
            entries: entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), NameValue::Bytes(v.to_vec())))
                .collect(),
        };
        self.names("publish", op, None).map(drop)
    }

    /// Looks `keys` up: the names found, each with its publisher. Without a wait, the
    /// keys published now (none: [`NameFailure::NotFound`]); with one, all of them once
    /// published, or [`NameFailure::Timeout`] naming those still missing. A value
    /// published through PMIx as a string comes as its bytes; one of another PMIx type
    /// as the PMIx library packed it.
    pub fn lookup(&self, keys: &[&str], opts: LookupOptions) -> Result<Vec<Published>, NameError> {
        if keys.is_empty() || keys.iter().any(|k| k.is_empty()) {
            return Err(invalid(
                "lookup",
                format!("no key, or an empty one: {keys:?}"),
            ));
        }
        let wait_ms = opts
            .wait
            .map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX));
        let op = NameOp::Lookup {
            range: opts.range,
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            wait_ms,
        };
        self.names("lookup", op, opts.wait)
    }

    /// Withdraws the caller's names `keys` (empty: every name it published in `range`).
    pub fn unpublish(&self, keys: &[&str], range: NameRange) -> Result<(), NameError> {
        let op = NameOp::Unpublish {
            range,
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        };
        self.names("unpublish", op, None).map(drop)
    }

    fn names(
        &self,
        what: &'static str,
        op: NameOp,
        wait: Option<Duration>,
    ) -> Result<Vec<Published>, NameError> {
        let build = |req| ClientMsg::Names { req, op };
        let reply = self.server(what).and_then(|c| match wait {
            // The server answers when the wait ends; the client waits a little longer.
            Some(w) => c.call(what, build, w.checked_add(ANSWER_MARGIN)),
            None => c.call_bounded(what, build),
        });
        self.dispatch_events();
        match reply? {
            ServerMsg::Names { result, .. } => {
                result.map_err(|failure| NameError::Refused { op: what, failure })
            }
            other => Err(invalid(what, format!("unexpected reply {other:?}"))),
        }
    }
}

fn invalid(op: &'static str, why: String) -> NameError {
    NameError::Refused {
        op,
        failure: NameFailure::Invalid(why),
    }
}

//! Events (PMIx event notification): servers push them to the processes they concern;
//! processes register handlers for one code, several codes, or all of them.
//!
//! On an event, handlers run in the order single-code, multi-code, default (each group in
//! registration order); each sees the results the ones before it appended, may append
//! its own, and may end the chain by returning [`EventFlow::Complete`]. An event that no
//! handler takes is cached (up to [`EVENT_CACHE`]) and delivered to the first handler
//! registered later that takes it.
//!
//! There is no hidden thread: handlers run on the thread of the Weft call that received
//! the event (fences, group operations, process-set changes) or in
//! [`Client::process_events`]. A handler may call the client (to claim a group's
//! leadership, say) but must not register or deregister handlers.
//!
//! ```no_run
//! use std::time::Duration;
//! use weft_wireup::{Client, EventCode, EventCodes, EventFlow};
//! let wire = Client::init()?;
//! wire.register_event_handler(EventCodes::One(EventCode::MemberFailed), |ev, _results| {
//!     eprintln!("rank {:?} of group {:?} failed", ev.rank, ev.group);
//!     EventFlow::Continue
//! });
//! wire.process_events(Duration::from_millis(100));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::client::{lock, Backend, Client, ConnError};
use crate::proto::{ClientMsg, Event, EventCode, ServerMsg, WireError};
use crate::{ProcId, Rank};

/// How many events without a handler are kept for handlers registered later.
pub const EVENT_CACHE: usize = 1024;

/// Which events a handler takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventCodes {
    /// One code (runs first).
    One(EventCode),
    /// Several codes (runs after the single-code handlers).
    Many(Vec<EventCode>),
    /// Every code: a default handler (runs last).
    All,
}

impl EventCodes {
    fn takes(&self, code: EventCode) -> bool {
        match self {
            EventCodes::One(c) => *c == code,
            EventCodes::Many(cs) => cs.contains(&code),
            EventCodes::All => true,
        }
    }
    fn rank(&self) -> u8 {
        match self {
            EventCodes::One(_) => 0,
            EventCodes::Many(_) => 1,
            EventCodes::All => 2,
        }
    }
}

/// What a handler tells the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFlow {
    /// Pass the event (and the results so far) to the next handler.
    Continue,
    /// The event is handled: no later handler sees it.
    Complete,
}

/// Identifies a registered handler (for [`Client::deregister_event_handler`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandlerId(u64);

/// Results a handler passes down the chain (key, value).
pub type EventResults = Vec<(String, String)>;

type Handler = Box<dyn FnMut(&Event, &mut EventResults) -> EventFlow + Send>;

struct Entry {
    id: u64,
    codes: EventCodes,
    handler: Handler,
}

/// The handlers of a process and the events cached for later ones.
#[derive(Default)]
pub(crate) struct Registry {
    next: u64,
    /// Sorted by (kind of codes, registration order).
    handlers: Vec<Entry>,
    cache: VecDeque<Event>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("handlers", &self.handlers.len())
            .field("cached", &self.cache.len())
            .finish()
    }
}

impl Registry {
    /// Runs the chain for `e`; false when no handler takes it.
    fn deliver(&mut self, e: &Event) -> bool {
        let mut results = EventResults::new();
        let mut taken = false;
        for h in self.handlers.iter_mut().filter(|h| h.codes.takes(e.code)) {
            taken = true;
            if (h.handler)(e, &mut results) == EventFlow::Complete {
                break;
            }
        }
        taken
    }

    fn cache(&mut self, e: Event) {
        if self.cache.len() == EVENT_CACHE {
            tracing::warn!("event cache full ({EVENT_CACHE}); dropping the oldest event");
            self.cache.pop_front();
        }
        self.cache.push_back(e);
    }
}

/// Errors of leave, leader claims and process-set changes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The server refused the request.
    #[error("{op} of {name:?} refused: {reason}")]
    Refused {
        /// The operation.
        op: &'static str,
        /// The group or process set.
        name: String,
        /// Why.
        reason: String,
    },
    /// The connection failed.
    #[error(transparent)]
    Conn(#[from] ConnError),
}

impl Client {
    /// Registers `handler` for `codes`; events of those codes that arrived before (and
    /// are still cached) are delivered to it now.
    pub fn register_event_handler(
        &self,
        codes: EventCodes,
        handler: impl FnMut(&Event, &mut EventResults) -> EventFlow + Send + 'static,
    ) -> HandlerId {
        let mut reg = lock(&self.events);
        reg.next += 1;
        let id = reg.next;
        let mut entry = Entry {
            id,
            codes,
            handler: Box::new(handler),
        };
        let cached: Vec<Event> = reg
            .cache
            .iter()
            .filter(|e| entry.codes.takes(e.code))
            .cloned()
            .collect();
        reg.cache.retain(|e| !entry.codes.takes(e.code));
        for e in &cached {
            let mut results = EventResults::new();
            (entry.handler)(e, &mut results);
        }
        let at = reg
            .handlers
            .iter()
            .position(|h| h.codes.rank() > entry.codes.rank())
            .unwrap_or(reg.handlers.len());
        reg.handlers.insert(at, entry);
        HandlerId(id)
    }

    /// Removes a handler; false if it was not registered.
    pub fn deregister_event_handler(&self, id: HandlerId) -> bool {
        let mut reg = lock(&self.events);
        let before = reg.handlers.len();
        reg.handlers.retain(|h| h.id != id.0);
        reg.handlers.len() != before
    }

    /// Runs the handlers of the events received so far. Returns how many events were
    /// dispatched (delivered or cached). Does nothing when called from a handler.
    pub(crate) fn dispatch_events(&self) -> usize {
        let mut n = 0;
        loop {
            let mut events = std::mem::take(&mut *lock(&self.deferred_events));
            events.extend(match self.backend() {
                Backend::Native { conn, .. } => conn.take_events(),
                // Under a PMIx host: group events found from the processes' ends.
                #[cfg(feature = "pmix")]
                Backend::Pmix(px) => px.take_events(),
            });
            if events.is_empty() {
                return n;
            }
            // A handler that calls the client re-enters here: its events wait for the
            // outer loop (try_lock fails on the same thread, or another thread
            // dispatches).
            let Ok(mut reg) = self.events.try_lock() else {
                // Put them back for whoever holds the registry.
                let mut deferred = lock(&self.deferred_events);
                events.append(&mut deferred);
                *deferred = events;
                return n;
            };
            for e in events {
                n += 1;
                if !reg.deliver(&e) {
                    reg.cache(e);
                }
            }
        }
    }

    /// Waits up to `timeout` for events and runs their handlers; returns how many were
    /// dispatched (it returns as soon as there was at least one).
    pub fn process_events(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.dispatch_events();
            if n > 0 || Instant::now() >= deadline {
                return n;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn simple_request(
        &self,
        op: &'static str,
        name: &str,
        build: impl FnOnce(u64) -> ClientMsg,
    ) -> Result<(), RequestError> {
        let reply = self.server(op).and_then(|c| c.call_bounded(op, build));
        self.dispatch_events();
        match reply? {
            ServerMsg::Done { .. } => Ok(()),
            ServerMsg::Failed { error, .. } => Err(RequestError::Refused {
                op,
                name: name.to_owned(),
                reason: match error {
                    WireError::Invalid { reason, .. }
                    | WireError::Aborted { reason, .. }
                    | WireError::ProcGone { reason, .. } => reason,
                    WireError::Timeout { missing, .. } => {
                        format!("timed out waiting for {missing:?}")
                    }
                },
            }),
            other => Err(RequestError::Refused {
                op,
                name: name.to_owned(),
                reason: format!("unexpected reply {other:?}"),
            }),
        }
    }

    /// Leaves group `id` (local to the caller; the other members get a member-left
    /// event).
    pub fn group_leave(&self, id: &str) -> Result<(), RequestError> {
        let idc = id.to_owned();
        self.simple_request("group leave", id, |req| ClientMsg::GroupLeave {
            req,
            id: idc,
        })?;
        lock(&self.my_groups).remove(id);
        Ok(())
    }

    /// Declares the caller the leader of group `id` after its leader failed. The root
    /// server accepts the first claim; every member gets a leader-selected event.
    pub fn group_claim_leadership(&self, id: &str) -> Result<(), RequestError> {
        let idc = id.to_owned();
        self.simple_request("leader claim", id, |req| ClientMsg::LeaderClaim {
            req,
            id: idc,
        })
    }

    /// Defines process set `name` while the job runs; every process gets a
    /// pset-defined event. [`Client::pset_members`] knows it on the caller's node once
    /// this returns, on the other nodes when their event arrives.
    pub fn define_pset(&self, name: &str, members: &[Rank]) -> Result<(), RequestError> {
        let n = name.to_owned();
        let m = members.iter().map(|&r| ProcId::new(self.ns(), r)).collect();
        self.simple_request("pset define", name, |req| ClientMsg::PsetDefine {
            req,
            name: n,
            members: m,
        })
    }

    /// Deletes a process set defined while the job runs; every process gets a
    /// pset-deleted event.
    pub fn delete_pset(&self, name: &str) -> Result<(), RequestError> {
        let n = name.to_owned();
        self.simple_request("pset delete", name, |req| ClientMsg::PsetDelete {
            req,
            name: n,
        })
    }
}

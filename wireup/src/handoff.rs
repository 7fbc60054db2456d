//! Data moved by fences that run outside the servers: a fabric's collectives can carry
//! what each participant committed since its last fence (an allgather over shared memory
//! and the network) instead of the servers' sockets. See [`Client::fence_contribution`]
//! and [`Client::fence_deliver`].
//!
//! Every commit still goes to the process's server as before, so processes outside such
//! a fence, and gets with [`GetOpts::refresh`](crate::GetOpts), find the data there; the
//! copies a fence delivers are kept per process and answer its gets first, until a
//! server fence over the owner replaces them (the servers' copies are then as new).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};

use serde::{Deserialize, Serialize};

use crate::conn::lock;
use crate::proto::Procs;
use crate::{Client, FenceError, Rank, Scope, Value};

/// What a process contributes to a fence outside the servers.
#[derive(Debug, Serialize, Deserialize)]
struct Contribution {
    /// Its committed entries since its last fence, the last value of each key.
    entries: Vec<(Scope, String, Value)>,
}

/// A client's journal of commits and the copies fences delivered.
#[derive(Debug, Default)]
pub(crate) struct Handoff {
    /// What this process committed since its last fence (any kind), by key.
    journal: Mutex<Vec<(Scope, String, Value)>>,
    /// Whether `delivered` may hold anything (a get skips the lock when not).
    any: AtomicBool,
    /// Values delivered by fences outside the servers, by owner and key.
    delivered: RwLock<HashMap<Rank, HashMap<String, Value>>>,
}

impl Handoff {
    /// Records committed entries (the last value of a key replaces earlier ones).
    pub(crate) fn record(&self, entries: &[(Scope, String, Value)]) {
        let mut j = lock(&self.journal);
        for (scope, key, value) in entries {
            j.retain(|(_, k, _)| k != key);
            j.push((*scope, key.clone(), value.clone()));
        }
    }

    /// A server fence over `procs` completed: their data is as new at the servers, so
    /// the copies delivered before step aside; this process's journal starts again.
    pub(crate) fn server_fence(&self, procs: &Procs) {
        lock(&self.journal).clear();
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut d = self
            .delivered
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match procs {
            Procs::All => d.clear(),
            Procs::List(ranks) => {
                for r in ranks {
                    d.remove(r);
                }
            }
        }
    }

    /// The copy of `rank`'s `key` a fence delivered, if any.
    pub(crate) fn get(&self, rank: Rank, key: &str) -> Option<Value> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let d = self
            .delivered
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        d.get(&rank)?.get(key).cloned()
    }
}

impl Client {
    /// This process's part of a fence run outside the servers: what it committed since
    /// its last fence, encoded. Every participant gives its part to every other (an
    /// allgather), which hands each one to [`Client::fence_deliver`]; afterwards a get
    /// of any of them sees what it committed before the fence, as after a server fence
    /// of mode Full among them. Empty when nothing was committed. Taking the part starts
    /// the journal again.
    pub fn fence_contribution(&self) -> Vec<u8> {
        let entries = std::mem::take(&mut *lock(&self.handoff.journal));
        if entries.is_empty() {
            return Vec::new();
        }
        postcard::to_allocvec(&Contribution { entries }).unwrap_or_default()
    }

    /// Takes in `rank`'s part of a fence outside the servers (see
    /// [`Client::fence_contribution`]; this process's own part too): the entries its
    /// scope lets this process see answer its gets from now on.
    pub fn fence_deliver(&self, rank: Rank, part: &[u8]) -> Result<(), FenceError> {
        let size = self.size();
        if rank >= size {
            return Err(FenceError::Invalid {
                reason: format!("rank {rank} is not in the job (size {size})"),
            });
        }
        if part.is_empty() {
            return Ok(());
        }
        let c: Contribution = postcard::from_bytes(part).map_err(|e| FenceError::Invalid {
            reason: format!(
                "rank {rank}'s part of the fence ({} bytes) does not decode: {e}",
                part.len()
            ),
        })?;
        if c.entries.is_empty() {
            return Ok(());
        }
        let same_node = self.job().node_of(rank) == Some(self.node());
        let h = &self.handoff;
        let mut d = h
            .delivered
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mine = d.entry(rank).or_default();
        for (scope, key, value) in c.entries {
            let visible = if same_node {
                scope.visible_on_node()
            } else {
                scope.visible_off_node()
            };
            if visible {
                mine.insert(key, value);
            }
        }
        h.any.store(true, Ordering::Release);
        Ok(())
    }
}

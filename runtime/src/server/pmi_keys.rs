//! The PMI front ends' bookkeeping, without IO: who put each PMI key (a PMI get names
//! only the key; its owner is found here, from local puts and from the data a barrier
//! brought of other nodes), and PMI-2's node attributes with the gets waiting for them.
//! The wire protocols (`pmi`, `pmi2`) parse and answer; this keeps the state, and its
//! `on_*` methods say whom to answer (see `pmi_keys/tests.rs`).

use std::collections::HashMap;

use crate::wire::proto::ProcData;
use weft_wireup::Rank;

/// Prefix of the keys PMI clients put, in the core's key space.
pub(crate) const KEY_PREFIX: &str = "pmi1/";

/// How a PMI-2 node-attribute get ends now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeAttr {
    /// The attribute's value.
    Found(String),
    /// Not there: the get waits until it is put.
    Waiting,
    /// Not there, and the get does not wait.
    NotFound,
}

/// The PMI bookkeeping of one server.
#[derive(Debug, Default)]
pub(crate) struct PmiKeys {
    /// Who put each PMI key (local puts, and other nodes' from a barrier's data).
    owners: HashMap<String, Rank>,
    /// PMI-2's node attributes (`info-putnodeattr`).
    node_attrs: HashMap<String, String>,
    /// The local ranks waiting for a node attribute, by key.
    attr_waiters: HashMap<String, Vec<Rank>>,
}

impl PmiKeys {
    /// Local rank `rank` put `key` (PMI-1's `put`, PMI-2's `kvs-put`: they share keys).
    pub(crate) fn on_put(&mut self, rank: Rank, key: &str) {
        self.owners.insert(key.to_string(), rank);
    }

    /// Who put `key`, as far as this server knows.
    pub(crate) fn owner(&self, key: &str) -> Option<Rank> {
        self.owners.get(key).copied()
    }

    /// A collective brought `data` of other nodes' processes: the PMI keys in it.
    pub(crate) fn on_learn(&mut self, data: &ProcData) {
        for (rank, _, entries) in data {
            for (k, _) in entries.iter().flatten() {
                if let Some(key) = k.strip_prefix(KEY_PREFIX) {
                    self.owners.insert(key.to_string(), *rank);
                }
            }
        }
    }

    /// Node attribute `key` is put with `value`: the ranks whose gets waited for it,
    /// each to be answered once with `value`.
    pub(crate) fn on_put_node_attr(&mut self, key: String, value: String) -> Vec<Rank> {
        let waiting = self.attr_waiters.remove(&key).unwrap_or_default();
        self.node_attrs.insert(key, value);
        waiting
    }

    /// Local rank `rank` gets node attribute `key`, waiting for it when `wait`.
    pub(crate) fn on_get_node_attr(&mut self, rank: Rank, key: &str, wait: bool) -> NodeAttr {
        match self.node_attrs.get(key) {
            Some(v) => NodeAttr::Found(v.clone()),
            None if wait => {
                self.attr_waiters
                    .entry(key.to_string())
                    .or_default()
                    .push(rank);
                NodeAttr::Waiting
            }
            None => NodeAttr::NotFound,
        }
    }
}

#[cfg(test)]
mod tests;

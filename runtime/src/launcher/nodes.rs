//! The runtime's side of a launch: which node servers have said hello, which are ready
//! (and at what peer address), when all of them are (the moment to start the job), and
//! which are gone. IO-free: the launcher's loop feeds it and executes what it returns.
//!
//! This part belongs to the runtime, not to one job: a persistent runtime (issue 33)
//! keeps it across jobs, while [`Job`](super::job::Job) is per job.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;

/// The node servers of a launch, as far as the launcher knows them.
#[derive(Debug)]
pub(super) struct Nodes {
    /// How many servers there are (one per node).
    num_nodes: u32,
    /// The servers whose connection said hello and has not been lost.
    connected: BTreeSet<u32>,
    /// Each ready server's peer address (a lost server counts as ready with an unspecified
    /// address, so that it is counted once, and the others are still started).
    ready: HashMap<u32, SocketAddr>,
    /// Whether the servers were told to start the job.
    started: bool,
    /// Servers whose end (connection lost or process exit) was not seen yet.
    alive: u32,
}

/// What a server's loss means for the launch.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Loss {
    /// First report of this server's end: it counts (the job learns of it).
    First,
    /// The second report of the same end (its connection and its process both report).
    Again,
}

impl Nodes {
    pub(super) fn new(num_nodes: u32) -> Nodes {
        Nodes {
            num_nodes,
            connected: BTreeSet::new(),
            ready: HashMap::new(),
            started: false,
            alive: num_nodes,
        }
    }

    /// A server said hello (with the right secret): it gets the plan next.
    pub(super) fn on_hello(&mut self, node: u32) {
        self.connected.insert(node);
    }

    /// A server is ready at `peer_addr`. Returns every server's peer address, in node
    /// order, when this makes all of them ready for the first time (the job starts).
    pub(super) fn on_ready(&mut self, node: u32, peer_addr: SocketAddr) -> Option<Vec<SocketAddr>> {
        self.ready.insert(node, peer_addr);
        if self.ready.len() == self.num_nodes as usize && !self.started {
            self.started = true;
            return Some((0..self.num_nodes).map(|n| self.ready[&n]).collect());
        }
        None
    }

    /// Whether the server of `node` was lost (it counted as ready, its connection is gone).
    pub(super) fn is_lost(&self, node: u32) -> bool {
        self.ready.contains_key(&node) && !self.connected.contains(&node)
    }

    /// The first server that was lost, if any.
    pub(super) fn first_lost(&self) -> Option<u32> {
        (0..self.num_nodes).find(|&n| self.is_lost(n))
    }

    /// A server's connection was lost or its process ended.
    pub(super) fn on_lost(&mut self, node: u32) -> Loss {
        if !self.connected.remove(&node) && self.ready.contains_key(&node) {
            return Loss::Again;
        }
        self.ready
            .entry(node)
            .or_insert_with(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        self.alive -= 1;
        Loss::First
    }

    /// The servers had their time to start. Returns how many were ready, if the job was
    /// not started (the launch failed).
    pub(super) fn on_startup_timeout(&self) -> Option<usize> {
        (!self.started).then_some(self.ready.len())
    }

    /// How many servers there are.
    pub(super) fn num_nodes(&self) -> u32 {
        self.num_nodes
    }

    /// Whether the job was started on every server.
    pub(super) fn started(&self) -> bool {
        self.started
    }

    /// Whether every server has ended (the launcher's loop is over).
    pub(super) fn all_gone(&self) -> bool {
        self.alive == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn the_job_starts_once_when_every_server_is_ready_with_the_addresses_in_node_order() {
        let mut n = Nodes::new(3);
        for node in 0..3 {
            n.on_hello(node);
        }
        assert_eq!(n.on_ready(2, addr(12)), None);
        assert_eq!(n.on_ready(0, addr(10)), None);
        assert!(!n.started());
        assert_eq!(
            n.on_ready(1, addr(11)),
            Some(vec![addr(10), addr(11), addr(12)])
        );
        assert!(n.started());
        // A repeated ready does not start it again.
        assert_eq!(n.on_ready(1, addr(11)), None);
        assert_eq!(n.on_startup_timeout(), None);
    }

    #[test]
    fn a_server_lost_after_hello_counts_once_though_connection_and_process_both_report() {
        let mut n = Nodes::new(2);
        n.on_hello(0);
        n.on_hello(1);
        n.on_ready(0, addr(10));
        assert_eq!(n.on_lost(0), Loss::First);
        assert_eq!(n.on_lost(0), Loss::Again);
        assert!(!n.all_gone());
        // Not ready yet when lost: still counted once.
        assert_eq!(n.on_lost(1), Loss::First);
        assert_eq!(n.on_lost(1), Loss::Again);
        assert!(n.all_gone());
    }

    #[test]
    fn a_server_lost_before_hello_counts_once_and_the_others_still_start() {
        let mut n = Nodes::new(2);
        // Its process exits before it ever connected.
        assert_eq!(n.on_lost(1), Loss::First);
        assert_eq!(n.on_lost(1), Loss::Again);
        n.on_hello(0);
        let peers = n.on_ready(0, addr(10)).expect("the others start");
        assert_eq!(peers[0], addr(10));
        assert!(peers[1].ip().is_unspecified());
        assert!(!n.all_gone());
        assert_eq!(n.on_lost(0), Loss::First);
        assert!(n.all_gone());
    }

    #[test]
    fn the_startup_timeout_fails_the_launch_only_before_the_start() {
        let mut n = Nodes::new(2);
        n.on_hello(0);
        n.on_ready(0, addr(10));
        assert_eq!(n.on_startup_timeout(), Some(1));
        assert_eq!(n.num_nodes(), 2);
        n.on_hello(1);
        n.on_ready(1, addr(11));
        assert_eq!(n.on_startup_timeout(), None);
    }
}

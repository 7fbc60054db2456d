//! Job-level information: who is where, app contexts, process sets.
//!
//! The launcher computes a [`JobInfo`] once; every node server writes it into its
//! node's shared-memory datastore, and every client reads it from there at init.

use serde::{Deserialize, Serialize};

use crate::cpulist::CpuList;
use crate::Rank;

/// The built-in process set holding every process of the job.
pub const PSET_WORLD: &str = "weft://world";
/// The built-in process set holding only the calling process.
pub const PSET_SELF: &str = "weft://self";

/// One node of the job (a host, or a logical node on one host).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Node id, 0-based.
    pub id: u32,
    /// Hostname label, e.g. `myhost-n2` for logical node 2 of `myhost`.
    pub hostname: String,
}

/// Placement of one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    /// The node the process runs on.
    pub node: u32,
    /// Rank among the processes of that node.
    pub local_rank: u32,
    /// The app context the process belongs to.
    pub app: u32,
    /// The CPUs the process is bound to, if the job was launched with `--bind-to core`.
    pub cpuset: Option<CpuList>,
    /// Where the process is bound in the node's hardware, as the PMIx host's locality
    /// string (`pmix.locstr`, e.g. `SK0:L30:L20:L10:CR0:HT0`: socket, caches, core,
    /// hardware thread), for the processes of this node when a PMIx host gives it
    /// (`mpirun --bind-to core`). `None` under `weft run`.
    pub locality: Option<String>,
}

/// One app context (`-n N PROGRAM` between `:` separators).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppInfo {
    /// Number of processes of this app context.
    pub size: u32,
    /// Rank of its first process; its ranks are contiguous.
    pub first_rank: Rank,
    /// The program it runs.
    pub program: String,
    /// The process set it was given with `--pset`, if any.
    pub pset: Option<String>,
}

/// A named process set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pset {
    /// Its name, e.g. `weft://world` or `ocean`.
    pub name: String,
    /// Its members, sorted ascending.
    pub members: Vec<Rank>,
}

/// What a node's server tells its processes about the network (in the datastore).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeNet {
    /// The address the server reaches other nodes from.
    pub addr: std::net::IpAddr,
    /// The job's transport secret ([`transport_secret`]).
    pub transport_secret: [u64; 2],
}

impl std::fmt::Debug for NodeNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("NodeNet").field("addr", &self.addr).finish()
    }
}

/// The secret the job's processes authenticate transport connections with, derived from
/// the launcher's job secret (which stays with the servers): the same on every node, and
/// not the job secret itself.
pub fn transport_secret(job_secret: [u64; 2]) -> [u64; 2] {
    // SplitMix64's finalizer over the secret and a domain constant: a fixed mixing that
    // does not hand the servers' secret to every process.
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    const DOMAIN: u64 = 0x7765_6674_2d74_6370; // "weft-tcp"
    let a = mix(job_secret[0] ^ mix(job_secret[1] ^ DOMAIN));
    let b = mix(job_secret[1] ^ mix(a ^ DOMAIN.rotate_left(29)));
    [a, b]
}

/// Everything known about a job at launch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    /// The job's namespace (unique per launch).
    pub nspace: String,
    /// The nodes, indexed by node id.
    pub nodes: Vec<NodeInfo>,
    /// The processes, indexed by rank.
    pub procs: Vec<ProcInfo>,
    /// The app contexts, indexed by app number.
    pub apps: Vec<AppInfo>,
    /// Process sets defined at launch, `weft://world` first (`weft://self` is implicit).
    pub psets: Vec<Pset>,
    /// The PGCID (group context id) of the world group: the context id of the world
    /// communicator.
    pub world_pgcid: u64,
}

impl JobInfo {
    /// Number of processes in the job.
    pub fn size(&self) -> u32 {
        self.procs.len() as u32
    }
    /// Number of nodes.
    pub fn num_nodes(&self) -> u32 {
        self.nodes.len() as u32
    }
    /// The node that `rank` runs on, if `rank` is in the job.
    pub fn node_of(&self, rank: Rank) -> Option<u32> {
        self.procs.get(rank as usize).map(|p| p.node)
    }
    /// The hostname (label) of the node `rank` runs on.
    pub fn hostname_of(&self, rank: Rank) -> Option<&str> {
        let node = self.node_of(rank)?;
        self.nodes.get(node as usize).map(|n| n.hostname.as_str())
    }
    /// The ranks on `node`, ascending.
    pub fn ranks_on(&self, node: u32) -> Vec<Rank> {
        (0..self.size())
            .filter(|&r| self.procs[r as usize].node == node)
            .collect()
    }
    /// The app number of `rank`.
    pub fn app_of(&self, rank: Rank) -> Option<u32> {
        self.procs.get(rank as usize).map(|p| p.app)
    }
    /// The cpuset `rank` is bound to, if binding was asked for.
    pub fn cpuset_of(&self, rank: Rank) -> Option<&CpuList> {
        self.procs.get(rank as usize)?.cpuset.as_ref()
    }
    /// The locality string of `rank` (a process of this node), if the PMIx host gave one
    /// ([`ProcInfo::locality`]).
    pub fn locality_of(&self, rank: Rank) -> Option<&str> {
        self.procs.get(rank as usize)?.locality.as_deref()
    }
    /// The names of the launch process sets plus `weft://self`.
    pub fn pset_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.psets.iter().map(|p| p.name.clone()).collect();
        names.insert(1.min(names.len()), PSET_SELF.to_owned());
        names
    }
    /// The members of the process set `name`, as seen by `me` (`weft://self` is `[me]`).
    pub fn pset_members(&self, name: &str, me: Rank) -> Option<Vec<Rank>> {
        if name == PSET_SELF {
            return Some(vec![me]);
        }
        self.psets
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.members.clone())
    }
    /// The process sets `rank` belongs to, as seen by `me`.
    pub fn psets_of(&self, rank: Rank, me: Rank) -> Vec<String> {
        let mut out: Vec<String> = self
            .psets
            .iter()
            .filter(|p| p.members.binary_search(&rank).is_ok())
            .map(|p| p.name.clone())
            .collect();
        if rank == me {
            out.insert(1.min(out.len()), PSET_SELF.to_owned());
        }
        out
    }
}

/// The PGCID of the `weft://world` group, assigned at launch (the root server's PGCID
/// allocator hands out larger values).
pub const WORLD_PGCID: u64 = 1;

/// Random 64-bit value from the kernel.
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    let mut filled = 0;
    while filled < 8 {
        match rustix::rand::getrandom(&mut b[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => panic!("getrandom failed: {e}"),
        }
    }
    u64::from_le_bytes(b)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn the_transport_secret_is_derived_not_copied() {
        let a = transport_secret([1, 2]);
        // The same on every node (a function of the job secret alone)...
        assert_eq!(a, transport_secret([1, 2]));
        // ...never the job secret itself, and different for another job.
        assert_ne!(a, [1, 2]);
        assert_ne!(a, transport_secret([1, 3]));
        assert_ne!(a, transport_secret([2, 2]));
        assert_ne!(transport_secret([0, 0]), [0, 0]);
        // Debug output never shows it.
        let net = NodeNet {
            addr: "127.0.0.1".parse().unwrap(),
            transport_secret: a,
        };
        assert!(!format!("{net:?}").contains(&a[0].to_string()));
    }

    /// A 5-process job over 2 nodes with two app contexts, for tests.
    pub(crate) fn sample() -> JobInfo {
        let procs = (0..5)
            .map(|r| ProcInfo {
                node: if r < 3 { 0 } else { 1 },
                local_rank: if r < 3 { r } else { r - 3 },
                app: if r < 2 { 0 } else { 1 },
                cpuset: None,
                locality: None,
            })
            .collect();
        JobInfo {
            nspace: "weft-test".into(),
            nodes: vec![
                NodeInfo {
                    id: 0,
                    hostname: "h-n0".into(),
                },
                NodeInfo {
                    id: 1,
                    hostname: "h-n1".into(),
                },
            ],
            procs,
            apps: vec![
                AppInfo {
                    size: 2,
                    first_rank: 0,
                    program: "a".into(),
                    pset: Some("ocean".into()),
                },
                AppInfo {
                    size: 3,
                    first_rank: 2,
                    program: "b".into(),
                    pset: Some("ice".into()),
                },
            ],
            psets: vec![
                Pset {
                    name: PSET_WORLD.into(),
                    members: (0..5).collect(),
                },
                Pset {
                    name: "ocean".into(),
                    members: vec![0, 1],
                },
                Pset {
                    name: "ice".into(),
                    members: vec![2, 3, 4],
                },
            ],
            world_pgcid: 1,
        }
    }

    #[test]
    fn queries_answer_from_the_map() {
        let j = sample();
        assert_eq!(j.size(), 5);
        assert_eq!(j.ranks_on(1), vec![3, 4]);
        assert_eq!(j.hostname_of(4), Some("h-n1"));
        assert_eq!(j.node_of(5), None);
        assert_eq!(
            j.pset_names(),
            vec!["weft://world", "weft://self", "ocean", "ice"]
        );
        assert_eq!(j.pset_members("ice", 0), Some(vec![2, 3, 4]));
        assert_eq!(j.pset_members(PSET_SELF, 3), Some(vec![3]));
        assert_eq!(j.pset_members("nope", 3), None);
        assert_eq!(
            j.psets_of(1, 1),
            vec!["weft://world", "weft://self", "ocean"]
        );
        assert_eq!(j.psets_of(1, 0), vec!["weft://world", "ocean"]);
    }
}

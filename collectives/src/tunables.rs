//! `WEFT_COLL_*`: the algorithm choices, read once per process and listed by `weft info`.

use std::sync::OnceLock;

pub use weft_tunables::Tunable;
use weft_tunables::{BadTunable, Lookup};

/// Every collective tunable.
pub const TUNABLES: &[Tunable] = &[
    Tunable {
        name: "WEFT_COLL_SHM",
        default: "on",
        meaning: "node-local collectives through a shared-memory segment (barrier, bcast, reduce, allreduce, allgather, alltoall): on, off",
    },
    Tunable {
        name: "WEFT_COLL_SHM_MAX",
        default: "8K",
        meaning: "bytes up to which bcast, reduce and allreduce go through the segment's cells (at most 16K; allgather per rank and alltoall in all: up to the smaller of this and 4K)",
    },
    Tunable {
        name: "WEFT_COLL_SHM_TREE",
        default: "9",
        meaning: "members from which the node segment's barrier runs over its release/gather tree (2 log_radix(N) hops) instead of every member reading every other's flag (one hop, N reads each): a count (2 or more), or off",
    },
    Tunable {
        name: "WEFT_COLL_SHM_RADIX",
        default: "4",
        meaning: "children per member in the node segment's release/gather tree (2 to 64)",
    },
    Tunable {
        name: "WEFT_COLL_SINGLE_COPY",
        default: "auto",
        meaning: "node-local bcast (3+ members), reduce, allreduce, allgather and alltoall above WEFT_COLL_SHM_MAX read each other's buffers with one copy (CMA) when the kernel allows: auto, off (point-to-point)",
    },
    Tunable {
        name: "WEFT_COLL_HIER",
        default: "on",
        meaning: "communicators that span nodes with two or more members on some node: barrier, bcast and small allreduce in phases (node, leaders, node): on, off",
    },
    Tunable {
        name: "WEFT_COLL_HIER_MAX",
        default: "4K",
        meaning: "bytes up to which allreduce (commutative operations) is hierarchical",
    },
    Tunable {
        name: "WEFT_COLL_BCAST",
        default: "auto",
        meaning: "broadcast algorithm: auto, binomial, scatter-allgather",
    },
    Tunable {
        name: "WEFT_COLL_BCAST_LARGE",
        default: "256K",
        meaning:
            "auto: broadcasts of at least this many bytes (and 3+ processes) use scatter-allgather",
    },
    Tunable {
        name: "WEFT_COLL_ALLREDUCE",
        default: "auto",
        meaning: "allreduce algorithm: auto, recursive-doubling, rabenseifner (commutative ops), ring (commutative ops), reduce-bcast",
    },
    Tunable {
        name: "WEFT_COLL_ALLREDUCE_MID",
        default: "16K",
        meaning: "auto: allreduces of at least this many bytes (and 3+ processes) use Rabenseifner's algorithm (commutative ops; past WEFT_COLL_ALLREDUCE_LARGE only for a power-of-two size)",
    },
    Tunable {
        name: "WEFT_COLL_ALLREDUCE_LARGE",
        default: "64K",
        meaning: "auto: allreduces of at least this many bytes use the ring (commutative ops) where Rabenseifner's does not apply",
    },
    Tunable {
        name: "WEFT_COLL_ALLGATHER",
        default: "auto",
        meaning: "allgather algorithm: auto, bruck, ring",
    },
    Tunable {
        name: "WEFT_COLL_ALLGATHER_LARGE",
        default: "16K",
        meaning: "auto: allgathers of at least this many bytes per rank use the ring",
    },
];

/// Broadcast algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bcast {
    Auto,
    Binomial,
    ScatterAllgather,
}

/// Allreduce algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Allreduce {
    Auto,
    RecursiveDoubling,
    Rabenseifner,
    Ring,
    ReduceBcast,
}

/// Allgather algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Allgather {
    Auto,
    Bruck,
    Ring,
}

/// The tunables' values.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Config {
    pub(crate) shm: bool,
    pub(crate) shm_max: usize,
    /// Members from which the barrier runs over the tree (`usize::MAX`: never).
    pub(crate) shm_tree: usize,
    pub(crate) shm_radix: usize,
    pub(crate) single_copy: bool,
    pub(crate) hier: bool,
    pub(crate) hier_max: usize,
    pub(crate) bcast: Bcast,
    pub(crate) bcast_large: usize,
    pub(crate) allreduce: Allreduce,
    pub(crate) allreduce_mid: usize,
    pub(crate) allreduce_large: usize,
    pub(crate) allgather: Allgather,
    pub(crate) allgather_large: usize,
}

/// The entry of `name`.
fn t(name: &str) -> &'static Tunable {
    weft_tunables::find(TUNABLES, name)
}

/// A collective tunable's value, or its default (warning, naming the variable) when the
/// value set is not valid: a collective's choice of algorithm is not worth failing for.
fn or_default<T>(
    name: &str,
    get: Lookup<'_>,
    read: impl Fn(Lookup<'_>) -> Result<T, BadTunable>,
) -> T {
    read(get).unwrap_or_else(|e| {
        tracing::warn!("{e}: using the default, {}", t(name).default);
        read(&|_: &str| None).unwrap_or_else(|e| panic!("the default of {name}: {e}"))
    })
}

fn size(name: &str, get: Lookup<'_>) -> usize {
    or_default(name, get, |g| t(name).size_in(g, 0, usize::MAX as u64)) as usize
}

/// A count between `min` and `max` (or `off`, read as `usize::MAX`, where allowed).
fn count(name: &str, get: Lookup<'_>, min: usize, max: usize, off: bool) -> usize {
    if off && t(name).set_in(get).is_some_and(|v| v.trim() == "off") {
        return usize::MAX;
    }
    or_default(name, get, |g| t(name).count_in(g, min as u64, max as u64)) as usize
}

fn switch(name: &str, get: Lookup<'_>) -> bool {
    or_default(name, get, |g| t(name).switch_in(g))
}

fn choice<T: Copy>(name: &str, get: Lookup<'_>, options: &[(&'static str, T)]) -> T {
    let words: Vec<&'static str> = options.iter().map(|(n, _)| *n).collect();
    let w = or_default(name, get, |g| t(name).choice_in(g, &words));
    options
        .iter()
        .find(|(n, _)| *n == w)
        .map_or(options[0].1, |(_, v)| *v)
}

impl Config {
    /// The process's tunables (read from the environment on first use).
    pub(crate) fn get() -> &'static Config {
        static C: OnceLock<Config> = OnceLock::new();
        C.get_or_init(Config::from_env)
    }

    fn from_env() -> Config {
        Config::from_lookup(&weft_tunables::env)
    }

    fn from_lookup(get: Lookup<'_>) -> Config {
        Config {
            shm: switch("WEFT_COLL_SHM", get),
            shm_max: size("WEFT_COLL_SHM_MAX", get).min(weft_shm::CollSegment::CELL),
            shm_tree: count("WEFT_COLL_SHM_TREE", get, 2, usize::MAX, true),
            shm_radix: count("WEFT_COLL_SHM_RADIX", get, 2, 64, false),
            single_copy: choice(
                "WEFT_COLL_SINGLE_COPY",
                get,
                &[("auto", true), ("off", false)],
            ),
            hier: switch("WEFT_COLL_HIER", get),
            hier_max: size("WEFT_COLL_HIER_MAX", get),
            bcast: choice(
                "WEFT_COLL_BCAST",
                get,
                &[
                    ("auto", Bcast::Auto),
                    ("binomial", Bcast::Binomial),
                    ("scatter-allgather", Bcast::ScatterAllgather),
                ],
            ),
            bcast_large: size("WEFT_COLL_BCAST_LARGE", get),
            allreduce: choice(
                "WEFT_COLL_ALLREDUCE",
                get,
                &[
                    ("auto", Allreduce::Auto),
                    ("recursive-doubling", Allreduce::RecursiveDoubling),
                    ("rabenseifner", Allreduce::Rabenseifner),
                    ("ring", Allreduce::Ring),
                    ("reduce-bcast", Allreduce::ReduceBcast),
                ],
            ),
            allreduce_mid: size("WEFT_COLL_ALLREDUCE_MID", get),
            allreduce_large: size("WEFT_COLL_ALLREDUCE_LARGE", get),
            allgather: choice(
                "WEFT_COLL_ALLGATHER",
                get,
                &[
                    ("auto", Allgather::Auto),
                    ("bruck", Allgather::Bruck),
                    ("ring", Allgather::Ring),
                ],
            ),
            allgather_large: size("WEFT_COLL_ALLGATHER_LARGE", get),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Config {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(&move |n: &str| {
            vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
        })
    }

    /// The table's defaults are the configuration's, and every entry is read.
    #[test]
    fn every_tunable_default_parses_and_is_the_configs() {
        let unset = format!("{:?}", cfg(&[]));
        for t in TUNABLES {
            let set = format!("{:?}", cfg(&[(t.name, t.default)]));
            assert_eq!(set, unset, "{} = {}", t.name, t.default);
        }
        assert_eq!(cfg(&[]).allreduce_large, 64 << 10);
    }

    #[test]
    fn values_in_the_one_syntax_and_bad_ones_fall_back_to_the_default() {
        let c = cfg(&[
            ("WEFT_COLL_SHM", "0"),
            ("WEFT_COLL_HIER_MAX", "16KiB"),
            ("WEFT_COLL_SHM_TREE", "off"),
            ("WEFT_COLL_ALLREDUCE", "Ring"),
        ]);
        assert!(!c.shm);
        assert_eq!(c.hier_max, 16 << 10);
        assert_eq!(c.shm_tree, usize::MAX);
        assert_eq!(c.allreduce, Allreduce::Ring);
        let bad = cfg(&[("WEFT_COLL_SHM_RADIX", "65"), ("WEFT_COLL_BCAST", "tree")]);
        assert_eq!(bad.shm_radix, 4);
        assert_eq!(bad.bcast, Bcast::Auto);
    }
}

//! `WEFT_COLL_*`: the algorithm choices, read once per process and listed by `weft info`.

use std::sync::OnceLock;

/// One tunable: its variable, default and meaning (for `weft info`).
#[derive(Debug, Clone, Copy)]
pub struct Tunable {
    /// The environment variable.
    pub var: &'static str,
    /// Its default.
    pub default: &'static str,
    /// What it sets.
    pub help: &'static str,
}

/// Every collective tunable.
pub const TUNABLES: &[Tunable] = &[
    Tunable {
        var: "WEFT_COLL_SHM",
        default: "on",
        help: "node-local collectives through a shared-memory segment (barrier, bcast, reduce, allreduce, allgather, alltoall): on, off",
    },
    Tunable {
        var: "WEFT_COLL_SHM_MAX",
        default: "8K",
        help: "bytes up to which bcast, reduce and allreduce go through the segment's cells (at most 16K; allgather per rank and alltoall in all: up to the smaller of this and 4K)",
    },
    Tunable {
        var: "WEFT_COLL_SHM_TREE",
        default: "9",
        help: "members from which the node segment's barrier runs over its release/gather tree (2 log_radix(N) hops) instead of every member reading every other's flag (one hop, N reads each): a count (2 or more), or off",
    },
    Tunable {
        var: "WEFT_COLL_SHM_RADIX",
        default: "4",
        help: "children per member in the node segment's release/gather tree (2 to 64)",
    },
    Tunable {
        var: "WEFT_COLL_SINGLE_COPY",
        default: "auto",
        help: "node-local bcast (3+ members), reduce, allreduce, allgather and alltoall above WEFT_COLL_SHM_MAX read each other's buffers with one copy (CMA) when the kernel allows: auto, off (point-to-point)",
    },
    Tunable {
        var: "WEFT_COLL_HIER",
        default: "on",
        help: "communicators that span nodes with two or more members on some node: barrier, bcast and small allreduce in phases (node, leaders, node): on, off",
    },
    Tunable {
        var: "WEFT_COLL_HIER_MAX",
        default: "4K",
        help: "bytes up to which allreduce (commutative operations) is hierarchical",
    },
    Tunable {
        var: "WEFT_COLL_BCAST",
        default: "auto",
        help: "broadcast algorithm: auto, binomial, scatter-allgather",
    },
    Tunable {
        var: "WEFT_COLL_BCAST_LARGE",
        default: "256K",
        help:
            "auto: broadcasts of at least this many bytes (and 3+ processes) use scatter-allgather",
    },
    Tunable {
        var: "WEFT_COLL_ALLREDUCE",
        default: "auto",
        help: "allreduce algorithm: auto, recursive-doubling, rabenseifner (commutative ops), ring (commutative ops), reduce-bcast",
    },
    Tunable {
        var: "WEFT_COLL_ALLREDUCE_MID",
        default: "16K",
        help: "auto: allreduces of at least this many bytes (and 3+ processes) use Rabenseifner's algorithm (commutative ops; past WEFT_COLL_ALLREDUCE_LARGE only for a power-of-two size)",
    },
    Tunable {
        var: "WEFT_COLL_ALLREDUCE_LARGE",
        default: "64K",
        help: "auto: allreduces of at least this many bytes use the ring (commutative ops) where Rabenseifner's does not apply",
    },
    Tunable {
        var: "WEFT_COLL_ALLGATHER",
        default: "auto",
        help: "allgather algorithm: auto, bruck, ring",
    },
    Tunable {
        var: "WEFT_COLL_ALLGATHER_LARGE",
        default: "16K",
        help: "auto: allgathers of at least this many bytes per rank use the ring",
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

/// A size with an optional K, M or G suffix (powers of 1024).
pub(crate) fn parse_size(v: &str) -> Option<usize> {
    let v = v.trim();
    let (num, mult) = match v.char_indices().last()? {
        (i, 'k' | 'K') => (&v[..i], 1usize << 10),
        (i, 'm' | 'M') => (&v[..i], 1 << 20),
        (i, 'g' | 'G') => (&v[..i], 1 << 30),
        _ => (v, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mult)
}

fn default_of(var: &str) -> &'static str {
    TUNABLES
        .iter()
        .find(|t| t.var == var)
        .map_or("", |t| t.default)
}

fn read(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default_of(var).to_string())
}

fn size(var: &str) -> usize {
    let v = read(var);
    parse_size(&v).unwrap_or_else(|| {
        tracing::warn!(
            "{var}={v:?} is not a size (like 64K): using {}",
            default_of(var)
        );
        parse_size(default_of(var)).unwrap_or(0)
    })
}

/// A count between `min` and `max` (or `off`, read as `usize::MAX`, where allowed).
fn count(var: &str, min: usize, max: usize, off: bool) -> usize {
    let v = read(var);
    if off && v == "off" {
        return usize::MAX;
    }
    match v.trim().parse::<usize>() {
        Ok(c) if (min..=max).contains(&c) => c,
        _ => {
            let d = default_of(var);
            tracing::warn!("{var}={v:?} is not a count from {min} to {max}: using {d}");
            d.parse().unwrap_or(min)
        }
    }
}

fn choice<T: Copy>(var: &str, options: &[(&str, T)]) -> T {
    let v = read(var);
    match options.iter().find(|(n, _)| *n == v) {
        Some((_, t)) => *t,
        None => {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            tracing::warn!("{var}={v:?} is not one of {names:?}: using auto");
            options[0].1
        }
    }
}

impl Config {
    /// The process's tunables (read from the environment on first use).
    pub(crate) fn get() -> &'static Config {
        static C: OnceLock<Config> = OnceLock::new();
        C.get_or_init(Config::from_env)
    }

    fn from_env() -> Config {
        Config {
            shm: choice("WEFT_COLL_SHM", &[("on", true), ("off", false)]),
            shm_max: size("WEFT_COLL_SHM_MAX").min(weft_shm::CollSegment::CELL),
            shm_tree: count("WEFT_COLL_SHM_TREE", 2, usize::MAX, true),
            shm_radix: count("WEFT_COLL_SHM_RADIX", 2, 64, false),
            single_copy: choice("WEFT_COLL_SINGLE_COPY", &[("auto", true), ("off", false)]),
            hier: choice("WEFT_COLL_HIER", &[("on", true), ("off", false)]),
            hier_max: size("WEFT_COLL_HIER_MAX"),
            bcast: choice(
                "WEFT_COLL_BCAST",
                &[
                    ("auto", Bcast::Auto),
                    ("binomial", Bcast::Binomial),
                    ("scatter-allgather", Bcast::ScatterAllgather),
                ],
            ),
            bcast_large: size("WEFT_COLL_BCAST_LARGE"),
            allreduce: choice(
                "WEFT_COLL_ALLREDUCE",
                &[
                    ("auto", Allreduce::Auto),
                    ("recursive-doubling", Allreduce::RecursiveDoubling),
                    ("rabenseifner", Allreduce::Rabenseifner),
                    ("ring", Allreduce::Ring),
                    ("reduce-bcast", Allreduce::ReduceBcast),
                ],
            ),
            allreduce_mid: size("WEFT_COLL_ALLREDUCE_MID"),
            allreduce_large: size("WEFT_COLL_ALLREDUCE_LARGE"),
            allgather: choice(
                "WEFT_COLL_ALLGATHER",
                &[
                    ("auto", Allgather::Auto),
                    ("bruck", Allgather::Bruck),
                    ("ring", Allgather::Ring),
                ],
            ),
            allgather_large: size("WEFT_COLL_ALLGATHER_LARGE"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_suffixes() {
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("2m"), Some(2 << 20));
        assert_eq!(parse_size("17"), Some(17));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn every_tunable_default_parses() {
        let c = Config::from_env();
        assert_eq!(
            c.allreduce_large,
            parse_size(default_of("WEFT_COLL_ALLREDUCE_LARGE")).unwrap()
        );
        for t in TUNABLES {
            assert!(!t.default.is_empty(), "{}", t.var);
        }
    }
}

//! This machine's CPU topology, read through hwloc: the cores and their PUs
//! (hardware threads), binding a thread to a set of PUs, and the summary that
//! `weft info` prints.
//!
//! PUs are named by their OS index, the number Linux uses in `taskset`,
//! `/proc/self/status` (`Cpus_allowed_list`) and `/sys/devices/system/cpu/cpuN`.
//! Cores are listed in hwloc's logical order (depth-first through packages and
//! caches), which is what a launcher walks when it places ranks.
//!
//! The topology is loaded once per process and cached: it describes the
//! hardware and the cgroup the process was started in, neither of which changes
//! while we run. Bindings are not part of it and are always asked of the OS.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use hwlocality::bitmap::BitmapIndex;
use hwlocality::cpu::binding::{CpuBindingError, CpuBindingFlags};
use hwlocality::cpu::cpuset::CpuSet;
use hwlocality::errors::{HybridError, RawHwlocError};
use hwlocality::object::types::ObjectType;
use hwlocality::Topology;

/// The largest PU index a [`CpuList`] accepts, plus one (2^20).
///
/// Linux kernels support at most several thousand CPUs (`NR_CPUS`); the bound
/// only keeps a hostile list such as `0-4294967295` from allocating gigabytes.
const PU_INDEX_LIMIT: u32 = 1 << 20;

/// A set of PUs (hardware threads), named by their OS index, printable in the
/// Linux cpu-list form `0-3,8`.
///
/// Lists built by Weft are sorted and free of duplicates; [`Display`] prints
/// any list in that canonical form, so `to_string` then `parse` gives back the
/// canonical list.
///
/// [`Display`]: fmt::Display
//
// Public (not crate-private) because the crate root re-exports it: it is part
// of `ProcInfo::cpuset`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuList(pub(crate) Vec<u32>);

impl CpuList {
    /// The PUs' OS indexes, in the order the list holds them (ascending for
    /// lists built by Weft).
    pub fn pus(&self) -> &[u32] {
        &self.0
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut pus = self.0.clone();
        pus.sort_unstable();
        pus.dedup();
        let mut rest = pus.as_slice();
        let mut first_run = true;
        while let [start, ..] = rest {
            // Length of the run of consecutive indexes beginning at `start`
            // (checked so that a run ending at u32::MAX does not overflow).
            let len = 1 + rest
                .windows(2)
                .take_while(|pair| pair[0].checked_add(1) == Some(pair[1]))
                .count();
            let end = rest[len - 1];
            if !first_run {
                f.write_str(",")?;
            }
            first_run = false;
            if end == *start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            rest = &rest[len..];
        }
        Ok(())
    }
}

impl FromStr for CpuList {
    type Err = CpuListError;

    /// Parses `0-3,8`: comma-separated items, each a PU index or an inclusive
    /// range `first-last` with `first <= last`. Blank text is the empty list;
    /// whitespace around the whole text and around numbers is ignored (the
    /// kernel's files end in a newline). Overlaps are allowed and merged.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Ok(Self(Vec::new()));
        }
        let mut pus = Vec::new();
        for item in trimmed.split(',') {
            let bad = |reason: &'static str| CpuListError {
                input: text.to_owned(),
                item: item.to_owned(),
                reason,
            };
            let (first, last) = match item.split_once('-') {
                Some((first, last)) => (
                    parse_pu_index(first).map_err(bad)?,
                    parse_pu_index(last).map_err(bad)?,
                ),
                None => {
                    let pu = parse_pu_index(item).map_err(bad)?;
                    (pu, pu)
                }
            };
            if first > last {
                return Err(bad("the range runs backwards"));
            }
            pus.extend(first..=last);
        }
        pus.sort_unstable();
        pus.dedup();
        Ok(Self(pus))
    }
}

/// Parses one PU index of a cpu list, or says what is wrong with it.
fn parse_pu_index(text: &str) -> Result<u32, &'static str> {
    let digits = text.trim();
    if digits.is_empty() {
        return Err("a PU index is missing");
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("a PU index is not a decimal number");
    }
    match digits.parse::<u32>() {
        Ok(pu) if pu < PU_INDEX_LIMIT => Ok(pu),
        _ => Err("a PU index is 2^20 or more"),
    }
}

/// Text that is not a cpu list in the `0-3,8` form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cpu list {input:?}: {reason} in item {item:?} (expected e.g. \"0-3,8\")")]
pub struct CpuListError {
    /// The whole text that was parsed.
    input: String,
    /// The comma-separated item that is wrong.
    item: String,
    /// What is wrong with it.
    reason: &'static str,
}

/// Why a topology query or a binding failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// hwloc could not discover this machine's topology.
    #[error("cannot load this machine's hardware topology with hwloc")]
    Load {
        /// hwloc's report.
        #[source]
        source: RawHwlocError,
    },

    /// A thread cannot be bound to no PU at all.
    #[error("cannot bind the calling thread to an empty cpu list")]
    EmptyCpuList,

    /// The requested PUs are not all PUs this process may use.
    #[error(
        "cannot bind the calling thread to PUs {requested}: PUs {unknown} are not among \
         the PUs {allowed} this process may use"
    )]
    UnknownPus {
        /// The PUs asked for.
        requested: CpuList,
        /// Those of them the topology does not offer.
        unknown: CpuList,
        /// The PUs the topology does offer (hwloc's allowed cpuset).
        allowed: CpuList,
    },

    /// The OS refused to bind the calling thread.
    #[error("cannot bind the calling thread to PUs {requested}")]
    Bind {
        /// The PUs asked for.
        requested: CpuList,
        /// hwlocality's report.
        #[source]
        source: HybridError<CpuBindingError>,
    },

    /// The OS would not tell the current CPU binding.
    #[error("cannot read the CPU binding of the {target}")]
    QueryBinding {
        /// Whose binding was asked for: "calling process" or "calling thread".
        target: &'static str,
        /// hwlocality's report.
        #[source]
        source: HybridError<CpuBindingError>,
    },
}

/// This process's topology, loaded on first use.
static TOPOLOGY: OnceLock<Topology> = OnceLock::new();

/// Returns the cached topology, loading it on first use.
///
/// A failed load is not cached, so a later call tries again.
fn topology() -> Result<&'static Topology, TopologyError> {
    if let Some(topology) = TOPOLOGY.get() {
        return Ok(topology);
    }
    // Two threads may race to load; the loser's copy is dropped unused.
    let loaded = Topology::new().map_err(|source| {
        tracing::warn!(error = %source, "hwloc topology load failed");
        TopologyError::Load { source }
    })?;
    Ok(TOPOLOGY.get_or_init(|| loaded))
}

/// Converts an hwloc cpuset into a [`CpuList`], clipping an infinite set (a
/// binding hwloc reports as "all PUs, present and future") to the topology's
/// complete cpuset so it can be listed.
fn cpu_list_of(topology: &Topology, set: &CpuSet) -> CpuList {
    let clipped;
    let set = if set.weight().is_some() {
        set
    } else {
        clipped = set & &*topology.complete_cpuset();
        &clipped
    };
    CpuList(
        set.iter_set()
            // hwloc bitmap indexes are below 2^31, so they always fit.
            .map(|pu| u32::try_from(pu).expect("hwloc bitmap indexes fit in u32"))
            .collect(),
    )
}

/// The cores of this machine in logical order, each as the PUs (OS indexes) it
/// holds. Loads the hwloc topology (once per process).
///
/// Only PUs this process may use (its cgroup's cpuset) are listed, and cores
/// with none of them are left out. If hwloc finds no cores (some virtual
/// machines and exotic architectures), each PU is reported as a core of its own.
pub fn cores() -> Result<Vec<CpuList>, TopologyError> {
    let topology = topology()?;
    let mut found = cores_of_type(topology, ObjectType::Core);
    if found.is_empty() {
        found = cores_of_type(topology, ObjectType::PU);
    }
    Ok(found)
}

/// The non-empty PU lists of the topology's objects of type `ty`, in logical
/// order.
fn cores_of_type(topology: &Topology, ty: ObjectType) -> Vec<CpuList> {
    topology
        .objects_with_type(ty)
        .filter_map(|object| object.cpuset())
        .map(|set| cpu_list_of(topology, &set))
        .filter(|pus| !pus.0.is_empty())
        .collect()
}

/// Binds the calling thread (only it) to `cpus` (hwloc `CpuBindingFlags::THREAD`);
/// a child forked afterwards from this thread inherits the mask.
///
/// Every PU of `cpus` must be one this process may use (see [`cores`]).
pub fn bind_current_thread(cpus: &CpuList) -> Result<(), TopologyError> {
    if cpus.0.is_empty() {
        return Err(TopologyError::EmptyCpuList);
    }
    let topology = topology()?;
    let allowed = topology.allowed_cpuset();
    let mut set = CpuSet::new();
    let mut unknown = Vec::new();
    for &pu in &cpus.0 {
        match usize::try_from(pu)
            .ok()
            .and_then(|pu| BitmapIndex::try_from(pu).ok())
        {
            Some(index) if allowed.is_set(index) => set.set(index),
            _ => unknown.push(pu),
        }
    }
    if !unknown.is_empty() {
        let mut requested = cpus.clone();
        requested.0.sort_unstable();
        requested.0.dedup();
        unknown.sort_unstable();
        unknown.dedup();
        return Err(TopologyError::UnknownPus {
            requested,
            unknown: CpuList(unknown),
            allowed: cpu_list_of(topology, &allowed),
        });
    }
    topology
        .bind_cpu(&set, CpuBindingFlags::THREAD)
        .map_err(|source| {
            tracing::warn!(cpus = %cpus, error = %source, "binding the calling thread failed");
            TopologyError::Bind {
                requested: cpus.clone(),
                source,
            }
        })
}

/// The calling process's current CPU binding as a [`CpuList`] (what the process
/// is allowed to run on).
///
/// This is the union of the bindings of all the process's threads
/// (hwloc `CpuBindingFlags::PROCESS` without `STRICT`), so one thread binding
/// itself narrower does not shrink it while another thread is unbound.
pub fn current_binding() -> Result<CpuList, TopologyError> {
    binding_of(CpuBindingFlags::PROCESS, "calling process")
}

/// The calling thread's current CPU binding as a [`CpuList`] (what
/// [`bind_current_thread`] set, or what the thread inherited).
pub fn current_thread_binding() -> Result<CpuList, TopologyError> {
    binding_of(CpuBindingFlags::THREAD, "calling thread")
}

/// Asks hwloc for the current binding of the target named by `flags`.
fn binding_of(flags: CpuBindingFlags, target: &'static str) -> Result<CpuList, TopologyError> {
    let topology = topology()?;
    let set = topology.cpu_binding(flags).map_err(|source| {
        tracing::warn!(target_of_query = target, error = %source, "reading the CPU binding failed");
        TopologyError::QueryBinding { target, source }
    })?;
    Ok(cpu_list_of(topology, &set))
}

/// One line per fact, for `weft info`: hwloc version, number of packages, NUMA
/// nodes, cores, PUs.
///
/// The version is the API version of the hwloc library loaded at run time
/// (hwloc bumps it only on releases that change the API).
pub fn summary() -> Result<String, TopologyError> {
    let topology = topology()?;
    let api = hwlocality::hwloc_api_version();
    let count = |ty| topology.objects_with_type(ty).len();
    Ok(format!(
        "hwloc API version: {}.{}.{}\n\
         packages: {}\n\
         NUMA nodes: {}\n\
         cores: {}\n\
         PUs: {}\n",
        api >> 16,
        (api >> 8) & 0xff,
        api & 0xff,
        count(ObjectType::Package),
        count(ObjectType::NUMANode),
        cores()?.len(),
        count(ObjectType::PU),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::error::Error as _;

    fn list(pus: &[u32]) -> CpuList {
        CpuList(pus.to_vec())
    }

    #[test]
    fn cpu_list_known_forms() {
        let cases: &[(&str, &[u32])] = &[
            ("", &[]),
            ("0", &[0]),
            ("7", &[7]),
            ("0-1", &[0, 1]),
            ("0-3,8", &[0, 1, 2, 3, 8]),
            ("1,3,5", &[1, 3, 5]),
            ("0-2,4-6,9,11-12", &[0, 1, 2, 4, 5, 6, 9, 11, 12]),
            ("1048575", &[1_048_575]),
        ];
        for &(text, pus) in cases {
            let parsed: CpuList = text.parse().unwrap();
            assert_eq!(parsed, list(pus), "parsing {text:?}");
            assert_eq!(parsed.pus(), pus);
            assert_eq!(list(pus).to_string(), text, "printing {pus:?}");
        }
    }

    #[test]
    fn cpu_list_lenient_input_is_canonicalised() {
        let cases: &[(&str, &str)] = &[
            ("0-3,8\n", "0-3,8"),
            ("  ", ""),
            ("7-7", "7"),
            ("8,0-3", "0-3,8"),
            ("0-3,2-5,5", "0-5"),
            ("1, 2 - 3", "1-3"),
            ("007", "7"),
        ];
        for &(text, canonical) in cases {
            let parsed: CpuList = text.parse().unwrap();
            assert_eq!(parsed.to_string(), canonical, "parsing {text:?}");
        }
        // Display canonicalises unsorted, duplicated lists built by hand, and
        // copes with indexes no parse would produce.
        assert_eq!(list(&[8, 3, 2, 3, 1, 0]).to_string(), "0-3,8");
        assert_eq!(
            list(&[u32::MAX, 0, u32::MAX - 1]).to_string(),
            "0,4294967294-4294967295"
        );
    }

    #[test]
    fn cpu_list_rejects_malformed_text() {
        for text in [
            "3-1",
            "a",
            "1,,2",
            "1,",
            ",1",
            "-1",
            "1-",
            "1-2-3",
            "+1",
            "0x1",
            "1.5",
            "1 2",
            "1048576",
            "99999999999",
            "0-4294967295",
            "1:2",
            "0-7:2/4",
        ] {
            let err = text.parse::<CpuList>().expect_err(text);
            let message = err.to_string();
            assert_eq!(err.input, text);
            assert!(
                message.contains(&format!("{text:?}")),
                "{text:?}: message {message:?} should quote the input"
            );
        }
        let err = "1,,2".parse::<CpuList>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid cpu list \"1,,2\": a PU index is missing in item \"\" (expected e.g. \"0-3,8\")"
        );
        let err = "3-1".parse::<CpuList>().unwrap_err();
        assert!(err.to_string().contains("backwards"), "{err}");
    }

    proptest! {
        #[test]
        fn cpu_list_round_trips(pus in proptest::collection::vec(0u32..200, 0..40)) {
            let mut canonical = pus.clone();
            canonical.sort_unstable();
            canonical.dedup();
            let text = CpuList(pus).to_string();
            let parsed: CpuList = text.parse().unwrap();
            prop_assert_eq!(&parsed.0, &canonical);
            prop_assert_eq!(parsed.to_string(), text);
        }

        #[test]
        fn cpu_list_round_trips_large_indexes(
            pus in proptest::collection::vec(0u32..PU_INDEX_LIMIT, 1..8),
        ) {
            let mut canonical = pus.clone();
            canonical.sort_unstable();
            canonical.dedup();
            let parsed: CpuList = CpuList(pus).to_string().parse().unwrap();
            prop_assert_eq!(parsed.0, canonical);
        }

        #[test]
        fn cpu_list_parse_never_panics(text in "[0-9,\\- a]{0,12}") {
            let _ = text.parse::<CpuList>();
        }
    }

    #[test]
    fn cores_are_non_empty_and_disjoint() {
        let cores = cores().unwrap();
        assert!(!cores.is_empty());
        let mut seen = std::collections::BTreeSet::new();
        for core in &cores {
            assert!(!core.0.is_empty(), "empty core in {cores:?}");
            for &pu in &core.0 {
                assert!(seen.insert(pu), "PU {pu} is in two cores: {cores:?}");
            }
        }
    }

    #[test]
    fn binding_a_thread_affects_only_that_thread() {
        let core0 = cores().unwrap()[0].clone();
        let before = current_thread_binding().unwrap();
        let bound = std::thread::spawn(move || {
            bind_current_thread(&core0).unwrap();
            (core0, current_thread_binding().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(bound.1, bound.0);
        assert_eq!(current_thread_binding().unwrap(), before);
    }

    #[test]
    fn child_of_a_bound_thread_inherits_its_binding() {
        let core0 = cores().unwrap()[0].clone();
        let expected = core0.clone();
        let output = std::thread::spawn(move || {
            bind_current_thread(&core0).unwrap();
            std::process::Command::new("grep")
                .args(["Cpus_allowed_list", "/proc/self/status"])
                .output()
                .unwrap()
        })
        .join()
        .unwrap();
        assert!(output.status.success(), "grep failed: {output:?}");
        let stdout = String::from_utf8(output.stdout).unwrap();
        let (_, value) = stdout.split_once(':').expect("Cpus_allowed_list: <list>");
        assert_eq!(value.parse::<CpuList>().unwrap(), expected, "{stdout:?}");
    }

    #[test]
    fn process_binding_covers_the_main_thread() {
        let process = current_binding().unwrap();
        assert!(!process.0.is_empty());
        // /proc/self/status describes the main thread, which the test harness
        // never binds; the process-wide binding is a union that includes it.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status
            .lines()
            .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list in /proc/self/status");
        let main_thread: CpuList = line.parse().unwrap();
        for pu in &main_thread.0 {
            assert!(process.0.contains(pu), "{main_thread} not in {process}");
        }
    }

    #[test]
    fn binding_rejects_empty_and_unknown_pus() {
        let err = bind_current_thread(&CpuList(Vec::new())).unwrap_err();
        assert!(matches!(err, TopologyError::EmptyCpuList), "{err:?}");

        let first = cores().unwrap()[0].0[0];
        let err = std::thread::spawn(move || {
            bind_current_thread(&list(&[first, 1_000_000, u32::MAX])).unwrap_err()
        })
        .join()
        .unwrap();
        match &err {
            TopologyError::UnknownPus { unknown, .. } => {
                assert_eq!(unknown, &list(&[1_000_000, u32::MAX]));
            }
            other => panic!("expected UnknownPus, got {other:?}"),
        }
        assert!(
            err.to_string().contains("PUs 1000000,4294967295 are not"),
            "{err}"
        );
    }

    #[test]
    fn summary_has_one_line_per_fact() {
        let summary = summary().unwrap();
        let lines: Vec<&str> = summary.lines().collect();
        assert_eq!(lines.len(), 5, "{summary}");
        assert!(lines[0].starts_with("hwloc API version: 2."), "{summary}");
        let cores = cores().unwrap();
        assert_eq!(lines[3], format!("cores: {}", cores.len()));
        let pus: usize = cores.iter().map(|core| core.0.len()).sum();
        assert_eq!(lines[4], format!("PUs: {pus}"));
        for (line, label) in lines[1..].iter().zip(["packages", "NUMA nodes"]) {
            let count: usize = line
                .strip_prefix(label)
                .and_then(|rest| rest.strip_prefix(": "))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{line:?} should be \"{label}: N\""));
            assert!(count >= 1, "{summary}");
        }
    }

    #[test]
    fn load_error_carries_hwloc_source() {
        let err = TopologyError::Load {
            source: RawHwlocError {
                api: "hwloc_topology_load",
                errno: None,
            },
        };
        assert!(err.source().is_some());
        assert!(err.to_string().contains("topology"));
    }
}

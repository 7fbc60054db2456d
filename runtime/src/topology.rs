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

use std::sync::OnceLock;

use hwlocality::bitmap::BitmapIndex;
use hwlocality::cpu::binding::{CpuBindingError, CpuBindingFlags};
use hwlocality::cpu::cpuset::CpuSet;
use hwlocality::errors::{HybridError, RawHwlocError};
use hwlocality::object::types::ObjectType;
use hwlocality::Topology;
use weft_wireup::CpuList;

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
    CpuList::from(
        set.iter_set()
            // hwloc bitmap indexes are below 2^31, so they always fit.
            .map(|pu| u32::try_from(pu).expect("hwloc bitmap indexes fit in u32"))
            .collect::<Vec<u32>>(),
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
        .filter(|pus| !pus.pus().is_empty())
        .collect()
}

/// Binds the calling thread (only it) to `cpus` (hwloc `CpuBindingFlags::THREAD`);
/// a child forked afterwards from this thread inherits the mask.
///
/// Every PU of `cpus` must be one this process may use (see [`cores`]).
pub fn bind_current_thread(cpus: &CpuList) -> Result<(), TopologyError> {
    if cpus.pus().is_empty() {
        return Err(TopologyError::EmptyCpuList);
    }
    let topology = topology()?;
    let allowed = topology.allowed_cpuset();
    let mut set = CpuSet::new();
    let mut unknown = Vec::new();
    for &pu in cpus.pus() {
        match usize::try_from(pu)
            .ok()
            .and_then(|pu| BitmapIndex::try_from(pu).ok())
        {
            Some(index) if allowed.is_set(index) => set.set(index),
            _ => unknown.push(pu),
        }
    }
    if !unknown.is_empty() {
        let mut requested = cpus.pus().to_vec();
        requested.sort_unstable();
        requested.dedup();
        unknown.sort_unstable();
        unknown.dedup();
        return Err(TopologyError::UnknownPus {
            requested: CpuList::from(requested),
            unknown: CpuList::from(unknown),
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
    use std::error::Error as _;

    fn list(pus: &[u32]) -> CpuList {
        CpuList::from(pus.to_vec())
    }

    #[test]
    fn cores_are_non_empty_and_disjoint() {
        let cores = cores().unwrap();
        assert!(!cores.is_empty());
        let mut seen = std::collections::BTreeSet::new();
        for core in &cores {
            assert!(!core.pus().is_empty(), "empty core in {cores:?}");
            for &pu in core.pus() {
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
        assert!(!process.pus().is_empty());
        // /proc/self/status describes the main thread, which the test harness
        // never binds; the process-wide binding is a union that includes it.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status
            .lines()
            .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list in /proc/self/status");
        let main_thread: CpuList = line.parse().unwrap();
        for pu in main_thread.pus() {
            assert!(process.pus().contains(pu), "{main_thread} not in {process}");
        }
    }

    #[test]
    fn binding_rejects_empty_and_unknown_pus() {
        let err = bind_current_thread(&CpuList::from(Vec::new())).unwrap_err();
        assert!(matches!(err, TopologyError::EmptyCpuList), "{err:?}");

        let first = cores().unwrap()[0].pus()[0];
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
        let pus: usize = cores.iter().map(|core| core.pus().len()).sum();
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

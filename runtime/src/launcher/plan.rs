//! The planning half of `weft run`, without IO but the local host's name and topology:
//! the command line parsed into a [`LaunchSpec`], and the spec turned into the job's
//! [`JobPlan`] (ranks to nodes, app contexts, process sets, bindings, environment). The
//! run loop (`launcher.rs`) starts the servers and hands them the plan.

use std::io;
use std::time::Duration;

use crate::topology;
use crate::wire::proto::{AppSpec, JobPlan};
use weft_wireup::job::{AppInfo, JobInfo, NodeInfo, ProcInfo, Pset, PSET_WORLD, WORLD_PGCID};
use weft_wireup::CpuList;
use weft_wireup::Rank;

/// One app context: `-n N [--pset NAME] PROGRAM ARGS...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppContext {
    /// Number of processes.
    pub n: u32,
    /// Optional process set name.
    pub pset: Option<String>,
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
}

/// How ranks are placed on nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapBy {
    /// Fill a node before the next (the default).
    Slot,
    /// Round robin over nodes.
    Node,
}

/// How processes are bound to CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindTo {
    /// Not bound (the default).
    None,
    /// Each process to one core, in order.
    Core,
}

/// Everything `weft run` was asked to do.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The app contexts, in rank order.
    pub apps: Vec<AppContext>,
    /// Number of logical nodes on this machine (ignored with `hosts`).
    pub nodes: u32,
    /// Hosts to start one server on each, over the launch agent.
    pub hosts: Option<Vec<String>>,
    /// The remote shell used with `hosts` (default `ssh`).
    pub launch_agent: String,
    /// Address the launcher listens on for its servers (default 127.0.0.1).
    pub listen: std::net::IpAddr,
    /// Mapping policy.
    pub map_by: MapBy,
    /// Binding policy.
    pub bind_to: BindTo,
    /// Kill the job after this long.
    pub timeout: Option<Duration>,
    /// Prefix every output line with `[job,rank]<stream>:`.
    pub tag_output: bool,
    /// Do not terminate the others when a process fails.
    pub keep_going: bool,
    /// Job id (unique name for sockets and segments); random by default.
    pub job_id: Option<String>,
    /// Extra environment for every process.
    pub env: Vec<(String, String)>,
    /// Grace period after a process fails before the others are terminated.
    pub grace: Duration,
    /// Bytes of each node's datastore segment (sparse).
    pub datastore_bytes: u64,
    /// The server command (default: this executable with `server`).
    pub server_command: Option<Vec<String>>,
    /// Offer PMIx to the processes (an embedded PMIx server on every node; default on,
    /// `--no-pmix` turns it off).
    pub pmix: bool,
}

impl Default for LaunchSpec {
    fn default() -> Self {
        LaunchSpec {
            apps: Vec::new(),
            nodes: 1,
            hosts: None,
            launch_agent: "ssh".into(),
            listen: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            map_by: MapBy::Slot,
            bind_to: BindTo::None,
            timeout: None,
            tag_output: false,
            keep_going: false,
            job_id: None,
            env: Vec::new(),
            grace: crate::tunable_or_default("WEFT_RUN_GRACE_MS", |get| {
                weft_tunables::find(crate::TUNABLES, "WEFT_RUN_GRACE_MS").millis_in(
                    get,
                    Duration::ZERO,
                    Duration::from_secs(3600),
                )
            }),
            datastore_bytes: crate::tunable_or_default("WEFT_DATASTORE_BYTES", |get| {
                weft_tunables::find(crate::TUNABLES, "WEFT_DATASTORE_BYTES").size_in(
                    get,
                    1 << 20,
                    1 << 40,
                )
            }),
            server_command: None,
            pmix: true,
        }
    }
}

/// Errors of [`run`](super::run) before the job runs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// The command line was not understood.
    #[error("weft run: {0}")]
    Usage(String),
    /// Setting up the job failed.
    #[error("weft run: {what}: {source}")]
    Setup {
        /// What was being set up.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// The usage text of `weft run`.
pub const USAGE: &str = "\
usage: weft run [OPTIONS] -n N [--pset NAME] [--] PROGRAM [ARGS...] [: -n M [--pset NAME] PROGRAM [ARGS...]]...

options:
  -n, --np N            processes of this app context
  --pset NAME           process set of this app context
  --nodes K             logical nodes on this machine, one weft server each (default 1)
  --hosts H1,H2,...     one node per host, servers started over the launch agent (ssh)
  --launch-agent CMD    remote shell for --hosts (default ssh)
  --listen ADDR         address the launcher listens on for servers (default 127.0.0.1)
  --map-by slot|node    fill nodes (default) or round robin
  --bind-to core|none   bind each process to a core (default none)
  --timeout S           kill the job after S seconds (exit status 124)
  --tag-output          prefix output lines with [job,rank]<stdout|stderr>:
  --keep-going          do not terminate the job when a process fails
  --no-pmix             do not serve PMIx (Open MPI programs need it; Weft programs and
                        MPICH's PMI-1 do not)
  --job-id ID           name of the job's sockets and segments (default random)
  -x VAR[=VALUE]        export VAR (from this environment, or VALUE) to every process";

fn parse_num<T: std::str::FromStr>(opt: &str, v: Option<&String>) -> Result<T, LaunchError> {
    let v = v.ok_or_else(|| LaunchError::Usage(format!("{opt} needs a value")))?;
    v.parse()
        .map_err(|_| LaunchError::Usage(format!("{opt}: {v:?} is not a valid number")))
}

/// Parses the arguments of `weft run` (everything after `run`).
pub fn parse_run_args(args: &[String]) -> Result<LaunchSpec, LaunchError> {
    let mut spec = LaunchSpec::default();
    let mut i = 0;
    let usage = |m: String| LaunchError::Usage(m);
    while i < args.len() {
        let mut n: Option<u32> = None;
        let mut pset: Option<String> = None;
        // Options up to the program.
        loop {
            let Some(a) = args.get(i) else {
                return Err(usage("missing PROGRAM".into()));
            };
            let val = args.get(i + 1);
            let take = |v: Option<&String>, opt: &str| {
                v.cloned()
                    .ok_or_else(|| usage(format!("{opt} needs a value")))
            };
            match a.as_str() {
                "-n" | "--np" | "-np" => n = Some(parse_num(a, val)?),
                "--pset" => pset = Some(take(val, a)?),
                "--nodes" => spec.nodes = parse_num(a, val)?,
                "--hosts" => {
                    spec.hosts = Some(
                        take(val, a)?
                            .split(',')
                            .filter(|h| !h.is_empty())
                            .map(str::to_owned)
                            .collect(),
                    )
                }
                "--launch-agent" => spec.launch_agent = take(val, a)?,
                "--listen" => {
                    let v = take(val, a)?;
                    spec.listen = v
                        .parse()
                        .map_err(|_| usage(format!("--listen: {v:?} is not an IP address")))?;
                }
                "--map-by" => {
                    spec.map_by = match take(val, a)?.as_str() {
                        "slot" => MapBy::Slot,
                        "node" => MapBy::Node,
                        o => {
                            return Err(usage(format!(
                                "--map-by: unknown policy {o:?} (slot or node)"
                            )))
                        }
                    }
                }
                "--bind-to" => {
                    spec.bind_to = match take(val, a)?.as_str() {
                        "core" => BindTo::Core,
                        "none" => BindTo::None,
                        o => {
                            return Err(usage(format!(
                                "--bind-to: unknown policy {o:?} (core or none)"
                            )))
                        }
                    }
                }
                "--timeout" => {
                    let s: f64 = parse_num(a, val)?;
                    if !(s > 0.0 && s.is_finite()) {
                        return Err(usage(format!(
                            "--timeout: {s} is not a positive number of seconds"
                        )));
                    }
                    spec.timeout = Some(Duration::from_secs_f64(s));
                }
                "--job-id" => spec.job_id = Some(take(val, a)?),
                "-x" => {
                    let v = take(val, a)?;
                    let kv = match v.split_once('=') {
                        Some((k, v)) => (k.to_owned(), v.to_owned()),
                        None => (v.clone(), std::env::var(&v).unwrap_or_default()),
                    };
                    spec.env.push(kv);
                }
                "--tag-output" => {
                    spec.tag_output = true;
                    i += 1;
                    continue;
                }
                "--keep-going" => {
                    spec.keep_going = true;
                    i += 1;
                    continue;
                }
                "--no-pmix" => {
                    spec.pmix = false;
                    i += 1;
                    continue;
                }
                "--" => {
                    i += 1;
                    break;
                }
                ":" => return Err(usage("empty app context before ':'".into())),
                s if s.starts_with('-') => {
                    return Err(usage(format!("unknown option {s:?}\n{USAGE}")))
                }
                _ => break,
            }
            i += 2;
        }
        let program = args
            .get(i)
            .cloned()
            .ok_or_else(|| usage("missing PROGRAM".into()))?;
        i += 1;
        let mut pargs = Vec::new();
        while i < args.len() && args[i] != ":" {
            pargs.push(args[i].clone());
            i += 1;
        }
        if i < args.len() {
            i += 1; // the ':'
            if i == args.len() {
                return Err(usage("nothing after ':'".into()));
            }
        }
        let n = n.ok_or_else(|| usage(format!("app context {program:?} has no -n")))?;
        if n == 0 {
            return Err(usage(format!(
                "app context {program:?}: -n must be at least 1"
            )));
        }
        spec.apps.push(AppContext {
            n,
            pset,
            program,
            args: pargs,
        });
    }
    if spec.apps.is_empty() {
        return Err(usage(format!("nothing to run\n{USAGE}")));
    }
    if spec.nodes == 0 {
        return Err(usage("--nodes must be at least 1".into()));
    }
    Ok(spec)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Builds the job map: placement, app contexts, psets, bindings.
pub(crate) fn build_plan(spec: &LaunchSpec, job_id: &str) -> Result<JobPlan, LaunchError> {
    let total: u32 = spec.apps.iter().map(|a| a.n).sum();
    let (num_nodes, node_names): (u32, Vec<String>) = match &spec.hosts {
        Some(h) if h.is_empty() => return Err(LaunchError::Usage("--hosts names no host".into())),
        Some(h) => (h.len() as u32, h.clone()),
        None => {
            let host = hostname();
            (
                spec.nodes,
                (0..spec.nodes).map(|i| format!("{host}-n{i}")).collect(),
            )
        }
    };
    if total < num_nodes {
        return Err(LaunchError::Usage(format!(
            "{total} processes on {num_nodes} nodes would leave nodes without processes; use --nodes {total} or fewer"
        )));
    }
    // Slot mapping fills nodes with contiguous blocks of ranks whose sizes differ by at
    // most one, so every node is used.
    let node_of = |r: u32| match spec.map_by {
        MapBy::Slot => (u64::from(r) * u64::from(num_nodes) / u64::from(total)) as u32,
        MapBy::Node => r % num_nodes,
    };
    let mut local_counts = vec![0u32; num_nodes as usize];
    let mut procs = Vec::with_capacity(total as usize);
    let mut apps = Vec::new();
    let mut specs = Vec::new();
    let mut rank = 0;
    for (a, app) in spec.apps.iter().enumerate() {
        apps.push(AppInfo {
            size: app.n,
            first_rank: rank,
            program: app.program.clone(),
            pset: app.pset.clone(),
        });
        specs.push(AppSpec {
            program: app.program.clone(),
            args: app.args.clone(),
            cwd: std::env::current_dir()
                .ok()
                .map(|d| d.display().to_string()),
        });
        for _ in 0..app.n {
            let node = node_of(rank);
            let local_rank = local_counts[node as usize];
            local_counts[node as usize] += 1;
            procs.push(ProcInfo {
                node,
                local_rank,
                app: a as u32,
                cpuset: None,
                locality: None,
            });
            rank += 1;
        }
    }
    let mut psets = vec![Pset {
        name: PSET_WORLD.into(),
        members: (0..total).collect(),
    }];
    for (a, app) in spec.apps.iter().enumerate() {
        let Some(name) = &app.pset else { continue };
        if name.starts_with("weft://") {
            return Err(LaunchError::Usage(format!(
                "--pset {name:?}: names starting with weft:// are reserved"
            )));
        }
        let members: Vec<Rank> = (apps[a].first_rank..apps[a].first_rank + app.n).collect();
        match psets.iter_mut().find(|p| &p.name == name) {
            Some(p) => {
                p.members.extend(members);
                p.members.sort_unstable();
            }
            None => psets.push(Pset {
                name: name.clone(),
                members,
            }),
        }
    }
    let mut bind = vec![None; total as usize];
    if spec.bind_to == BindTo::Core {
        let cores = topology::cores().map_err(|e| LaunchError::Setup {
            what: "--bind-to core".into(),
            source: io::Error::other(e.to_string()),
        })?;
        if cores.is_empty() {
            return Err(LaunchError::Usage(
                "--bind-to core: this machine reports no cores".into(),
            ));
        }
        // Processes of one host take consecutive cores: node by node when the logical
        // nodes share this host, by local rank on separate hosts.
        let mut order: Vec<Rank> = (0..total).collect();
        order.sort_by_key(|&r| (procs[r as usize].node, procs[r as usize].local_rank));
        for (i, &r) in order.iter().enumerate() {
            let slot = if spec.hosts.is_some() {
                procs[r as usize].local_rank as usize
            } else {
                i
            };
            let c: CpuList = cores[slot % cores.len()].clone();
            procs[r as usize].cpuset = Some(c.clone());
            bind[r as usize] = Some(c);
        }
    }
    let job = JobInfo {
        nspace: format!("weft-{job_id}"),
        nodes: node_names
            .into_iter()
            .enumerate()
            .map(|(i, hostname)| NodeInfo {
                id: i as u32,
                hostname,
            })
            .collect(),
        procs,
        apps,
        psets,
        world_pgcid: WORLD_PGCID,
    };
    Ok(JobPlan {
        job,
        apps: specs,
        tag_output: spec.tag_output,
        bind,
        datastore_bytes: spec.datastore_bytes,
        job_id: job_id.to_owned(),
        env: {
            let mut env = spec.env.clone();
            // Logical nodes share this machine's CPUs: tell every process how many of the
            // job's processes run here (waiting loops yield early past the CPU count).
            if spec.hosts.is_none() && !env.iter().any(|(k, _)| k == weft_wireup::env::HOST_PROCS) {
                env.push((weft_wireup::env::HOST_PROCS.to_owned(), total.to_string()));
            }
            env
        },
        pmix: spec.pmix,
    })
}

#[cfg(test)]
mod tests;

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
    /// Number of logical nodes on this machine (ignored with `servers.hosts`).
    pub nodes: u32,
    /// Mapping policy.
    pub map_by: MapBy,
    /// Binding policy.
    pub bind_to: BindTo,
    /// Prefix every output line with `[job,rank]<stream>:`.
    pub tag_output: bool,
    /// Job id (unique name for sockets and segments); random by default.
    pub job_id: Option<String>,
    /// Extra environment for every process.
    pub env: Vec<(String, String)>,
    /// Bytes of each node's datastore segment (sparse).
    pub datastore_bytes: u64,
    /// Offer PMIx to the processes (an embedded PMIx server on every node; default on,
    /// `--no-pmix` turns it off).
    pub pmix: bool,
    /// Where and how the node servers are started and reached.
    pub servers: ServerLaunch,
    /// When the job is ended: its time limit and what a failing process means.
    pub ending: EndPolicy,
    /// Submit the job to this persistent runtime (`--dvm URI`, a `weft://` URI, `file:PATH`
    /// or the path of the file `weft dvm start --report-uri` wrote) instead of starting
    /// servers for it.
    pub dvm: Option<String>,
    /// The allocation session of the persistent runtime to run in (`--session ID`: its
    /// number or allocation id; only with `--dvm`).
    pub session: Option<String>,
    /// Hold every process in `PMIx_Init` until a PMIx tool (a debugger) releases it
    /// (`--stop-in-init`).
    pub stop_in_init: bool,
}

/// Where and how `weft run` starts its node servers and where they reach it.
#[derive(Debug, Clone)]
pub struct ServerLaunch {
    /// Hosts to start one server on each, over the launch agent.
    pub hosts: Option<Vec<String>>,
    /// The remote shell used with `hosts` (default `ssh`).
    pub launch_agent: String,
    /// Address the launcher listens on for its servers (default 127.0.0.1).
    pub listen: std::net::IpAddr,
    /// The server command (default: this executable with `server`).
    pub server_command: Option<Vec<String>>,
    /// Start the servers with one `srun` step, one per node of the Slurm allocation this
    /// runs in (`weft dvm start` inside an allocation).
    pub slurm: bool,
    /// Write the PMIx server's URI (node 0's, for tools: `pps --uri file:PATH`) to this
    /// file, or to stdout for `-` (`--report-pmix-uri`).
    pub report_pmix_uri: Option<String>,
    /// Node 0's PMIx server is also this host's system server (`--pmix-system-server`:
    /// tools connecting with `--system-server` find it).
    pub pmix_system_server: bool,
}

/// When a job is ended other than by all its processes exiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndPolicy {
    /// Kill the job after this long.
    pub timeout: Option<Duration>,
    /// Do not terminate the others when a process fails.
    pub keep_going: bool,
    /// Grace period after a process fails before the others are terminated.
    pub grace: Duration,
}

impl Default for ServerLaunch {
    fn default() -> Self {
        ServerLaunch {
            hosts: None,
            launch_agent: "ssh".into(),
            listen: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            server_command: None,
            slurm: false,
            report_pmix_uri: None,
            pmix_system_server: false,
        }
    }
}

impl Default for EndPolicy {
    fn default() -> Self {
        EndPolicy {
            timeout: None,
            keep_going: false,
            grace: crate::tunable_or_default("WEFT_RUN_GRACE_MS", |get| {
                weft_tunables::find(crate::TUNABLES, "WEFT_RUN_GRACE_MS").millis_in(
                    get,
                    Duration::ZERO,
                    Duration::from_secs(3600),
                )
            }),
        }
    }
}

impl Default for LaunchSpec {
    fn default() -> Self {
        LaunchSpec {
            apps: Vec::new(),
            nodes: 1,
            map_by: MapBy::Slot,
            bind_to: BindTo::None,
            tag_output: false,
            job_id: None,
            env: Vec::new(),
            datastore_bytes: crate::tunable_or_default("WEFT_DATASTORE_BYTES", |get| {
                weft_tunables::find(crate::TUNABLES, "WEFT_DATASTORE_BYTES").size_in(
                    get,
                    1 << 20,
                    1 << 40,
                )
            }),
            pmix: true,
            servers: ServerLaunch::default(),
            ending: EndPolicy::default(),
            dvm: None,
            session: None,
            stop_in_init: false,
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
  --report-pmix-uri F   write the PMIx server's URI for tools to file F (- : stdout);
                        tools also find it by this launcher's pid (pps --pid PID)
  --pmix-system-server  serve PMIx tools as this host's system server (--system-server)
  --stop-in-init        hold every process in init (PMIx_Init, a Weft program's connect)
                        until a debugger releases it (the PMIX_DEBUGGER_RELEASE event)
  --dvm URI             run the job in the persistent runtime `weft dvm start` started
                        (its weft:// URI, or the file --report-uri wrote; default $WEFT_DVM)
  --session ID          with --dvm: run on the nodes of the runtime's allocation session ID
                        (its number or allocation id, see `weft session ls`); the job ends
                        with the session
  -x VAR[=VALUE]        export VAR (from this environment, or VALUE) to every process";

fn parse_num<T: std::str::FromStr>(opt: &str, v: Option<&String>) -> Result<T, LaunchError> {
    let v = v.ok_or_else(|| LaunchError::Usage(format!("{opt} needs a value")))?;
    v.parse()
        .map_err(|_| LaunchError::Usage(format!("{opt}: {v:?} is not a valid number")))
}

/// What one word of an app context's options was.
enum Opt {
    /// An option with its value (two words).
    Value,
    /// A flag (one word).
    Flag,
    /// `--`: the program comes next.
    EndOfOptions,
    /// Not an option: the program.
    Program,
}

/// The options of one app context (the others are the whole job's, in the spec).
#[derive(Default)]
struct ContextOpts {
    n: Option<u32>,
    pset: Option<String>,
}

fn usage(m: String) -> LaunchError {
    LaunchError::Usage(m)
}

/// Parses the arguments of `weft run` (everything after `run`).
pub fn parse_run_args(args: &[String]) -> Result<LaunchSpec, LaunchError> {
    parse_run_args_in(args, &|k| std::env::var(k).ok())
}

/// [`parse_run_args`] with `-x VAR` taking VAR's value from `lookup` (a submitter's
/// environment, in a persistent runtime).
pub(crate) fn parse_run_args_in(
    args: &[String],
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<LaunchSpec, LaunchError> {
    let mut spec = LaunchSpec::default();
    let mut i = 0;
    while i < args.len() {
        let mut ctx = ContextOpts::default();
        // Options up to the program.
        loop {
            let Some(a) = args.get(i) else {
                return Err(usage("missing PROGRAM".into()));
            };
            match parse_option(&mut spec, &mut ctx, a, args.get(i + 1), lookup)? {
                Opt::Value => i += 2,
                Opt::Flag => i += 1,
                Opt::EndOfOptions => {
                    i += 1;
                    break;
                }
                Opt::Program => break,
            }
        }
        spec.apps.push(parse_app_context(args, &mut i, ctx)?);
    }
    if spec.apps.is_empty() {
        return Err(usage(format!("nothing to run\n{USAGE}")));
    }
    if spec.nodes == 0 {
        return Err(usage("--nodes must be at least 1".into()));
    }
    Ok(spec)
}

/// Parses the option `a` (with `val`, the word after it, if it takes a value).
fn parse_option(
    spec: &mut LaunchSpec,
    ctx: &mut ContextOpts,
    a: &str,
    val: Option<&String>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Opt, LaunchError> {
    let take = |v: Option<&String>, opt: &str| {
        v.cloned()
            .ok_or_else(|| usage(format!("{opt} needs a value")))
    };
    match a {
        "-n" | "--np" | "-np" => ctx.n = Some(parse_num(a, val)?),
        "--pset" => ctx.pset = Some(take(val, a)?),
        "--nodes" => spec.nodes = parse_num(a, val)?,
        "--hosts" => {
            spec.servers.hosts = Some(
                take(val, a)?
                    .split(',')
                    .filter(|h| !h.is_empty())
                    .map(str::to_owned)
                    .collect(),
            )
        }
        "--launch-agent" => spec.servers.launch_agent = take(val, a)?,
        "--report-pmix-uri" => spec.servers.report_pmix_uri = Some(take(val, a)?),
        "--stop-in-init" => {
            spec.stop_in_init = true;
            return Ok(Opt::Flag);
        }
        "--pmix-system-server" => {
            spec.servers.pmix_system_server = true;
            return Ok(Opt::Flag);
        }
        "--listen" => {
            let v = take(val, a)?;
            spec.servers.listen = v
                .parse()
                .map_err(|_| usage(format!("--listen: {v:?} is not an IP address")))?;
        }
        "--map-by" => {
            spec.map_by = policy(
                a,
                &take(val, a)?,
                &[("slot", MapBy::Slot), ("node", MapBy::Node)],
            )?
        }
        "--bind-to" => {
            spec.bind_to = policy(
                a,
                &take(val, a)?,
                &[("core", BindTo::Core), ("none", BindTo::None)],
            )?
        }
        "--timeout" => {
            let s: f64 = parse_num(a, val)?;
            if !(s > 0.0 && s.is_finite()) {
                return Err(usage(format!(
                    "--timeout: {s} is not a positive number of seconds"
                )));
            }
            spec.ending.timeout = Some(Duration::from_secs_f64(s));
        }
        "--job-id" => spec.job_id = Some(take(val, a)?),
        "--dvm" => spec.dvm = Some(take(val, a)?),
        "--session" => spec.session = Some(take(val, a)?),
        "-x" => {
            let v = take(val, a)?;
            let kv = match v.split_once('=') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (v.clone(), lookup(&v).unwrap_or_default()),
            };
            spec.env.push(kv);
        }
        "--tag-output" => {
            spec.tag_output = true;
            return Ok(Opt::Flag);
        }
        "--keep-going" => {
            spec.ending.keep_going = true;
            return Ok(Opt::Flag);
        }
        "--no-pmix" => {
            spec.pmix = false;
            return Ok(Opt::Flag);
        }
        "--" => return Ok(Opt::EndOfOptions),
        ":" => return Err(usage("empty app context before ':'".into())),
        s if s.starts_with('-') => return Err(usage(format!("unknown option {s:?}\n{USAGE}"))),
        _ => return Ok(Opt::Program),
    }
    Ok(Opt::Value)
}

/// The policy named `v` among `choices`, for option `opt`.
fn policy<T: Copy>(opt: &str, v: &str, choices: &[(&str, T)]) -> Result<T, LaunchError> {
    match choices.iter().find(|(name, _)| *name == v) {
        Some(&(_, p)) => Ok(p),
        None => {
            let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
            Err(usage(format!(
                "{opt}: unknown policy {v:?} ({})",
                names.join(" or ")
            )))
        }
    }
}

/// Parses an app context's program and its arguments, from `args[*i]` up to a `:` or the
/// end (`*i` is left after them).
fn parse_app_context(
    args: &[String],
    i: &mut usize,
    ctx: ContextOpts,
) -> Result<AppContext, LaunchError> {
    let program = args
        .get(*i)
        .cloned()
        .ok_or_else(|| usage("missing PROGRAM".into()))?;
    *i += 1;
    let mut pargs = Vec::new();
    while *i < args.len() && args[*i] != ":" {
        pargs.push(args[*i].clone());
        *i += 1;
    }
    if *i < args.len() {
        *i += 1; // the ':'
        if *i == args.len() {
            return Err(usage("nothing after ':'".into()));
        }
    }
    let n = ctx
        .n
        .ok_or_else(|| usage(format!("app context {program:?} has no -n")))?;
    if n == 0 {
        return Err(usage(format!(
            "app context {program:?}: -n must be at least 1"
        )));
    }
    Ok(AppContext {
        n,
        pset: ctx.pset,
        program,
        args: pargs,
    })
}

use crate::jobdir::hostname;

/// Builds the job map: placement, app contexts, psets, bindings.
pub(crate) fn build_plan(spec: &LaunchSpec, job_id: &str) -> Result<JobPlan, LaunchError> {
    let total: u32 = spec.apps.iter().map(|a| a.n).sum();
    let node_names = node_names(spec)?;
    let num_nodes = node_names.len() as u32;
    if total < num_nodes {
        return Err(LaunchError::Usage(format!(
            "{total} processes on {num_nodes} nodes would leave nodes without processes; use --nodes {total} or fewer"
        )));
    }
    let (mut procs, apps, specs) = place(spec, num_nodes, total);
    let psets = psets(spec, &apps, total)?;
    let bind = bind(spec, &mut procs)?;
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
    let mut env = spec.env.clone();
    // Logical nodes share this machine's CPUs: tell every process how many of the
    // job's processes run here (waiting loops yield early past the CPU count).
    if spec.servers.hosts.is_none() && !env.iter().any(|(k, _)| k == weft_wireup::env::HOST_PROCS) {
        env.push((weft_wireup::env::HOST_PROCS.to_owned(), total.to_string()));
    }
    Ok(JobPlan {
        job,
        ns: weft_wireup::NsId::FIRST,
        apps: specs,
        tag_output: spec.tag_output,
        bind,
        datastore_bytes: spec.datastore_bytes,
        job_id: job_id.to_owned(),
        env,
        pmix: spec.pmix,
        pmi_preput: None,
        parent: None,
        forward_output: false,
        stop_in_init: spec.stop_in_init,
        debug_job: None,
    })
}

/// The plan of a persistent runtime's own job (`weft dvm start`): its nodes and no
/// process; the jobs submitted to it are planned by [`submit_plan`].
pub(crate) fn runtime_plan(spec: &LaunchSpec, job_id: &str) -> Result<JobPlan, LaunchError> {
    let nodes = node_names(spec)?
        .into_iter()
        .enumerate()
        .map(|(i, hostname)| NodeInfo {
            id: i as u32,
            hostname,
        })
        .collect();
    Ok(JobPlan {
        job: JobInfo {
            nspace: format!("weft-{job_id}"),
            nodes,
            procs: Vec::new(),
            apps: Vec::new(),
            psets: vec![Pset {
                name: PSET_WORLD.into(),
                members: Vec::new(),
            }],
            world_pgcid: WORLD_PGCID,
        },
        ns: weft_wireup::NsId::FIRST,
        apps: Vec::new(),
        tag_output: false,
        bind: Vec::new(),
        datastore_bytes: spec.datastore_bytes,
        job_id: job_id.to_owned(),
        env: Vec::new(),
        pmix: spec.pmix,
        pmi_preput: None,
        parent: None,
        forward_output: true,
        stop_in_init: spec.stop_in_init,
        debug_job: None,
    })
}

/// Finds a session of the runtime by its number or allocation id: its number and nodes,
/// or why there is none.
pub(crate) type SessionLookup<'a> = dyn Fn(&str) -> Result<(u32, Vec<u32>), String> + 'a;

/// The plan of job `ns` that a submitter asks the persistent runtime whose own job is
/// `base` for: `weft run`'s arguments `args` (`--nodes K`: on the first K of the
/// runtime's nodes; default: all of them, or one per process if fewer), run in `cwd` with
/// the submitter's environment `env` (then the `-x` variables); and its end policy.
///
/// `--session S` runs it on the nodes of the runtime's session `S` (`session` resolves
/// a number or allocation id to the session's number and nodes), whose id is returned.
pub(crate) fn submit_plan(
    base: &JobPlan,
    ns: weft_wireup::NsId,
    args: &[String],
    cwd: &str,
    env: Vec<(String, String)>,
    session: &SessionLookup<'_>,
) -> Result<(JobPlan, EndPolicy, Option<u32>), String> {
    let mut spec = parse_run_args_in(args, &|k| {
        env.iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.clone())
    })
    .map_err(|e| e.to_string())?;
    let refused = [
        ("--hosts", spec.servers.hosts.is_some()),
        ("--launch-agent", args.iter().any(|a| a == "--launch-agent")),
        ("--listen", args.iter().any(|a| a == "--listen")),
        ("--job-id", spec.job_id.is_some()),
    ];
    if let Some((opt, _)) = refused.iter().find(|(_, given)| *given) {
        return Err(format!(
            "weft run: {opt} is an option of `weft dvm start`, not of a job in a persistent runtime"
        ));
    }
    let in_session = match &spec.session {
        None => None,
        Some(s) => Some(session(s).map_err(|e| format!("weft run: --session {s}: {e}"))?),
    };
    let have = match &in_session {
        Some((_, nodes)) => nodes.len() as u32,
        None => base.job.num_nodes(),
    };
    let total: u32 = spec.apps.iter().map(|a| a.n).sum();
    let asked = args.iter().any(|a| a == "--nodes");
    if asked && spec.nodes > have {
        return Err(format!(
            "weft run: --nodes {}: the {} has {have} node{}",
            spec.nodes,
            if in_session.is_some() {
                "session"
            } else {
                "runtime"
            },
            if have == 1 { "" } else { "s" }
        ));
    }
    spec.nodes = if asked { spec.nodes } else { have }.min(total).max(1);
    spec.pmix &= base.pmix;
    let job_id = format!("{}.{}", base.job_id, ns.0);
    let mut plan = build_plan(&spec, &job_id).map_err(|e| e.to_string())?;
    plan.ns = ns;
    plan.job.nodes = base.job.nodes.clone();
    if let Some((_, nodes)) = &in_session {
        // Planned on nodes 0..K: the session's K nodes, in order.
        for p in &mut plan.job.procs {
            p.node = nodes[p.node as usize];
        }
    }
    plan.job.world_pgcid = super::children::CHILD_WORLD_PGCID + u64::from(ns.0);
    for app in &mut plan.apps {
        app.cwd = Some(cwd.to_owned());
    }
    let extra = std::mem::take(&mut plan.env);
    plan.env = env;
    plan.env.extend(extra);
    plan.forward_output = true;
    Ok((plan, spec.ending, in_session.map(|(id, _)| id)))
}

/// The nodes' names: the hosts, or `<this host>-n<i>` for logical nodes.
fn node_names(spec: &LaunchSpec) -> Result<Vec<String>, LaunchError> {
    match &spec.servers.hosts {
        Some(h) if h.is_empty() => Err(LaunchError::Usage("--hosts names no host".into())),
        Some(h) => Ok(h.clone()),
        None => {
            let host = hostname();
            Ok((0..spec.nodes).map(|i| format!("{host}-n{i}")).collect())
        }
    }
}

/// Places the ranks on the nodes: every process (node, local rank, app), and every app
/// context's description and command.
fn place(
    spec: &LaunchSpec,
    num_nodes: u32,
    total: u32,
) -> (Vec<ProcInfo>, Vec<AppInfo>, Vec<AppSpec>) {
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
            env: Vec::new(),
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
    (procs, apps, specs)
}

/// The job's process sets: the world and each named app context's (merged by name).
fn psets(spec: &LaunchSpec, apps: &[AppInfo], total: u32) -> Result<Vec<Pset>, LaunchError> {
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
    Ok(psets)
}

/// With `--bind-to core`, binds every process to a core (set in its `cpuset` too).
fn bind(spec: &LaunchSpec, procs: &mut [ProcInfo]) -> Result<Vec<Option<CpuList>>, LaunchError> {
    let total = procs.len();
    let mut bind = vec![None; total];
    if spec.bind_to != BindTo::Core {
        return Ok(bind);
    }
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
    let mut order: Vec<usize> = (0..total).collect();
    order.sort_by_key(|&r| (procs[r].node, procs[r].local_rank));
    for (i, &r) in order.iter().enumerate() {
        let slot = if spec.servers.hosts.is_some() {
            procs[r].local_rank as usize
        } else {
            i
        };
        let c: CpuList = cores[slot % cores.len()].clone();
        procs[r].cpuset = Some(c.clone());
        bind[r] = Some(c);
    }
    Ok(bind)
}

#[cfg(test)]
mod tests;

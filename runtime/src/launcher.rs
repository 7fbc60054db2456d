//! `weft run`: the launcher.
//!
//! The launcher computes the job map (ranks to nodes, app contexts, process sets,
//! bindings), starts one `weft server` per node (as a local process per logical node,
//! or over `ssh` per host with `--hosts`), hands every server the plan and the other
//! servers' addresses, then waits: it reports the first failing process, terminates the
//! others after a grace period, enforces `--timeout`, and removes the job's socket
//! directory and shared-memory segments when the job ends, whatever the way it ends.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

pub use crate::jobdir::user_dir;
use crate::jobdir::{format_secret, random_u64};
use crate::topology;
use crate::wire::frame::{self, MAX_PEER_FRAME};
use crate::wire::proto::{
    signal_name, AppSpec, ExitKind, JobPlan, ToLauncher, ToServer, MAGIC, PROTOCOL_VERSION,
};
use weft_wireup::job::{AppInfo, JobInfo, NodeInfo, ProcInfo, Pset, PSET_WORLD};
use weft_wireup::CpuList;
use weft_wireup::Rank;

mod servers;
use servers::Servers;

/// Exit status of `weft run` when `--timeout` expired.
pub const EXIT_TIMEOUT: i32 = 124;
pub use weft_wireup::job::WORLD_PGCID;
/// How long terminated processes get between SIGTERM and SIGKILL.
const KILL_AFTER: Duration = Duration::from_millis(500);
/// How long the launcher waits for every node's server to start and report ready.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Exit status when the launcher itself failed (bad setup, lost server).
pub const EXIT_LAUNCH_FAILED: i32 = 1;
/// How long the launcher waits, once the job is over, for its servers to exit before it
/// kills them (they exit right after the job's end; every one is reaped either way).
const SERVER_EXIT_WAIT: Duration = Duration::from_secs(5);

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

/// Errors of [`run`] before the job runs.
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

enum Ev {
    Hello {
        node: u32,
        tx: UnboundedSender<Vec<u8>>,
    },
    Msg {
        node: u32,
        msg: ToLauncher,
    },
    Lost {
        node: u32,
        reason: String,
    },
    ServerExit {
        node: u32,
        status: String,
    },
    Timeout,
    StartupTimeout,
    Signal(i32),
    ForceKill,
    GraceOver,
}

/// Runs a job to its end and returns the exit status `weft run` should exit with:
/// 0 if every process exited 0, else the first failure's code (128+N for signal N,
/// 127 for a program that could not be started, 124 on `--timeout`).
pub fn run(spec: LaunchSpec) -> Result<i32, LaunchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| LaunchError::Setup {
            what: "tokio runtime".into(),
            source,
        })?;
    let out = rt.block_on(run_async(spec));
    rt.shutdown_timeout(Duration::from_millis(200));
    out
}

async fn run_async(spec: LaunchSpec) -> Result<i32, LaunchError> {
    let setup = |what: &str, source: io::Error| LaunchError::Setup {
        what: what.into(),
        source,
    };
    let job_id = spec
        .job_id
        .clone()
        .unwrap_or_else(|| format!("{}-{:08x}", std::process::id(), random_u64() as u32));
    if job_id.is_empty()
        || !job_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(LaunchError::Usage(format!(
            "--job-id {job_id:?}: use letters, digits, '-' and '_' only"
        )));
    }
    let plan = build_plan(&spec, &job_id)?;
    let num_nodes = plan.job.num_nodes();
    let total = plan.job.size();

    let udir = user_dir();
    std::fs::create_dir_all(&udir).map_err(|e| setup(&format!("create {}", udir.display()), e))?;
    std::fs::set_permissions(&udir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| setup(&format!("chmod {}", udir.display()), e))?;
    let job_dir = udir.join(&job_id);
    std::fs::create_dir(&job_dir)
        .map_err(|e| setup(&format!("create job directory {}", job_dir.display()), e))?;
    std::fs::set_permissions(&job_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| setup("chmod job directory", e))?;

    let cleanup = |plan: &JobPlan| {
        crate::jobdir::remove_job(&plan.job_id, &job_dir, plan.job.num_nodes());
    };

    let listener = match TcpListener::bind(SocketAddr::new(spec.listen, 0)).await {
        Ok(l) => l,
        Err(e) => {
            cleanup(&plan);
            return Err(setup("listen for servers", e));
        }
    };
    let addr = listener
        .local_addr()
        .map_err(|e| setup("listen for servers", e))?;
    let secret = [random_u64(), random_u64()];
    let (ev_tx, mut ev_rx) = unbounded_channel::<Ev>();

    // Accept servers.
    {
        let ev = ev_tx.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let ev = ev.clone();
                tokio::spawn(async move {
                    s.set_nodelay(true).ok();
                    let (mut r, mut w) = s.into_split();
                    let node = match frame::read_async::<ToLauncher>(&mut r, MAX_PEER_FRAME).await {
                        Ok(ToLauncher::Hello {
                            magic,
                            version,
                            secret: s2,
                            node,
                        }) if magic == MAGIC && version == PROTOCOL_VERSION && s2 == secret => node,
                        Ok(ToLauncher::Hello { version, .. }) if version != PROTOCOL_VERSION => {
                            tracing::warn!("dropping a server that speaks protocol version {version} (this launcher: {PROTOCOL_VERSION})");
                            return;
                        }
                        _ => {
                            tracing::warn!("dropping a connection with a bad server hello");
                            return;
                        }
                    };
                    let (tx, mut rx) = unbounded_channel::<Vec<u8>>();
                    tokio::spawn(async move {
                        while let Some(f) = rx.recv().await {
                            if frame::write_async(&mut w, &f).await.is_err() {
                                break;
                            }
                        }
                    });
                    let _ = ev.send(Ev::Hello { node, tx });
                    loop {
                        match frame::read_async::<ToLauncher>(&mut r, MAX_PEER_FRAME).await {
                            Ok(msg) => {
                                let _ = ev.send(Ev::Msg { node, msg });
                            }
                            Err(e) => {
                                let _ = ev.send(Ev::Lost {
                                    node,
                                    reason: e.to_string(),
                                });
                                return;
                            }
                        }
                    }
                });
            }
        });
    }

    // Start the servers.
    let exe = std::env::current_exe().map_err(|e| setup("locate the weft executable", e))?;
    let server_cmd: Vec<String> = spec
        .server_command
        .clone()
        .unwrap_or_else(|| vec![exe.display().to_string(), "server".into()]);
    let mut servers = Servers::new();
    for node in 0..num_nodes {
        let sargs = [
            "--launcher".to_owned(),
            addr.to_string(),
            "--node".to_owned(),
            node.to_string(),
            "--job-dir".to_owned(),
            job_dir.display().to_string(),
        ];
        let mut cmd = match &spec.hosts {
            None => {
                let mut c = tokio::process::Command::new(&server_cmd[0]);
                c.args(&server_cmd[1..])
                    .args(sargs)
                    .env("WEFT_JOB_SECRET", format_secret(secret));
                c
            }
            Some(hosts) => {
                let mut agent = spec.launch_agent.split_whitespace();
                let mut c = tokio::process::Command::new(agent.next().unwrap_or("ssh"));
                c.args(agent).arg(&hosts[node as usize]);
                let remote: Vec<String> = [
                    "env".to_owned(),
                    format!("WEFT_JOB_SECRET={}", format_secret(secret)),
                ]
                .into_iter()
                .chain(server_cmd.iter().cloned())
                .chain(sargs)
                .collect();
                c.args(remote);
                c
            }
        };
        cmd.stdin(if node == 0 {
            Stdio::inherit()
        } else {
            Stdio::null()
        });
        if let Err(e) = servers.start(node, cmd, ev_tx.clone()) {
            // The servers already started are killed and reaped before the launcher
            // reports the failure.
            servers.kill_all();
            servers.reap(Duration::ZERO).await;
            cleanup(&plan);
            return Err(setup(
                &format!("start the server of node {node} ({})", server_cmd[0]),
                e,
            ));
        }
    }

    // Signals and timers.
    for (kind, num) in [
        (tokio::signal::unix::SignalKind::interrupt(), 2),
        (tokio::signal::unix::SignalKind::terminate(), 15),
        (tokio::signal::unix::SignalKind::hangup(), 1),
    ] {
        if let Ok(mut s) = tokio::signal::unix::signal(kind) {
            let ev = ev_tx.clone();
            tokio::spawn(async move {
                while s.recv().await.is_some() {
                    let _ = ev.send(Ev::Signal(num));
                }
            });
        }
    }
    if let Some(t) = spec.timeout {
        let ev = ev_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(t).await;
            let _ = ev.send(Ev::Timeout);
        });
    }
    {
        let ev = ev_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(SERVER_START_TIMEOUT).await;
            let _ = ev.send(Ev::StartupTimeout);
        });
    }

    let mut txs: HashMap<u32, UnboundedSender<Vec<u8>>> = HashMap::new();
    let mut ready: HashMap<u32, SocketAddr> = HashMap::new();
    let mut started = false;
    let mut exited = vec![false; total as usize];
    let mut n_exited = 0u32;
    let mut first_failure: Option<(Rank, ExitKind)> = None;
    let mut status_override: Option<i32> = None;
    let mut terminating = false;
    let mut servers_alive = num_nodes;
    let mut shut_down = false;
    let plan_frame = frame::encode(&ToServer::Plan(Box::new(plan.clone())));

    let send_all = |txs: &HashMap<u32, UnboundedSender<Vec<u8>>>, m: &ToServer| {
        let f = frame::encode(m);
        for tx in txs.values() {
            let _ = tx.send(f.clone());
        }
    };
    let terminate = |txs: &HashMap<u32, UnboundedSender<Vec<u8>>>, ev: &UnboundedSender<Ev>| {
        send_all(
            txs,
            &ToServer::Terminate {
                grace_ms: KILL_AFTER.as_millis() as u64,
            },
        );
        let ev = ev.clone();
        tokio::spawn(async move {
            tokio::time::sleep(KILL_AFTER + Duration::from_secs(5)).await;
            let _ = ev.send(Ev::ForceKill);
        });
    };

    while servers_alive > 0 {
        let Some(ev) = ev_rx.recv().await else { break };
        match ev {
            Ev::Hello { node, tx } => {
                let _ = tx.send(plan_frame.clone());
                txs.insert(node, tx);
            }
            Ev::Msg {
                node,
                msg: ToLauncher::Ready { peer_addr },
            } => {
                ready.insert(node, peer_addr);
                if ready.len() == num_nodes as usize && !started {
                    started = true;
                    let peers = (0..num_nodes).map(|n| ready[&n]).collect();
                    send_all(&txs, &ToServer::Start { peers });
                    if terminating {
                        terminate(&txs, &ev_tx);
                    }
                }
            }
            Ev::Msg {
                msg: ToLauncher::ProcExit { rank, how },
                ..
            } => {
                if let Some(e) = exited.get_mut(rank as usize) {
                    if !*e {
                        *e = true;
                        n_exited += 1;
                    }
                }
                let failed = how != ExitKind::Code(0);
                if failed && first_failure.is_none() && !terminating {
                    let node = plan.job.procs[rank as usize].node;
                    let host = &plan.job.nodes[node as usize].hostname;
                    let then = if spec.keep_going {
                        String::new()
                    } else {
                        format!("; terminating the job in {:.1} s", spec.grace.as_secs_f64())
                    };
                    eprintln!(
                        "weft run: rank {rank} (node {node}, {host}) {}{then}",
                        how.describe()
                    );
                    first_failure = Some((rank, how));
                    if !spec.keep_going {
                        // The others learn of the failure through the wire-up service within
                        // milliseconds; give them the grace period to report it and exit.
                        terminating = true;
                        let ev = ev_tx.clone();
                        let grace = spec.grace;
                        tokio::spawn(async move {
                            tokio::time::sleep(grace).await;
                            let _ = ev.send(Ev::GraceOver);
                        });
                    }
                }
                if n_exited == total && !shut_down {
                    shut_down = true;
                    send_all(&txs, &ToServer::Shutdown);
                }
            }
            Ev::Msg {
                node,
                msg: ToLauncher::Failed { reason },
            } => {
                eprintln!("weft run: the server of node {node} failed: {reason}");
                status_override.get_or_insert(EXIT_LAUNCH_FAILED);
                if !terminating {
                    terminating = true;
                    terminate(&txs, &ev_tx);
                }
            }
            Ev::Msg {
                msg: ToLauncher::Hello { .. },
                ..
            } => {}
            Ev::Lost { node, reason }
            | Ev::ServerExit {
                node,
                status: reason,
            } => {
                if txs.remove(&node).is_none() && ready.contains_key(&node) {
                    // Already counted (the connection and the process both report).
                    continue;
                }
                ready
                    .entry(node)
                    .or_insert_with(|| SocketAddr::from(([0, 0, 0, 0], 0)));
                servers_alive -= 1;
                if !shut_down {
                    eprintln!(
                        "weft run: the server of node {node} ({}) ended unexpectedly: {reason}",
                        plan.job.nodes[node as usize].hostname
                    );
                    status_override.get_or_insert(EXIT_LAUNCH_FAILED);
                    for r in plan.job.ranks_on(node) {
                        if !exited[r as usize] {
                            exited[r as usize] = true;
                            n_exited += 1;
                        }
                    }
                    if !terminating {
                        terminating = true;
                        terminate(&txs, &ev_tx);
                    }
                    if n_exited == total {
                        shut_down = true;
                        send_all(&txs, &ToServer::Shutdown);
                    }
                }
            }
            Ev::Timeout => {
                if !shut_down {
                    eprintln!(
                        "weft run: job timed out after {:.1} s; terminating {} of {total} processes",
                        spec.timeout.unwrap_or_default().as_secs_f64(),
                        total - n_exited
                    );
                    status_override = Some(EXIT_TIMEOUT);
                    terminating = true;
                    terminate(&txs, &ev_tx);
                }
            }
            Ev::StartupTimeout => {
                if !started {
                    eprintln!(
                        "weft run: only {} of {num_nodes} servers started within {} s \
                         (SERVER_START_TIMEOUT); giving up",
                        ready.len(),
                        SERVER_START_TIMEOUT.as_secs()
                    );
                    status_override.get_or_insert(EXIT_LAUNCH_FAILED);
                    servers.kill_all();
                }
            }
            Ev::Signal(sig) => {
                eprintln!(
                    "weft run: received {}; terminating the job",
                    signal_name(sig)
                );
                status_override.get_or_insert(128 + sig);
                if terminating {
                    send_all(&txs, &ToServer::Terminate { grace_ms: 0 });
                } else {
                    terminating = true;
                    terminate(&txs, &ev_tx);
                }
            }
            Ev::GraceOver => {
                if !shut_down {
                    terminate(&txs, &ev_tx);
                }
            }
            Ev::ForceKill => servers.kill_all(),
        }
    }
    // Every server's connection is closed (or its process gone): wait for the processes
    // themselves, so that none outlives the launcher as a zombie.
    servers.reap(SERVER_EXIT_WAIT).await;
    cleanup(&plan);
    let code = match (status_override, first_failure) {
        (Some(c), _) => c,
        (None, None) => 0,
        (None, Some((_, ExitKind::Code(c)))) => c,
        (None, Some((_, ExitKind::Signal(s)))) => 128 + s,
        (None, Some((_, ExitKind::SpawnFailed(_)))) => 127,
    };
    Ok(code)
}

#[cfg(test)]
mod tests;

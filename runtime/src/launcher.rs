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
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

pub use crate::jobdir::user_dir;
use crate::jobdir::{format_secret, random_u64};
use crate::wire::frame::{self, MAX_PEER_FRAME};
use crate::wire::proto::{
    FromController, JobPlan, ToController, ToLauncher, ToServer, MAGIC, RUNTIME_PROTOCOL_VERSION,
};

mod children;
pub mod dvm;
mod job;
mod launch;
mod nodes;
mod plan;
mod proctable;
mod servers;
mod sessions;
use job::{Action, Timer};
use launch::Launch;
pub(crate) use plan::build_plan;
pub use plan::{
    parse_run_args, AppContext, BindTo, EndPolicy, LaunchError, LaunchSpec, MapBy, ServerLaunch,
    USAGE,
};
use servers::Servers;

/// Exit status of `weft run` when `--timeout` expired.
pub const EXIT_TIMEOUT: i32 = 124;
pub use proctable::{on_proc_table, ProcRow, ProcTableHook};
pub use weft_wireup::job::WORLD_PGCID;
/// Exit status when the launcher itself failed (bad setup, lost server).
pub const EXIT_LAUNCH_FAILED: i32 = 1;
/// How long the launcher waits, once the job is over, for its servers to exit before it
/// kills them (they exit right after the job's end; every one is reaped either way).
const SERVER_EXIT_WAIT: Duration = Duration::from_secs(5);

/// What the launcher's loop hears about: from the servers' connections and processes,
/// the signals it catches and its timers.
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
    Signal(i32),
    Timer(Timer),
    /// A timer of spawned job `NsId`.
    JobTimer(weft_wireup::NsId, Timer),
    /// A submitter connected to the persistent runtime (its hello was good).
    SubHello {
        sub: u64,
        tx: UnboundedSender<Vec<u8>>,
    },
    /// A submitter's request.
    SubMsg {
        sub: u64,
        msg: ToController,
    },
    /// A submitter's connection closed.
    SubGone {
        sub: u64,
    },
}

/// Runs a job to its end and returns the exit status `weft run` should exit with:
/// 0 if every process exited 0, else the first failure's code (128+N for signal N,
/// 127 for a program that could not be started, 124 on `--timeout`).
pub fn run(spec: LaunchSpec) -> Result<i32, LaunchError> {
    if let Some(s) = &spec.session {
        return Err(LaunchError::Usage(format!(
            "--session {s}: sessions are a persistent runtime's; name it with --dvm URI (or $WEFT_DVM)"
        )));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| setup_error("tokio runtime", source))?;
    let out = rt.block_on(run_async(spec));
    rt.shutdown_timeout(Duration::from_millis(200));
    out
}

fn setup_error(what: &str, source: io::Error) -> LaunchError {
    LaunchError::Setup {
        what: what.into(),
        source,
    }
}

/// The job's run, step by step: its directory, the servers, their hello, the job, the
/// cleanup (whatever way the job ended once its directory exists).
async fn run_async(spec: LaunchSpec) -> Result<i32, LaunchError> {
    let job_id = job_id(&spec)?;
    let plan = build_plan(&spec, &job_id)?;
    let job_dir = create_job_dir(&job_id)?;
    let out = run_in(&spec, &plan, &job_dir).await;
    crate::jobdir::remove_job(&plan.job_id, &job_dir, plan.job.num_nodes());
    if spec.servers.pmix_system_server {
        // A killed server leaves its system rendezvous file behind.
        weft_pmix::server::remove_stale_system_file(&crate::jobdir::hostname());
    }
    out
}

/// The job's id: `--job-id`, checked, or `<pid>-<random>`.
fn job_id(spec: &LaunchSpec) -> Result<String, LaunchError> {
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
    Ok(job_id)
}

/// Creates the user's directory (if needed) and the job's, both mode 0700.
fn create_job_dir(job_id: &str) -> Result<PathBuf, LaunchError> {
    let udir = user_dir();
    std::fs::create_dir_all(&udir)
        .map_err(|e| setup_error(&format!("create {}", udir.display()), e))?;
    std::fs::set_permissions(&udir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| setup_error(&format!("chmod {}", udir.display()), e))?;
    let job_dir = udir.join(job_id);
    std::fs::create_dir(&job_dir)
        .map_err(|e| setup_error(&format!("create job directory {}", job_dir.display()), e))?;
    std::fs::set_permissions(&job_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| setup_error("chmod job directory", e))?;
    Ok(job_dir)
}

/// Starts the servers, runs the job on them and reaps them; returns the exit status.
async fn run_in(spec: &LaunchSpec, plan: &JobPlan, job_dir: &Path) -> Result<i32, LaunchError> {
    let secret = [random_u64(), random_u64()];
    let (ev_tx, ev_rx) = unbounded_channel::<Ev>();
    let addr = listen(spec, secret, &ev_tx).await?;
    // `weft ps` asks the job through a control socket, as it asks a persistent runtime.
    let control = TcpListener::bind(SocketAddr::new(spec.servers.listen, 0))
        .await
        .map_err(|e| setup_error("listen for weft ps", e))?;
    let control_uri = dvm::DvmUri {
        addr: control
            .local_addr()
            .map_err(|e| setup_error("listen for weft ps", e))?,
        id: plan.job_id.clone(),
        secret: [random_u64(), random_u64()],
    };
    let servers = start_servers(spec, plan.job.num_nodes(), addr, job_dir, secret, &ev_tx).await?;
    watch_signals(&ev_tx);
    let mut run = Executor::new(
        Launch::new(plan.clone(), spec.ending.clone()),
        servers,
        plan,
        ev_tx.clone(),
        ev_rx,
    );
    let timers = run.launch.timers();
    run.execute(timers);
    // Wait for every server's hello and ready (or the launch's failure), then for the
    // job's end; the same decisions apply in both.
    run.until(Launch::started).await;
    if run.launch.started() && !run.launch.is_over() {
        tokio::spawn(dvm::accept_submitters(control, control_uri.secret, ev_tx));
        let file = job_dir.join(dvm::CONTROL_FILE);
        if let Err(e) = dvm::write_uri(&file, &control_uri) {
            tracing::warn!("{}: {e}: weft ps cannot find this job", file.display());
        }
    }
    run.until(|_: &Launch| false).await;
    // Every server's connection is closed (or its process gone): wait for the processes
    // themselves, so that none outlives the launcher as a zombie.
    run.servers.reap(SERVER_EXIT_WAIT).await;
    Ok(run.launch.exit_code())
}

/// Listens for the servers and accepts them (each connection on its own task).
async fn listen(
    spec: &LaunchSpec,
    secret: [u64; 2],
    ev: &UnboundedSender<Ev>,
) -> Result<SocketAddr, LaunchError> {
    let listener = TcpListener::bind(SocketAddr::new(spec.servers.listen, 0))
        .await
        .map_err(|e| setup_error("listen for servers", e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| setup_error("listen for servers", e))?;
    let ev = ev.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(serve_connection(s, secret, ev.clone()));
        }
    });
    Ok(addr)
}

/// One server's connection: its hello (checked), then its messages, then its loss.
async fn serve_connection(s: TcpStream, secret: [u64; 2], ev: UnboundedSender<Ev>) {
    s.set_nodelay(true).ok();
    let (mut r, mut w) = s.into_split();
    let node = match frame::read_async::<ToLauncher>(&mut r, MAX_PEER_FRAME).await {
        Ok(ToLauncher::Hello {
            magic,
            version,
            secret: s2,
            node,
        }) if magic == MAGIC && version == RUNTIME_PROTOCOL_VERSION && s2 == secret => node,
        Ok(ToLauncher::Hello { version, .. }) if version != RUNTIME_PROTOCOL_VERSION => {
            tracing::warn!("dropping a server that speaks protocol version {version} (this launcher: {RUNTIME_PROTOCOL_VERSION})");
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
}

/// Starts one server per node; if one cannot be started, the ones already started are
/// killed and reaped before the failure is returned.
async fn start_servers(
    spec: &LaunchSpec,
    num_nodes: u32,
    addr: SocketAddr,
    job_dir: &Path,
    secret: [u64; 2],
    ev: &UnboundedSender<Ev>,
) -> Result<Servers, LaunchError> {
    let exe = std::env::current_exe().map_err(|e| setup_error("locate the weft executable", e))?;
    let server_cmd: Vec<String> = spec
        .servers
        .server_command
        .clone()
        .unwrap_or_else(|| vec![exe.display().to_string(), "server".into()]);
    let mut servers = Servers::new();
    if spec.servers.slurm {
        // One step, one task per node: Slurm places them (the node id is the task's
        // SLURM_NODEID); the step's end reports as node 0's, the others' by their links.
        let cmd = slurm_command(num_nodes, &server_cmd, addr, job_dir, secret);
        if let Err(e) = servers.start(0, cmd, ev.clone()) {
            return Err(setup_error("start the servers with srun", e));
        }
        return Ok(servers);
    }
    for node in 0..num_nodes {
        let cmd = server_command(spec, &server_cmd, node, addr, job_dir, secret);
        if let Err(e) = servers.start(node, cmd, ev.clone()) {
            servers.kill_all();
            servers.reap(Duration::ZERO).await;
            return Err(setup_error(
                &format!("start the server of node {node} ({})", server_cmd[0]),
                e,
            ));
        }
    }
    Ok(servers)
}

/// The command that starts the server of `node`: here, or over the launch agent on its
/// host.
fn server_command(
    spec: &LaunchSpec,
    server_cmd: &[String],
    node: u32,
    addr: SocketAddr,
    job_dir: &Path,
    secret: [u64; 2],
) -> tokio::process::Command {
    let sargs = [
        "--launcher".to_owned(),
        addr.to_string(),
        "--node".to_owned(),
        node.to_string(),
        "--job-dir".to_owned(),
        job_dir.display().to_string(),
    ];
    let mut cmd = match &spec.servers.hosts {
        None => {
            let mut c = tokio::process::Command::new(&server_cmd[0]);
            c.args(&server_cmd[1..])
                .args(sargs)
                .env("WEFT_JOB_SECRET", format_secret(secret));
            // Node 0's server is found by tools by this launcher's pid too.
            if node == 0 {
                c.arg("--tool-pid").arg(std::process::id().to_string());
                if let Some(f) = &spec.servers.report_pmix_uri {
                    c.arg("--report-pmix-uri").arg(f);
                }
                if spec.servers.pmix_system_server {
                    c.arg("--pmix-system-server");
                }
            }
            c
        }
        Some(hosts) => {
            let mut agent = spec.servers.launch_agent.split_whitespace();
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
    // A persistent runtime's jobs read no terminal.
    cmd.stdin(if node == 0 && spec.dvm.is_none() {
        Stdio::inherit()
    } else {
        Stdio::null()
    });
    cmd
}

/// The `srun` step that starts one server on each of the `num_nodes` nodes of the Slurm
/// allocation: every CPU of its node for each (the jobs' processes inherit the step's CPU
/// set), no PMIx from Slurm (the servers serve their own), a server's end does not end the
/// step (the launcher decides); the secret is in the environment, never on a command line.
fn slurm_command(
    num_nodes: u32,
    server_cmd: &[String],
    addr: SocketAddr,
    job_dir: &Path,
    secret: [u64; 2],
) -> tokio::process::Command {
    let mut c = tokio::process::Command::new("srun");
    c.args([
        format!("--nodes={num_nodes}"),
        format!("--ntasks={num_nodes}"),
        "--ntasks-per-node=1".to_owned(),
        "--cpu-bind=none".to_owned(),
        "--kill-on-bad-exit=0".to_owned(),
        "--export=ALL".to_owned(),
        "--mpi=none".to_owned(),
    ]);
    if let Some(cpus) = std::env::var("SLURM_CPUS_ON_NODE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        c.arg(format!("--cpus-per-task={cpus}"));
    }
    c.args(server_cmd)
        .args([
            "--launcher".to_owned(),
            addr.to_string(),
            "--node-env".to_owned(),
            "SLURM_NODEID".to_owned(),
            "--job-dir".to_owned(),
            job_dir.display().to_string(),
        ])
        .env("WEFT_JOB_SECRET", format_secret(secret))
        .stdin(Stdio::null());
    c
}

/// SIGINT, SIGTERM and SIGHUP become events of the loop.
fn watch_signals(ev: &UnboundedSender<Ev>) {
    for (kind, num) in [
        (tokio::signal::unix::SignalKind::interrupt(), 2),
        (tokio::signal::unix::SignalKind::terminate(), 15),
        (tokio::signal::unix::SignalKind::hangup(), 1),
    ] {
        if let Ok(mut s) = tokio::signal::unix::signal(kind) {
            let ev = ev.clone();
            tokio::spawn(async move {
                while s.recv().await.is_some() {
                    let _ = ev.send(Ev::Signal(num));
                }
            });
        }
    }
}

/// The launcher's loop: it owns the servers' connections and processes, the event
/// channel and the timers, feeds what happens to the [`Launch`] and executes its actions.
struct Executor {
    launch: Launch,
    servers: Servers,
    /// Each connected server's outgoing frames.
    txs: HashMap<u32, UnboundedSender<Vec<u8>>>,
    /// The plan, encoded once for every server.
    plan_frame: Vec<u8>,
    ev_tx: UnboundedSender<Ev>,
    ev_rx: UnboundedReceiver<Ev>,
    /// Each connected submitter's outgoing frames (a persistent runtime).
    subs: HashMap<u64, UnboundedSender<Vec<u8>>>,
}

impl Executor {
    fn new(
        launch: Launch,
        servers: Servers,
        plan: &JobPlan,
        ev_tx: UnboundedSender<Ev>,
        ev_rx: UnboundedReceiver<Ev>,
    ) -> Executor {
        Executor {
            launch,
            servers,
            txs: HashMap::new(),
            plan_frame: frame::encode(&ToServer::Plan(Box::new(plan.clone()))),
            ev_tx,
            ev_rx,
            subs: HashMap::new(),
        }
    }

    /// Handles events until `done` says so or every server has ended.
    async fn until(&mut self, done: impl Fn(&Launch) -> bool) {
        while !self.launch.is_over() && !done(&self.launch) {
            let Some(ev) = self.ev_rx.recv().await else {
                return;
            };
            let actions = self.on_event(ev);
            self.execute(actions);
        }
    }

    /// What an event means, as decided by the launch.
    fn on_event(&mut self, ev: Ev) -> Vec<Action> {
        let launch = &mut self.launch;
        match ev {
            Ev::Hello { node, tx } => {
                self.txs.insert(node, tx);
                launch.on_hello(node)
            }
            Ev::Msg { node, msg } => match msg {
                ToLauncher::Ready { peer_addr } => launch.on_ready(node, peer_addr),
                ToLauncher::ProcExit { proc, how } => launch.on_proc_exit(proc, how),
                ToLauncher::Failed { reason } => launch.on_server_failed(node, &reason),
                ToLauncher::Spawn { qid, from, req } => launch.on_spawn(node, qid, from, &req),
                ToLauncher::Release { ns } => launch.on_tool_release(ns),
                ToLauncher::ToolSpawn { qid, tool, req } => {
                    launch.on_tool_spawn(node, qid, tool, &req)
                }
                ToLauncher::Launched { ns, error, set_up } => {
                    launch.on_launched(node, ns, error, set_up)
                }
                ToLauncher::Output {
                    ns,
                    rank,
                    stderr,
                    bytes,
                } => launch.on_output(ns, rank, stderr, bytes),
                ToLauncher::Pids { ns, pids } => launch.on_pids(node, ns, pids),
                ToLauncher::Alloc { qid, from, req } => launch.on_alloc(node, qid, from, &req),
                ToLauncher::JobControl {
                    from,
                    targets,
                    action,
                    via,
                } => launch.on_job_control(from, &targets, action, &via),
                ToLauncher::Hello { .. } => Vec::new(),
            },
            Ev::SubHello { sub, tx } => {
                self.subs.insert(sub, tx);
                Vec::new()
            }
            Ev::SubGone { sub } => {
                self.subs.remove(&sub);
                launch.on_submitter_gone(sub)
            }
            // A `weft run` job answers `weft ps` only.
            Ev::SubMsg { sub, msg }
                if !launch.is_dvm()
                    && !matches!(msg, ToController::Ps | ToController::Hello { .. }) =>
            {
                vec![Action::Tell(
                    sub,
                    FromController::Error(
                        "this is a weft run job: it answers weft ps only (a persistent \
                         runtime, weft dvm start, takes jobs and the rest)"
                            .into(),
                    ),
                )]
            }
            Ev::SubMsg { sub, msg } => match msg {
                ToController::Submit { args, cwd, env } => launch.on_submit(sub, &args, &cwd, env),
                ToController::Signal { sig } => launch.on_submitter_signal(sub, sig),
                ToController::Ps => vec![Action::Tell(sub, FromController::Text(launch.table()))],
                ToController::Kill { job, sig } => launch.on_kill(sub, &job, sig),
                ToController::Session(ctl) => launch.on_session_ctl(sub, ctl),
                ToController::Stop => {
                    let mut out = vec![Action::Tell(
                        sub,
                        FromController::Text("stopping the runtime\n".into()),
                    )];
                    out.extend(launch.on_stop());
                    out
                }
                ToController::Hello { .. } => Vec::new(),
            },
            Ev::Lost { node, reason }
            | Ev::ServerExit {
                node,
                status: reason,
            } => {
                self.txs.remove(&node);
                launch.on_server_lost(node, &reason)
            }
            Ev::Signal(sig) => launch.on_signal(sig),
            Ev::Timer(t) => launch.on_timer(t),
            Ev::JobTimer(ns, t) => launch.on_job_timer(ns, t),
        }
    }

    fn execute(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Report(line) => eprintln!("{line}"),
                Action::SendPlan(node) => {
                    if let Some(tx) = self.txs.get(&node) {
                        let _ = tx.send(self.plan_frame.clone());
                    }
                }
                Action::SendAll(m) => {
                    let f = frame::encode(&m);
                    for tx in self.txs.values() {
                        let _ = tx.send(f.clone());
                    }
                }
                Action::Arm(timer, after) => {
                    let ev = self.ev_tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let _ = ev.send(Ev::Timer(timer));
                    });
                }
                Action::KillServers => self.servers.kill_all(),
                Action::ProcTable(rows) => {
                    // A debugger stopped at MPIR_Breakpoint and went on: the job it held
                    // goes on too.
                    if proctable::publish(&rows) {
                        self.execute(vec![Action::SendAll(ToServer::Release {
                            ns: weft_wireup::NsId::FIRST,
                            pmix_done: false,
                        })]);
                    }
                }
                Action::ArmJob(ns, timer, after) => {
                    let ev = self.ev_tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let _ = ev.send(Ev::JobTimer(ns, timer));
                    });
                }
                Action::Send(node, msg) => {
                    if let Some(tx) = self.txs.get(&node) {
                        let _ = tx.send(frame::encode(&msg));
                    }
                }
                Action::SpawnDone { node, qid, result } => {
                    if let Some(tx) = self.txs.get(&node) {
                        let _ = tx.send(frame::encode(&ToServer::SpawnDone { qid, result }));
                    }
                }
                Action::AllocDone { node, qid, result } => {
                    if let Some(tx) = self.txs.get(&node) {
                        let _ = tx.send(frame::encode(&ToServer::AllocDone { qid, result }));
                    }
                }
                Action::Tell(sub, msg) => {
                    if let Some(tx) = self.subs.get(&sub) {
                        let _ = tx.send(frame::encode(&msg));
                    }
                }
                Action::Output { stderr, bytes } => {
                    use std::io::Write;
                    let _ = if stderr {
                        std::io::stderr().write_all(&bytes)
                    } else {
                        std::io::stdout().write_all(&bytes)
                    };
                }
            }
        }
    }
}

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
use crate::wire::frame::{self, MAX_PEER_FRAME};
use crate::wire::proto::{
    signal_name, ExitKind, JobPlan, ToLauncher, ToServer, MAGIC, PROTOCOL_VERSION,
};
use weft_wireup::Rank;

mod plan;
mod servers;
pub(crate) use plan::build_plan;
pub use plan::{parse_run_args, AppContext, BindTo, LaunchError, LaunchSpec, MapBy, USAGE};
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

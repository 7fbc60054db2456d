//! `weft dvm`: a persistent runtime. `weft dvm start` starts one server per node, as
//! `weft run` does, and stays up; jobs are submitted to it (`weft run --dvm URI`), listed
//! (`weft ps`), killed (`weft kill`), and the runtime is stopped (`weft dvm stop`), each
//! by a short-lived submitter on the runtime's control socket.
//!
//! The controller is `weft run`'s launcher whose first job has no process
//! ([`Launch::new_dvm`]): a submitted job is planned like a spawned one (every server
//! knows it, it ends alone), its output comes to the controller over the servers'
//! connections and goes on to its submitter, which prints it and exits with the job's
//! status. A submitter whose connection closes takes its job with it (no orphans).

use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use super::{
    create_job_dir, listen, setup_error, start_servers, watch_signals, Ev, Executor, Launch,
    LaunchError, LaunchSpec, EXIT_LAUNCH_FAILED, SERVER_EXIT_WAIT,
};
use crate::jobdir::{format_secret, parse_secret, random_u64};
use crate::wire::frame::{self, MAX_PEER_FRAME};
use crate::wire::proto::{FromController, ToController, CONTROL_MAGIC, RUNTIME_PROTOCOL_VERSION};

/// The environment variable naming the runtime `weft run`, `weft ps`, `weft kill` and
/// `weft dvm stop` talk to when `--dvm` is not given.
pub const DVM_ENV: &str = "WEFT_DVM";

/// How long a submitter waits for the runtime's answer to its hello.
const HELLO_WAIT: Duration = Duration::from_secs(10);
/// How long `weft dvm stop` waits for the runtime to be gone.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// Where a persistent runtime listens for submitters, and the secret they show:
/// `weft://ADDR:PORT/ID?s=SECRET`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DvmUri {
    /// The control socket's address.
    pub addr: SocketAddr,
    /// The runtime's id (its namespace is `weft-ID`).
    pub id: String,
    /// The submitters' secret.
    pub secret: [u64; 2],
}

impl std::fmt::Display for DvmUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "weft://{}/{}?s={}",
            self.addr,
            self.id,
            format_secret(self.secret)
        )
    }
}

impl DvmUri {
    /// Parses `weft://ADDR:PORT/ID?s=SECRET`.
    pub fn parse(s: &str) -> Result<DvmUri, String> {
        let bad = |what: &str| format!("{s:?} is not a weft:// URI ({what})");
        let rest = s
            .trim()
            .strip_prefix("weft://")
            .ok_or_else(|| bad("no weft://"))?;
        let (addr, rest) = rest.split_once('/').ok_or_else(|| bad("no /ID"))?;
        let addr: SocketAddr = addr.parse().map_err(|_| bad("no ADDR:PORT"))?;
        let (id, secret) = rest.split_once("?s=").ok_or_else(|| bad("no ?s=SECRET"))?;
        let secret = parse_secret(secret).ok_or_else(|| bad("a malformed secret"))?;
        Ok(DvmUri {
            addr,
            id: id.to_owned(),
            secret,
        })
    }

    /// The runtime named by `arg` (`--dvm`), else by `$WEFT_DVM`: a `weft://` URI,
    /// `file:PATH`, or the path of a file holding the URI (`--report-uri`'s).
    pub fn resolve(arg: Option<&str>) -> Result<DvmUri, String> {
        let v = match arg {
            Some(v) => v.to_owned(),
            None => std::env::var(DVM_ENV).map_err(|_| {
                format!("no runtime named: give --dvm URI or set {DVM_ENV} (see weft dvm start)")
            })?,
        };
        if v.starts_with("weft://") {
            return DvmUri::parse(&v);
        }
        let path = v.strip_prefix("file:").unwrap_or(&v);
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!("{v:?} is neither a weft:// URI nor a readable file with one: {e}")
        })?;
        DvmUri::parse(text.lines().next().unwrap_or(""))
    }
}

pub use crate::jobdir::CONTROL_FILE;

/// The `weft run` jobs of this user that run on this machine: each job's id and control
/// URI (found in the job directories, `CONTROL_FILE`), in id order. A job that ended
/// badly may have left its file behind: a request to it then fails to connect.
pub fn local_runs() -> Vec<(String, DvmUri)> {
    let mut out = Vec::new();
    if let Ok(dir) = std::fs::read_dir(crate::jobdir::user_dir()) {
        for e in dir.flatten() {
            let file = e.path().join(CONTROL_FILE);
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            if let Ok(uri) = DvmUri::parse(text.lines().next().unwrap_or("")) {
                out.push((e.file_name().to_string_lossy().into_owned(), uri));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Runs a persistent runtime over the nodes `spec` names (`--nodes`, `--hosts`) until it
/// is stopped; writes its URI to `report` (mode 0600) and stdout once every server is
/// ready. Returns the exit status of `weft dvm start`.
pub fn start(spec: LaunchSpec, report: Option<PathBuf>) -> Result<i32, LaunchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| setup_error("tokio runtime", source))?;
    let out = rt.block_on(start_async(spec, report));
    rt.shutdown_timeout(Duration::from_millis(200));
    out
}

async fn start_async(mut spec: LaunchSpec, report: Option<PathBuf>) -> Result<i32, LaunchError> {
    let id = match spec.job_id.clone() {
        Some(id) => id,
        None => format!("dvm{}-{:08x}", std::process::id(), random_u64() as u32),
    };
    spec.job_id = Some(id.clone());
    let id = super::job_id(&spec)?;
    if spec.servers.slurm {
        // The allocation's nodes, in SLURM_NODEID order, name the runtime's nodes.
        spec.servers.hosts = Some(slurm_nodes().map_err(LaunchError::Usage)?);
    }
    // Marks the servers' node 0 as reading no terminal.
    spec.dvm = Some(String::new());
    let plan = super::plan::runtime_plan(&spec, &id)?;
    let job_dir = create_job_dir(&id)?;
    let out = serve(&spec, &plan, &job_dir, &id, report.as_deref()).await;
    crate::jobdir::remove_job(&plan.job_id, &job_dir, plan.job.num_nodes());
    if let Some(r) = &report {
        let _ = std::fs::remove_file(r);
    }
    out
}

async fn serve(
    spec: &LaunchSpec,
    plan: &crate::wire::proto::JobPlan,
    job_dir: &Path,
    id: &str,
    report: Option<&Path>,
) -> Result<i32, LaunchError> {
    let secret = [random_u64(), random_u64()];
    let (ev_tx, ev_rx) = unbounded_channel::<Ev>();
    let addr = listen(spec, secret, &ev_tx).await?;
    let control = TcpListener::bind(SocketAddr::new(spec.servers.listen, 0))
        .await
        .map_err(|e| setup_error("listen for submitters", e))?;
    let uri = DvmUri {
        addr: control
            .local_addr()
            .map_err(|e| setup_error("listen for submitters", e))?,
        id: id.to_owned(),
        secret: [random_u64(), random_u64()],
    };
    let servers = start_servers(spec, plan.job.num_nodes(), addr, job_dir, secret, &ev_tx).await?;
    watch_signals(&ev_tx);
    let mut run = Executor::new(
        Launch::new_dvm(plan.clone()),
        servers,
        plan,
        ev_tx.clone(),
        ev_rx,
    );
    let timers = run.launch.timers();
    run.execute(timers);
    run.until(Launch::started).await;
    if run.launch.started() && !run.launch.is_over() {
        tokio::spawn(accept_submitters(control, uri.secret, ev_tx));
        if let Some(path) = report {
            if let Err(e) = write_uri(path, &uri) {
                eprintln!(
                    "weft dvm: cannot write the URI to {}: {e}; stopping",
                    path.display()
                );
                let acts = run.launch.on_stop();
                run.execute(acts);
            }
        }
        println!("weft dvm: ready at {uri}");
        let _ = io::stdout().flush();
    }
    run.until(|_: &Launch| false).await;
    run.servers.reap(SERVER_EXIT_WAIT).await;
    if run.launch.started() {
        eprintln!("weft dvm: stopped");
        Ok(0)
    } else {
        Ok(EXIT_LAUNCH_FAILED)
    }
}

/// The nodes of the Slurm allocation this runs in, in the order of their `SLURM_NODEID`
/// (`scontrol show hostnames` of `SLURM_JOB_NODELIST`).
fn slurm_nodes() -> Result<Vec<String>, String> {
    let list = std::env::var("SLURM_JOB_NODELIST")
        .or_else(|_| std::env::var("SLURM_NODELIST"))
        .map_err(|_| "in a Slurm allocation without SLURM_JOB_NODELIST".to_owned())?;
    let out = std::process::Command::new("scontrol")
        .args(["show", "hostnames", &list])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let names: Vec<String> = String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect();
            if names.is_empty() {
                Err(format!("scontrol show hostnames {list}: no host"))
            } else {
                Ok(names)
            }
        }
        _ if !list.contains(['[', ',']) => Ok(vec![list]),
        Ok(o) => Err(format!(
            "scontrol show hostnames {list}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("scontrol show hostnames {list}: {e}")),
    }
}

/// Writes the URI to `path`, readable by its owner only (it holds the secret).
pub(super) fn write_uri(path: &Path, uri: &DvmUri) -> io::Result<()> {
    crate::jobdir::write_private(path, &format!("{uri}\n"))
}

/// Accepts submitters, each on its own task.
pub(super) async fn accept_submitters(l: TcpListener, secret: [u64; 2], ev: UnboundedSender<Ev>) {
    let mut next = 1u64;
    while let Ok((s, _)) = l.accept().await {
        tokio::spawn(serve_submitter(s, next, secret, ev.clone()));
        next += 1;
    }
}

/// One submitter: its hello (checked), then its requests, then its end.
async fn serve_submitter(s: TcpStream, sub: u64, secret: [u64; 2], ev: UnboundedSender<Ev>) {
    s.set_nodelay(true).ok();
    let (mut r, mut w) = s.into_split();
    let hello = tokio::time::timeout(
        HELLO_WAIT,
        frame::read_async::<ToController>(&mut r, MAX_PEER_FRAME),
    )
    .await;
    let refusal = match hello {
        Ok(Ok(ToController::Hello {
            magic,
            version,
            secret: s2,
        })) if magic == CONTROL_MAGIC => {
            if version != RUNTIME_PROTOCOL_VERSION {
                Some(format!(
                    "this runtime speaks protocol version {RUNTIME_PROTOCOL_VERSION}, the \
                     submitter {version}: use the same weft for both"
                ))
            } else if s2 != secret {
                Some("wrong secret in the URI".to_owned())
            } else {
                None
            }
        }
        _ => {
            tracing::warn!("dropping a connection with a bad submitter hello");
            return;
        }
    };
    if let Some(why) = refusal {
        let _ = frame::write_async(&mut w, &frame::encode(&FromController::Error(why))).await;
        return;
    }
    let (tx, mut rx) = unbounded_channel::<Vec<u8>>();
    let _ = tx.send(frame::encode(&FromController::Welcome {
        runtime: String::new(),
    }));
    tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            if frame::write_async(&mut w, &f).await.is_err() {
                break;
            }
        }
    });
    let _ = ev.send(Ev::SubHello { sub, tx });
    while let Ok(msg) = frame::read_async::<ToController>(&mut r, MAX_PEER_FRAME).await {
        if ev.send(Ev::SubMsg { sub, msg }).is_err() {
            return;
        }
    }
    let _ = ev.send(Ev::SubGone { sub });
}

/// A submitter's connection to the runtime of `uri`, past the hello.
struct Conn {
    r: tokio::net::tcp::OwnedReadHalf,
    w: tokio::net::tcp::OwnedWriteHalf,
}

impl Conn {
    async fn open(uri: &DvmUri, who: &str) -> Result<Conn, String> {
        let s = TcpStream::connect(uri.addr)
            .await
            .map_err(|e| format!("{who}: cannot reach the runtime at {}: {e}", uri.addr))?;
        s.set_nodelay(true).ok();
        let (r, w) = s.into_split();
        let mut c = Conn { r, w };
        c.send(&ToController::Hello {
            magic: CONTROL_MAGIC,
            version: RUNTIME_PROTOCOL_VERSION,
            secret: uri.secret,
        })
        .await
        .map_err(|e| format!("{who}: {e}"))?;
        match tokio::time::timeout(HELLO_WAIT, c.recv()).await {
            Ok(Ok(FromController::Welcome { .. })) => Ok(c),
            Ok(Ok(FromController::Error(why))) => Err(format!("{who}: the runtime refused: {why}")),
            Ok(Ok(other)) => Err(format!("{who}: unexpected answer {other:?}")),
            Ok(Err(e)) => Err(format!("{who}: the runtime at {} closed: {e}", uri.addr)),
            Err(_) => Err(format!(
                "{who}: no answer from the runtime at {} within {} s",
                uri.addr,
                HELLO_WAIT.as_secs()
            )),
        }
    }

    async fn send(&mut self, m: &ToController) -> io::Result<()> {
        frame::write_async(&mut self.w, &frame::encode(m)).await
    }

    async fn recv(&mut self) -> io::Result<FromController> {
        frame::read_async::<FromController>(&mut self.r, MAX_PEER_FRAME)
            .await
            .map_err(io::Error::other)
    }
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> Result<T, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    Ok(rt.block_on(f))
}

/// The variables a submitter does not pass on to its job: the ones the servers set for
/// each process, and the ones naming the submitter's own job or runtime.
fn passed_on(name: &str) -> bool {
    use weft_wireup::env as e;
    let own = [
        e::RANK,
        e::SIZE,
        e::LOCAL_RANK,
        e::LOCAL_SIZE,
        e::NODE,
        e::NSPACE,
        e::NSID,
        e::SERVER_SOCKET,
        e::TOKEN,
        e::DATASTORE,
        e::APPNUM,
        e::SERVER_PID,
        DVM_ENV,
        "WEFT_JOB_SECRET",
    ];
    !own.contains(&name)
        && !["PMIX_", "PMI_", "OMPI_", "PRTE_", "SLURM_"]
            .iter()
            .any(|p| name.starts_with(p))
}

/// `weft run --dvm`: submits the job `args` describe (`weft run`'s arguments) to the
/// runtime of `uri`, prints its output, and returns the status to exit with (the job's).
/// SIGINT, SIGTERM and SIGHUP terminate the job, as with `weft run`.
pub fn submit(uri: &DvmUri, args: &[String]) -> Result<i32, String> {
    block_on(submit_async(uri, args))?
}

async fn submit_async(uri: &DvmUri, args: &[String]) -> Result<i32, String> {
    let mut c = Conn::open(uri, "weft run").await?;
    let cwd = std::env::current_dir()
        .map_err(|e| format!("weft run: current directory: {e}"))?
        .display()
        .to_string();
    let env = std::env::vars().filter(|(k, _)| passed_on(k)).collect();
    c.send(&ToController::Submit {
        args: args.to_vec(),
        cwd,
        env,
    })
    .await
    .map_err(|e| format!("weft run: {e}"))?;
    let (sig_tx, mut sigs) = unbounded_channel::<i32>();
    for (kind, num) in [
        (tokio::signal::unix::SignalKind::interrupt(), 2),
        (tokio::signal::unix::SignalKind::terminate(), 15),
        (tokio::signal::unix::SignalKind::hangup(), 1),
    ] {
        if let Ok(mut s) = tokio::signal::unix::signal(kind) {
            let tx = sig_tx.clone();
            tokio::spawn(async move {
                while s.recv().await.is_some() {
                    let _ = tx.send(num);
                }
            });
        }
    }
    loop {
        let msg = tokio::select! {
            m = c.recv() => m,
            Some(sig) = sigs.recv() => {
                c.send(&ToController::Signal { sig }).await.map_err(|e| format!("weft run: {e}"))?;
                continue;
            }
        };
        match msg {
            Ok(FromController::Output { stderr, bytes }) => {
                let _ = if stderr {
                    let mut e = io::stderr().lock();
                    e.write_all(&bytes).and_then(|_| e.flush())
                } else {
                    let mut o = io::stdout().lock();
                    o.write_all(&bytes).and_then(|_| o.flush())
                };
            }
            Ok(FromController::Report(line)) => eprintln!("{line}"),
            Ok(FromController::JobEnd { code }) => return Ok(code),
            Ok(FromController::Error(why)) => return Err(why),
            Ok(FromController::Accepted { nspace, .. }) => {
                tracing::debug!("the job runs as {nspace}")
            }
            Ok(other) => tracing::debug!("ignored {other:?}"),
            Err(e) => {
                return Err(format!(
                    "weft run: lost the runtime at {} before the job ended: {e}",
                    uri.addr
                ))
            }
        }
    }
}

/// `weft ps`, `weft kill`, `weft dvm stop`: sends `req` to the runtime of `uri` and
/// returns its answer (`weft dvm stop` also waits, a bounded time, until the runtime has
/// ended).
pub fn request(uri: &DvmUri, who: &str, req: ToController) -> Result<String, String> {
    block_on(async {
        let mut c = Conn::open(uri, who).await?;
        let stop = req == ToController::Stop;
        c.send(&req).await.map_err(|e| format!("{who}: {e}"))?;
        let text = match c.recv().await {
            Ok(FromController::Text(t)) => t,
            Ok(FromController::Error(why)) => return Err(why),
            Ok(other) => return Err(format!("{who}: unexpected answer {other:?}")),
            Err(e) => return Err(format!("{who}: the runtime closed: {e}")),
        };
        if stop {
            // The runtime closes every connection as it ends.
            let gone =
                tokio::time::timeout(STOP_WAIT, async { while c.recv().await.is_ok() {} }).await;
            if gone.is_err() {
                return Err(format!(
                    "{who}: the runtime did not end within {} s",
                    STOP_WAIT.as_secs()
                ));
            }
        }
        Ok(text)
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uri_prints_and_parses_back_and_bad_ones_say_what_is_missing() {
        let u = DvmUri {
            addr: "127.0.0.1:4000".parse().unwrap(),
            id: "dvm1-abc".into(),
            secret: [1, 0xfeed],
        };
        let s = u.to_string();
        assert_eq!(
            s,
            "weft://127.0.0.1:4000/dvm1-abc?s=0000000000000001-000000000000feed"
        );
        assert_eq!(DvmUri::parse(&s), Ok(u.clone()));
        assert_eq!(DvmUri::parse(&format!("{s}\n")), Ok(u));
        for (bad, what) in [
            ("http://x", "no weft://"),
            ("weft://127.0.0.1:4000", "no /ID"),
            ("weft://nowhere/x?s=1-2", "no ADDR:PORT"),
            ("weft://127.0.0.1:1/x", "no ?s=SECRET"),
            ("weft://127.0.0.1:1/x?s=zz", "a malformed secret"),
        ] {
            let e = DvmUri::parse(bad).unwrap_err();
            assert!(e.contains(what), "{bad}: {e}");
        }
    }

    #[test]
    fn a_submitter_keeps_its_job_and_runtime_variables_to_itself() {
        assert!(passed_on("PATH"));
        assert!(passed_on("WEFT_LOG"));
        assert!(!passed_on("WEFT_RANK"));
        assert!(!passed_on(DVM_ENV));
        assert!(!passed_on("PMIX_RANK"));
        assert!(!passed_on("OMPI_COMM_WORLD_SIZE"));
    }
}

//! The `weft` command: `weft run | server | info | bench`.
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Weft: a communication fabric for HPC.
#[derive(Debug, Parser)]
#[command(name = "weft", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Launch a parallel job: weft run [OPTIONS] -n N [--pset NAME] PROGRAM [ARGS] [: ...]
    #[command(disable_help_flag = true)]
    Run {
        /// Options, app contexts and programs (see `weft run --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The per-node wire-up server (started by `weft run`; not for direct use).
    Server {
        /// The launcher's control address.
        #[arg(long)]
        launcher: std::net::SocketAddr,
        /// This server's node id.
        #[arg(long, required_unless_present = "node_env")]
        node: Option<u32>,
        /// The environment variable holding this server's node id (`SLURM_NODEID` when
        /// `srun` starts the servers).
        #[arg(long, conflicts_with = "node")]
        node_env: Option<String>,
        /// The job's socket directory.
        #[arg(long)]
        job_dir: PathBuf,
        /// Also let PMIx tools find this server by this pid (the launcher's).
        #[arg(long)]
        tool_pid: Option<u32>,
        /// Write the PMIx server's URI to this file (`-`: stdout).
        #[arg(long)]
        report_pmix_uri: Option<String>,
        /// Serve PMIx tools as the host's system server.
        #[arg(long)]
        pmix_system_server: bool,
    },
    /// A persistent runtime: `weft dvm start` (stays up), `weft dvm stop`.
    Dvm {
        #[command(subcommand)]
        cmd: DvmCmd,
    },
    /// The allocation sessions of a persistent runtime: `weft session ls|new|end|pause|resume`.
    Session {
        #[command(subcommand)]
        cmd: SessionCmd,
    },
    /// List the jobs and processes of a persistent runtime, or of a running `weft run`.
    Ps {
        /// The runtime (a weft:// URI or the file `--report-uri` wrote; default $WEFT_DVM).
        #[arg(long)]
        dvm: Option<String>,
        /// A `weft run` job of this user on this machine, by its job id (may be left out
        /// when only one runs, and no runtime is named).
        job: Option<String>,
    },
    /// Terminate a job of a persistent runtime (its number or namespace, see `weft ps`).
    Kill {
        /// The runtime (a weft:// URI or the file `--report-uri` wrote; default $WEFT_DVM).
        #[arg(long)]
        dvm: Option<String>,
        /// The signal number the job's status reports (it exits with 128 + N).
        #[arg(long, default_value_t = 15)]
        signal: i32,
        /// The job: its number or its namespace.
        job: String,
    },
    /// Print this machine's topology, Weft's protocol version and its tunables.
    Info,
    /// Run a benchmark (see `weft bench --help`).
    #[command(disable_help_flag = true)]
    Bench {
        /// Benchmark name and its options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
enum SessionCmd {
    /// List the sessions (id, allocation id, nodes, the process that asked); the runtime's
    /// own nodes are session 0.
    Ls {
        /// The runtime (a weft:// URI or the file `--report-uri` wrote; default $WEFT_DVM).
        #[arg(long)]
        dvm: Option<String>,
    },
    /// Make a session of free logical nodes (none held by another session); jobs run in it
    /// with `weft run --dvm URI --session ID`. It lasts until `weft session end`.
    New {
        /// The runtime (a weft:// URI or the file `--report-uri` wrote; default $WEFT_DVM).
        #[arg(long)]
        dvm: Option<String>,
        /// How many logical nodes.
        #[arg(long, default_value_t = 1)]
        nodes: u32,
        /// Its allocation id (default: chosen by the runtime).
        #[arg(long)]
        alloc_id: Option<String>,
    },
    /// End a session (its number or allocation id): its jobs are terminated.
    End {
        /// The runtime (a weft:// URI or the file `--report-uri` wrote; default $WEFT_DVM).
        #[arg(long)]
        dvm: Option<String>,
        /// The session: its number or allocation id.
        session: String,
    },
    /// Stop (SIGSTOP) every process of the session's jobs.
    Pause {
        /// The runtime (a weft:// URI or the file `--report-uri` wrote; default $WEFT_DVM).
        #[arg(long)]
        dvm: Option<String>,
        /// The session: its number or allocation id.
        session: String,
    },
    /// Continue (SIGCONT) every process of the session's jobs.
    Resume {
        /// The runtime (a weft:// URI or the file `--report-uri` wrote; default $WEFT_DVM).
        #[arg(long)]
        dvm: Option<String>,
        /// The session: its number or allocation id.
        session: String,
    },
}

#[derive(Debug, Subcommand)]
enum DvmCmd {
    /// Start the servers and stay up (in the foreground) until `weft dvm stop`, SIGINT
    /// or SIGTERM; jobs are then submitted with `weft run --dvm URI`.
    Start {
        /// Logical nodes on this machine, one server each (inside a Slurm allocation: one
        /// server per allocated node, started with one `srun` step, unless --no-slurm).
        #[arg(long, default_value_t = 1)]
        nodes: u32,
        /// Inside a Slurm allocation, start logical nodes here instead of one server per
        /// allocated node.
        #[arg(long)]
        no_slurm: bool,
        /// One node per host, servers started over the launch agent.
        #[arg(long, value_delimiter = ',')]
        hosts: Option<Vec<String>>,
        /// The remote shell for --hosts.
        #[arg(long, default_value = "ssh")]
        launch_agent: String,
        /// The address the servers and submitters reach the runtime at.
        #[arg(long, default_value = "127.0.0.1")]
        listen: std::net::IpAddr,
        /// Write the runtime's URI to this file (mode 0600) once every server is ready.
        #[arg(long)]
        report_uri: Option<PathBuf>,
        /// Serve no PMIx (Open MPI programs then cannot run in the runtime).
        #[arg(long)]
        no_pmix: bool,
        /// The runtime's id: its namespace is `weft-ID`, its jobs' `weft-ID.N` (default
        /// random).
        #[arg(long)]
        id: Option<String>,
    },
    /// Terminate every job of the runtime and stop it.
    Stop {
        /// The runtime (a weft:// URI or the file `--report-uri` wrote; default $WEFT_DVM).
        #[arg(long)]
        dvm: Option<String>,
    },
}

/// The runtime `--dvm` (or `$WEFT_DVM`) names; `who` prefixes the error.
fn dvm_uri(arg: Option<&str>, who: &str) -> Result<weft_runtime::launcher::dvm::DvmUri, ExitCode> {
    weft_runtime::launcher::dvm::DvmUri::resolve(arg).map_err(|e| {
        eprintln!("{who}: {e}");
        ExitCode::from(2)
    })
}

/// `weft ps`: the runtime named (`--dvm`, `$WEFT_DVM`), else the `weft run` job named
/// (or the only one running).
fn ps(dvm: Option<&str>, job: Option<&str>) -> ExitCode {
    use weft_runtime::launcher::dvm;
    let req = weft_runtime::wire::proto::ToController::Ps;
    if dvm.is_some() || (job.is_none() && std::env::var_os(dvm::DVM_ENV).is_some()) {
        return dvm_request(dvm, "weft ps", req);
    }
    let runs = dvm::local_runs();
    let chosen: Vec<_> = runs
        .iter()
        .filter(|(id, _)| job.is_none_or(|j| j == id))
        .collect();
    let (id, uri) = match (chosen.as_slice(), job) {
        ([one], _) => (&one.0, &one.1),
        ([], Some(j)) => {
            eprintln!("weft ps: no weft run job {j:?} of yours runs here");
            return ExitCode::from(1);
        }
        ([], None) => {
            eprintln!(
                "weft ps: no weft run job of yours runs here; for a persistent runtime \
                 give --dvm URI or set {}",
                dvm::DVM_ENV
            );
            return ExitCode::from(2);
        }
        (many, _) => {
            let ids: Vec<&str> = many.iter().map(|(id, _)| id.as_str()).collect();
            eprintln!(
                "weft ps: {} weft run jobs of yours run here ({}): name one",
                ids.len(),
                ids.join(", ")
            );
            return ExitCode::from(2);
        }
    };
    match dvm::request(uri, "weft ps", req) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weft ps: job {id}: {e}");
            ExitCode::from(1)
        }
    }
}

/// Sends `req` to the runtime and prints its answer.
fn dvm_request(
    dvm: Option<&str>,
    who: &str,
    req: weft_runtime::wire::proto::ToController,
) -> ExitCode {
    let uri = match dvm_uri(dvm, who) {
        Ok(u) => u,
        Err(code) => return code,
    };
    match weft_runtime::launcher::dvm::request(&uri, who, req) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEFT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

mod mpir;

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}

/// Restores the default action of SIGPIPE (end the process quietly), as a Unix command
/// that prints is expected to behave: `weft info | head -1` or `weft bench latency --help |
/// head -1` then end when the reader goes away instead of panicking in `println!` on the
/// broken pipe (Rust starts every program with SIGPIPE ignored).
///
/// Not for `weft run` and `weft server` (nor a benchmark's ranks, which run inside a job):
/// they own sockets and child processes and handle a closed peer as an error, and must
/// clean up when one goes away.
#[allow(unsafe_code)]
fn default_sigpipe() {
    // SAFETY: signal(2) with SIG_DFL installs no handler (no code runs on the signal);
    // it is called at the start of `main`, before any thread of this program exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    // Before anything prints (clap's `--help` included); only for the commands that print
    // and own nothing else, decided from the raw arguments.
    let sub = std::env::args().nth(1);
    let in_job = std::env::var_os(weft_wireup::env::RANK).is_some();
    if !matches!(sub.as_deref(), Some("run" | "server" | "dvm")) && !in_job {
        default_sigpipe();
    }
    init_logging();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Run { args } => {
            if args.iter().any(|a| a == "--help" || a == "-h")
                && !args.iter().any(|a| a == "--" || a == ":")
            {
                println!("{}", weft_runtime::launcher::USAGE);
                return ExitCode::SUCCESS;
            }
            weft_runtime::launcher::on_proc_table(mpir::publish);
            let mut spec = match weft_runtime::launcher::parse_run_args(&args) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
            };
            if spec.dvm.is_some()
                || std::env::var_os(weft_runtime::launcher::dvm::DVM_ENV).is_some()
            {
                let uri = match dvm_uri(spec.dvm.as_deref(), "weft run") {
                    Ok(u) => u,
                    Err(code) => return code,
                };
                return match weft_runtime::launcher::dvm::submit(&uri, &args) {
                    Ok(code) => exit(code),
                    Err(e) => {
                        eprintln!("{e}");
                        exit(weft_runtime::launcher::EXIT_LAUNCH_FAILED)
                    }
                };
            }
            // Started by an MPIR debugger: the processes wait in init until it goes on
            // from MPIR_Breakpoint.
            if mpir::being_debugged() {
                spec.stop_in_init = true;
            }
            match weft_runtime::launcher::run(spec) {
                Ok(code) => exit(code),
                Err(e) => {
                    eprintln!("{e}");
                    exit(weft_runtime::launcher::EXIT_LAUNCH_FAILED)
                }
            }
        }
        Cmd::Server {
            launcher,
            node,
            node_env,
            job_dir,
            tool_pid,
            report_pmix_uri,
            pmix_system_server,
        } => {
            let node = match (node, node_env) {
                (Some(n), _) => n,
                (None, Some(var)) => match std::env::var(&var).ok().and_then(|v| v.parse().ok()) {
                    Some(n) => n,
                    None => {
                        eprintln!("weft server: --node-env {var}: {var} holds no node number");
                        return ExitCode::from(2);
                    }
                },
                (None, None) => unreachable!("clap requires one"),
            };
            let secret = std::env::var("WEFT_JOB_SECRET")
                .ok()
                .and_then(|s| weft_runtime::server::parse_secret(&s));
            let Some(secret) = secret else {
                eprintln!("weft server: WEFT_JOB_SECRET is missing or malformed; servers are started by `weft run`");
                return ExitCode::from(2);
            };
            match weft_runtime::server::run(weft_runtime::server::ServerArgs {
                launcher,
                node,
                secret,
                job_dir,
                tools: weft_runtime::server::ToolAttach {
                    launcher_pid: tool_pid,
                    report_uri: report_pmix_uri,
                    system: pmix_system_server,
                },
            }) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("weft server: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Cmd::Dvm {
            cmd:
                DvmCmd::Start {
                    nodes,
                    hosts,
                    launch_agent,
                    listen,
                    report_uri,
                    no_pmix,
                    id,
                    no_slurm,
                },
        } => {
            if nodes == 0 {
                eprintln!("weft dvm start: --nodes must be at least 1");
                return ExitCode::from(2);
            }
            let mut spec = weft_runtime::launcher::LaunchSpec {
                nodes,
                pmix: !no_pmix,
                job_id: id,
                ..Default::default()
            };
            spec.servers.slurm =
                hosts.is_none() && !no_slurm && std::env::var_os("SLURM_JOB_ID").is_some();
            spec.servers.hosts = hosts;
            spec.servers.launch_agent = launch_agent;
            spec.servers.listen = listen;
            match weft_runtime::launcher::dvm::start(spec, report_uri) {
                Ok(code) => exit(code),
                Err(e) => {
                    eprintln!("{e}");
                    exit(weft_runtime::launcher::EXIT_LAUNCH_FAILED)
                }
            }
        }
        Cmd::Dvm {
            cmd: DvmCmd::Stop { dvm },
        } => dvm_request(
            dvm.as_deref(),
            "weft dvm stop",
            weft_runtime::wire::proto::ToController::Stop,
        ),
        Cmd::Session {
            cmd: SessionCmd::Ls { dvm },
        } => {
            let uri = match dvm_uri(dvm.as_deref(), "weft session ls") {
                Ok(u) => u,
                Err(code) => return code,
            };
            let req = weft_runtime::wire::proto::ToController::Ps;
            match weft_runtime::launcher::dvm::request(&uri, "weft session ls", req) {
                Ok(table) => {
                    // The table's node lines are session 0; its session lines the others.
                    let nodes: Vec<&str> = (table.lines())
                        .filter_map(|l| l.strip_prefix("node "))
                        .filter_map(|l| l.split_whitespace().next())
                        .collect();
                    println!(
                        "session 0  the runtime's nodes  nodes [{}]",
                        nodes.join(", ")
                    );
                    for l in table.lines().filter(|l| l.starts_with("session ")) {
                        println!("{l}");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(1)
                }
            }
        }
        Cmd::Session { cmd } => {
            use weft_runtime::wire::proto::{SessionCtl, ToController};
            let (dvm, what, ctl) = match cmd {
                SessionCmd::Ls { .. } => unreachable!("handled above"),
                SessionCmd::New {
                    dvm,
                    nodes,
                    alloc_id,
                } => (dvm, "weft session new", SessionCtl::New { nodes, alloc_id }),
                SessionCmd::End { dvm, session } => {
                    (dvm, "weft session end", SessionCtl::End { session })
                }
                SessionCmd::Pause { dvm, session } => {
                    (dvm, "weft session pause", SessionCtl::Pause { session })
                }
                SessionCmd::Resume { dvm, session } => {
                    (dvm, "weft session resume", SessionCtl::Resume { session })
                }
            };
            dvm_request(dvm.as_deref(), what, ToController::Session(ctl))
        }
        Cmd::Ps { dvm, job } => ps(dvm.as_deref(), job.as_deref()),
        Cmd::Kill { dvm, signal, job } => dvm_request(
            dvm.as_deref(),
            "weft kill",
            weft_runtime::wire::proto::ToController::Kill { job, sig: signal },
        ),
        Cmd::Info => {
            println!(
                "weft {} (wire-up protocol {})",
                env!("CARGO_PKG_VERSION"),
                weft_wireup::PROTOCOL_VERSION
            );
            match weft_runtime::topology::summary() {
                Ok(s) => println!("{s}"),
                Err(e) => println!("topology: unavailable ({e})"),
            }
            match weft_verbs::describe() {
                Ok(d) => println!("verbs: {d}"),
                Err(e) => println!("verbs: unavailable ({e})"),
            }
            match weft_pmix::library_version() {
                Ok(v) => println!(
                    "pmix: client library {v} (built with {})",
                    weft_pmix::built_with().unwrap_or("?")
                ),
                Err(e) => println!("pmix: {e}"),
            }
            println!(
                "wire-up backend: {} (WEFT_WIREUP=weft|pmix|auto)",
                weft_wireup::backend_choice()
            );
            println!(
                "hosting: weft run serves the PMI-1 and PMI-2 wire protocols to every process \
                 (PMI_FD, PMI_RANK, PMI_SIZE: MPICH programs run unmodified)"
            );
            if weft_pmix::built_with().is_some() {
                println!(
                    "hosting: weft run serves PMIx to every process (an embedded PMIx server \
                     per node: Open MPI programs and PMIx tools run unmodified; --no-pmix \
                     turns it off); fences, direct modex, groups with context ids, process-set queries, abort, termination events"
                );
            } else {
                println!("hosting: no PMIx server (built without libpmix)");
            }
            // Under a host engine, ask its PMIx server what it offers.
            let pmix_chosen = std::env::var("WEFT_WIREUP").is_ok_and(|v| v == "pmix");
            if weft_wireup::in_a_job()
                && (std::env::var_os(weft_wireup::env::RANK).is_none() || pmix_chosen)
            {
                match weft_wireup::Client::init() {
                    Ok(c) => {
                        for line in c.host_report().unwrap_or_default() {
                            println!("host: {line}");
                        }
                        let _ = c.finalize();
                    }
                    Err(e) => println!("host: cannot connect ({e})"),
                }
            }
            // Outside a job the node's address is not known: the launcher's default.
            let local = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
            match weft_tcp::Config::from_env(0, 0, [0; 2], local) {
                Ok(c) if std::env::var_os("WEFT_TCP_ADDR").is_some()
                    || std::env::var_os("WEFT_TCP_IF").is_some() =>
                {
                    println!("tcp: processes listen on {} (WEFT_TCP_ADDR / WEFT_TCP_IF), port chosen by the kernel; max frame {} B, queue {} B per connection", c.addr, c.max_frame, c.queue_bytes)
                }
                Ok(c) => println!("tcp: processes listen on their node server's address (127.0.0.1 for logical nodes; WEFT_TCP_ADDR or WEFT_TCP_IF to choose), port chosen by the kernel; max frame {} B, queue {} B per connection", c.max_frame, c.queue_bytes),
                Err(e) => println!("tcp: misconfigured ({e})"),
            }
            println!("tunables:");
            for t in weft::TUNABLE_TABLES.iter().flat_map(|(_, t)| t.iter()) {
                println!("{}", weft_tunables::info_line(t));
            }
            ExitCode::SUCCESS
        }
        Cmd::Bench { args } => exit(weft_benches::main(&args)),
    }
}

//! Tools and debuggers attached to a running `weft run` (issue 35): PMIx tools by the
//! launcher's pid and by URI file (`benches/mpi/pmix_tool.c`, OpenPMIx's unmodified
//! `tool.c`, Debian's `pps`), the process table job-wide and per node, MPIR read by
//! `gdb` from the launcher, and OpenPMIx's debugger with its daemons in a persistent
//! runtime.
#![allow(missing_docs)]

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::progs::{pmix_example, pmix_flags};
use common::{assert_clean, available, build_c, Dvm, Job};

/// `benches/mpi/pmix_tool.c` built against libpmix, or `None` (skipped, reason printed).
fn pmix_tool() -> Option<String> {
    let hint = "weft was built without libpmix (apt-get install libpmix-dev)";
    available(
        weft_pmix::built_with().is_some(),
        "WEFT_REQUIRE_OPENMPI",
        hint,
    )
    .then(|| build_c("cc", "pmix_tool.c", "pmix_tool", &pmix_flags()))
}

/// Runs `prog args` with TMPDIR `tmp` (where the job's servers write their rendezvous
/// files), killed after 30 s.
fn tool(tmp: &Path, prog: &str, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("30")
        .arg(prog)
        .args(args)
        .env("TMPDIR", tmp)
        .output()
        .unwrap_or_else(|e| panic!("{prog}: {e}"))
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One `proc NS RANK HOST EXE PID STATE` line of `pmix_tool`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    nspace: String,
    rank: u32,
    host: String,
    exe: String,
    pid: u32,
}

fn rows(o: &Output) -> Vec<Row> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("proc "))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Row {
                nspace: f[0].to_owned(),
                rank: f[1].parse().unwrap(),
                host: f[2].to_owned(),
                exe: f[3].to_owned(),
                pid: f[4].parse().unwrap(),
            }
        })
        .collect()
}

/// Runs `pmix_tool ARGS` until its process table has `n` rows, every pid known (the
/// servers report them once their processes started); panics after 30 s.
fn full_table(tmp: &Path, ptool: &str, args: &[&str], n: usize) -> (Output, Vec<Row>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let o = tool(tmp, ptool, args);
        let r = rows(&o);
        if o.status.success() && r.len() == n && r.iter().all(|r| r.pid != 0) {
            return (o, r);
        }
        assert!(Instant::now() < deadline, "no full table: {}", text(&o));
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // pid (comm) state ppid ...
    stat.rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned()
}

/// A job of 3 processes on 2 logical nodes that wait for a file: a tool finds it by the
/// launcher's pid and by the URI file `--report-pmix-uri` wrote, reads its namespace and
/// its process table (every rank's pid, once the other node's server reported them
/// through the launcher), and the table of node 0 only; OpenPMIx's `tool.c` lists the
/// namespace with its command line, `pps` finds it by itself, and `gdb` reads the same
/// pids from the launcher's MPIR table. The job then ends normally, leaving no
/// rendezvous file behind.
#[test]
fn tools_attach_by_pid_and_uri_file_and_read_the_process_table_and_mpir() {
    let (Some(ptool), Some(example)) = (pmix_tool(), pmix_example("tool")) else {
        return;
    };
    let name = format!("tools-attach-{}", std::process::id());
    let stop = std::env::temp_dir().join(format!("{name}.stop"));
    let _ = std::fs::remove_file(&stop);
    let wait = format!("while [ ! -e {} ]; do sleep 0.05; done", stop.display());
    let uri = std::env::temp_dir().join(format!("{name}.uri"));
    let _ = std::fs::remove_file(&uri);
    let uri_path = uri.clone();
    let job = Job::start(
        "tools-attach",
        &[
            "--nodes",
            "2",
            "--timeout",
            "90",
            "--report-pmix-uri",
            uri_path.to_str().unwrap(),
            "-n",
            "3",
            "sh",
            "-c",
            &wait,
        ],
    );
    let tmp = job.tmp.clone();
    let launcher = job.pid().to_string();
    // Every rank's pid reaches the tool once both servers reported them.
    let (by_pid, table) = full_table(&tmp, &ptool, &["--pid", &launcher], 3);
    let out = String::from_utf8_lossy(&by_pid.stdout).into_owned();
    let ns = table[0].nspace.clone();
    assert!(out.contains(&format!("namespaces {ns}\n")), "{out}");
    let here = this_host();
    for (i, r) in table.iter().enumerate() {
        assert_eq!(r.rank, i as u32, "{out}");
        assert_eq!(
            r.host, here,
            "a logical node's processes are on this host: {out}"
        );
        assert_eq!(r.exe, "sh", "{out}");
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", r.pid)).unwrap_or_default();
        assert_eq!(
            comm.trim(),
            "sh",
            "rank {i}'s pid {} is not its process",
            r.pid
        );
    }
    // Ranks 0 and 1 on node 0, rank 2 on node 1: two servers' children.
    let (s0, s2) = (parent_of(table[0].pid), parent_of(table[2].pid));
    assert_eq!(parent_of(table[1].pid), s0, "{out}");
    assert_ne!(s0, s2, "rank 2 runs under the other node's server: {out}");

    // `weft ps` (the only job of this TMPDIR, or named) lists the same processes.
    for args in [vec!["ps"], vec!["ps", name.as_str()]] {
        let ps = Command::new(common::weft())
            .args(&args)
            .env("TMPDIR", &tmp)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&ps.stdout).into_owned();
        assert!(ps.status.success(), "{}", text(&ps));
        assert!(out.contains(&format!("job {ns}  3 processes")), "{out}");
        for r in &table {
            let node = if r.rank < 2 { 0 } else { 1 };
            assert!(
                out.lines()
                    .any(|l| l.starts_with(&format!("rank {}  node {node} ", r.rank))
                        && l.ends_with(&format!("pid {}  running", r.pid))),
                "rank {} in weft ps: {out}",
                r.rank
            );
        }
    }

    // By the URI file, this node's table only.
    let uri_arg = format!("file:{}", uri.display());
    let local = tool(&tmp, &ptool, &["--uri", &uri_arg, "--local"]);
    assert!(local.status.success(), "{}", text(&local));
    assert_eq!(rows(&local), table[..2].to_vec(), "{}", text(&local));

    // OpenPMIx's own tool example, by URI: the namespace and its command line.
    let uri_text = std::fs::read_to_string(&uri).unwrap();
    let server_uri = uri_text.lines().next().unwrap();
    let ex = tool(&tmp, &example, &["-u", server_uri]);
    let ex_err = String::from_utf8_lossy(&ex.stderr).into_owned();
    assert!(ex.status.success(), "{}", text(&ex));
    assert!(
        ex_err.contains(&format!("\t{ns}\tsh -c {wait}")),
        "tool.c lists the namespace and its command line: {}",
        text(&ex)
    );

    // Debian's pps (libpmix-bin) finds the only server under TMPDIR by itself.
    let have_pps = Command::new("pps").arg("--version").output().is_ok();
    if available(
        have_pps,
        "WEFT_REQUIRE_OPENMPI",
        "pps is not installed (apt-get install libpmix-bin)",
    ) {
        let pps = tool(&tmp, "pps", &[]);
        assert!(
            String::from_utf8_lossy(&pps.stderr).contains(&format!("Active nspaces: {ns}")),
            "{}",
            text(&pps)
        );
    }

    // MPIR: gdb reads the table from the launcher (casts: the symbols' types are the
    // MPIR specification's, which a debugger knows).
    let have_gdb = Command::new("gdb").arg("--version").output().is_ok();
    if available(
        have_gdb,
        "WEFT_REQUIRE_GDB",
        "gdb is not installed (apt-get install gdb)",
    ) {
        let mut args = vec![
            "-batch".to_owned(),
            "-p".to_owned(),
            launcher.clone(),
            "-ex".to_owned(),
            "print (int)MPIR_proctable_size".to_owned(),
            "-ex".to_owned(),
            "print (int)MPIR_debug_state".to_owned(),
        ];
        for i in 0..3 {
            args.push("-ex".into());
            args.push(format!("print *(char**)((char*)MPIR_proctable+{})", 24 * i));
            args.push("-ex".into());
            args.push(format!(
                "print *(int*)((char*)MPIR_proctable+{})",
                24 * i + 16
            ));
        }
        let g = Command::new("timeout")
            .arg("60")
            .arg("gdb")
            .args(&args)
            .output()
            .unwrap();
        let values: Vec<String> = String::from_utf8_lossy(&g.stdout)
            .lines()
            .filter(|l| l.starts_with('$'))
            .filter_map(|l| l.split_once(" = ").map(|(_, v)| v.to_owned()))
            .collect();
        let mut want = vec!["3".to_owned(), "1".to_owned()];
        for r in &table {
            want.push(format!("{:?}", r.host));
            want.push(r.pid.to_string());
        }
        let got: Vec<String> = values
            .iter()
            .map(|v| match v.split_once(' ') {
                // `0x55... "host"`: the string.
                Some((p, s)) if p.starts_with("0x") => s.to_owned(),
                _ => v.clone(),
            })
            .collect();
        assert_eq!(got, want, "{}", text(&g));
    }

    std::fs::write(&stop, b"").unwrap();
    let d = job.wait(Duration::from_secs(60));
    let _ = std::fs::remove_file(&stop);
    let _ = std::fs::remove_file(&uri);
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    assert_clean(&name, &tmp, &d);
    let ps = Command::new(common::weft())
        .arg("ps")
        .env("TMPDIR", &tmp)
        .env_remove("WEFT_DVM")
        .output()
        .unwrap();
    assert_eq!(ps.status.code(), Some(2), "{}", text(&ps));
    assert!(
        String::from_utf8_lossy(&ps.stderr).contains("no weft run job of yours runs here"),
        "{}",
        text(&ps)
    );
}

/// `--report-pmix-uri -` prints the URI on stdout before the processes' output; with
/// `--pmix-system-server` a tool asking for the host's system server finds the job;
/// `pattrs` (an attribute query, which OpenPMIx 4.2's server library answers with a
/// stray pointer) is refused as not supported and the job goes on; a tool given a pid no
/// server answers to is refused, naming the call.
#[test]
fn the_uri_on_stdout_the_system_server_and_what_tools_cannot_break() {
    let Some(ptool) = pmix_tool() else {
        return;
    };
    let name = format!("tools-sys-{}", std::process::id());
    let stop = std::env::temp_dir().join(format!("{name}.stop"));
    let _ = std::fs::remove_file(&stop);
    let wait = format!(
        "echo hello; while [ ! -e {} ]; do sleep 0.05; done",
        stop.display()
    );
    let job = Job::start(
        "tools-sys",
        &[
            "--timeout",
            "90",
            "--report-pmix-uri",
            "-",
            "--pmix-system-server",
            "-n",
            "1",
            "sh",
            "-c",
            &wait,
        ],
    );
    let tmp = job.tmp.clone();
    let launcher = job.pid().to_string();
    full_table(&tmp, &ptool, &["--system"], 1);
    let have_pattrs = Command::new("pattrs").arg("--version").output().is_ok();
    if available(
        have_pattrs,
        "WEFT_REQUIRE_OPENMPI",
        "pattrs is not installed (apt-get install libpmix-bin)",
    ) {
        let p = tool(&tmp, "pattrs", &["--pid", &launcher, "--host", "all"]);
        assert!(
            String::from_utf8_lossy(&p.stdout).contains("NOT-SUPPORTED")
                || String::from_utf8_lossy(&p.stderr).contains("NOT-SUPPORTED"),
            "{}",
            text(&p)
        );
        // The server is still there.
        let again = tool(&tmp, &ptool, &["--pid", &launcher]);
        assert!(again.status.success(), "after pattrs: {}", text(&again));
    }
    std::fs::write(&stop, b"").unwrap();
    let d = job.wait(Duration::from_secs(60));
    let _ = std::fs::remove_file(&stop);
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    let lines: Vec<&str> = d.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", d.dump());
    assert!(
        lines[0].contains(";tcp4://127.0.0.1:"),
        "the URI first: {}",
        d.dump()
    );
    assert_eq!(lines[1], "hello", "{}", d.dump());
    assert_clean(&name, &tmp, &d);

    let empty = std::env::temp_dir().join(format!("tools-none-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let o = tool(&empty, &ptool, &["--pid", "1"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("PMIx_tool_init"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&empty);
}

/// `weft run --stop-in-init` on 2 logical nodes: every PMIx process waits in
/// `PMIx_Init` (the job is still running a second later, its table full), until a tool
/// attached to node 0 sends `PMIX_DEBUGGER_RELEASE`: then all four, on both nodes, go on
/// (each left `PMIx_Init` after the release was sent) and the job ends normally.
#[test]
fn a_job_held_in_init_goes_on_when_the_debugger_releases_it() {
    let Some(ptool) = pmix_tool() else {
        return;
    };
    let held = build_c("cc", "pmix_held.c", "pmix_held", &pmix_flags());
    let name = format!("tools-held-{}", std::process::id());
    let uri = std::env::temp_dir().join(format!("{name}.uri"));
    let _ = std::fs::remove_file(&uri);
    let job = Job::start(
        "tools-held",
        &[
            "--timeout",
            "90",
            "--nodes",
            "2",
            "--stop-in-init",
            "--report-pmix-uri",
            uri.to_str().unwrap(),
            "-n",
            "4",
            &held,
        ],
    );
    let tmp = job.tmp.clone();
    let uri_arg = format!("file:{}", uri.display());
    full_table(&tmp, &ptool, &["--uri", &uri_arg], 4);
    std::thread::sleep(Duration::from_secs(1));
    let procs = common::pids_whose("cmdline", |c| c.starts_with(&held));
    assert_eq!(procs.len(), 4, "all four wait in init: {procs:?}");
    let rel = tool(&tmp, &ptool, &["--uri", &uri_arg, "--release"]);
    assert!(rel.status.success(), "{}", text(&rel));
    let sent: f64 = String::from_utf8_lossy(&rel.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("release_sent_us "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{}", text(&rel)));
    let d = job.wait(Duration::from_secs(60));
    let _ = std::fs::remove_file(&uri);
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    let done: Vec<f64> = d
        .stdout
        .lines()
        .filter_map(|l| l.split(" init_done_us ").nth(1))
        .filter_map(|v| v.parse().ok())
        .collect();
    assert_eq!(done.len(), 4, "{}", d.dump());
    assert!(
        done.iter().all(|&t| t >= sent),
        "every process left PMIx_Init after the release ({sent}): {done:?}"
    );
    assert_clean(&name, &tmp, &d);
}

/// OpenPMIx's `debugger.c` with its `debuggerd.c`, both unmodified, against a persistent
/// runtime of 2 logical nodes: the debugger (a tool) asks what spawns and debugging
/// support there is, spawns OpenPMIx's `client.c` (2 processes, by its bare name from its
/// directory) to stop in init, then the daemons with `ppr:1:node`, `PMIX_DEBUGGER_DAEMONS`
/// and the application as `PMIX_DEBUG_JOB`, asking to hear of their completion; it ends
/// (status 0) when told the daemons' job terminated, having printed the application's
/// output (`PMIX_FWD_STDERR`). The daemons ran one per node of
/// the application; the application is still held in `PMIx_Init` after the debugger is
/// gone, and a tool's release (through the runtime's pid) lets both processes finish.
#[test]
fn openpmix_debugger_and_its_daemons_run_unmodified_in_a_persistent_runtime() {
    let (Some(ptool), Some(debugger), Some(daemon), Some(client)) = (
        pmix_tool(),
        pmix_example("debugger"),
        pmix_example("debuggerd"),
        pmix_example("client"),
    ) else {
        return;
    };
    let dvm = Dvm::start("tools-debugger", &["--nodes", "2"]);
    // The programs' directory (not the runtime's TMPDIR, which must be left clean).
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(&dvm.name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (from, to) in [
        (&debugger, "debugger"),
        (&daemon, "debuggerd"),
        (&client, "client"),
    ] {
        std::fs::copy(from, dir.join(to)).unwrap_or_else(|e| panic!("{from}: {e}"));
    }
    let t0 = Instant::now();
    let o = Command::new("timeout")
        .arg("60")
        .arg(dir.join("debugger"))
        .current_dir(&dir)
        .env("TMPDIR", &dvm.tmp)
        .output()
        .expect("debugger");
    let took = t0.elapsed();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "the debugger failed: {}", text(&o));
    assert!(err.contains("SPAWNED DEBUGGERD"), "{}", text(&o));
    assert!(!err.contains("failed"), "{}", text(&o));
    // The application's output reached the debugger (PMIX_FWD_STDERR): the line each
    // client prints before PMIx_Init.
    let running = err
        .lines()
        .filter(|l| l.starts_with("Client ") && l.ends_with(": Running"))
        .count();
    assert_eq!(running, 2, "the clients' output forwarded: {}", text(&o));
    // debuggerd.c (4.2.2) sleeps 10 s and exits: the debugger waited for its end.
    assert!(
        took >= Duration::from_secs(9),
        "ended after {took:?}: {}",
        text(&o)
    );
    // The application: spawned by the tool, both processes still held.
    let (code, ps, e) = dvm.ctl(&["ps"], &[]);
    assert_eq!(code, Some(0), "{ps}{e}");
    let line = ps
        .lines()
        .find(|l| l.contains("spawned by tool") && l.contains("client"))
        .unwrap_or_else(|| panic!("no application job in:\n{ps}"));
    assert!(line.contains("2/2 processes running"), "{ps}");
    let nspace = line.split_whitespace().nth(2).unwrap().to_owned();
    assert!(!ps.contains("debuggerd"), "the daemons' job ended: {ps}");
    let prog = dir.join("client").display().to_string();
    let held = common::pids_whose("cmdline", |c| c.starts_with(&prog));
    assert_eq!(held.len(), 2, "both processes wait in init: {held:?}\n{ps}");
    // Released, the application runs to its end.
    let pid = dvm.pid().to_string();
    let rel = tool(
        &dvm.tmp,
        &ptool,
        &["--pid", &pid, "--nspace", &nspace, "--release"],
    );
    assert!(rel.status.success(), "{}", text(&rel));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, ps, _) = dvm.ctl(&["ps"], &[]);
        if !ps.contains(&nspace) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the application still runs:\n{ps}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, log) = dvm.stop();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(
        log.matches("I AM HERE").count(),
        2,
        "one daemon per node:\n{log}"
    );
    for r in 0..2 {
        let done = format!("Client ns {nspace} rank {r}:PMIx_Finalize successfully completed");
        assert!(log.contains(&done), "{done}:\n{log}");
    }
}

/// A debugger that starts `weft run` under MPIR: it sets `MPIR_being_debugged`, stops at
/// `MPIR_Breakpoint` (every process has started), and goes on from there. Meanwhile
/// every process waits in init, a Weft program (`fence_demo`, for its server's welcome)
/// as a PMIx one (`pmix_held`, in `PMIx_Init`): a second at the breakpoint, none has
/// printed anything; once the debugger goes on, all finish and the launcher exits 0.
#[test]
fn mpir_being_debugged_holds_the_job_until_the_debugger_goes_on_from_the_breakpoint() {
    let have_gdb = Command::new("gdb").arg("--version").output().is_ok();
    if !available(
        have_gdb,
        "WEFT_REQUIRE_GDB",
        "gdb is not installed (apt-get install gdb)",
    ) {
        return;
    }
    let mut progs = vec![(common::example("fence_demo"), "ok")];
    if pmix_tool().is_some() {
        let held = build_c("cc", "pmix_held.c", "pmix_held", &pmix_flags());
        progs.push((held, "init_done_us"));
    }
    let tmp = std::env::temp_dir()
        .join("weft-tests")
        .join(format!("tools-mpir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    for (prog, done) in &progs {
        let out = tmp.join("gdb.out");
        let snap = tmp.join("at-breakpoint.out");
        let _ = std::fs::remove_file(&snap);
        let file = std::fs::File::create(&out).unwrap();
        let ex = |c: &str| ["-ex".to_owned(), c.to_owned()];
        let mut args = vec!["-batch".to_owned()];
        for c in [
            "set language c",
            "break main",
            "run",
            "set var *(int*)&MPIR_being_debugged=1",
            "break MPIR_Breakpoint",
            "continue",
            &format!("shell sleep 1; cp {} {}", out.display(), snap.display()),
            "continue",
        ] {
            args.extend(ex(c));
        }
        let g = Command::new("timeout")
            .arg("90")
            .arg("gdb")
            .args(&args)
            .arg("--args")
            .arg(common::weft())
            .args(["run", "--nodes", "2", "-n", "4", prog])
            .env("TMPDIR", &tmp)
            .env("WEFT_LOG", "warn")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .status()
            .unwrap();
        let all = std::fs::read_to_string(&out).unwrap();
        let at = std::fs::read_to_string(&snap).unwrap_or_default();
        assert!(g.success(), "gdb: {g}\n{all}");
        assert!(
            at.contains("Breakpoint 2, "),
            "{prog}: no stop at MPIR_Breakpoint:\n{all}"
        );
        assert!(
            !at.lines()
                .any(|l| l.starts_with("rank ") && l.contains(done)),
            "{prog}: a process went on while the debugger held the launcher:\n{at}"
        );
        let finished = all
            .lines()
            .filter(|l| l.starts_with("rank ") && l.contains(done))
            .count();
        assert_eq!(finished, 4, "{prog}: every process went on after:\n{all}");
        assert!(all.contains("exited normally"), "{prog}: {all}");
    }
    let left = common::leftovers(&tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(
        left.iter()
            .all(|p| p.ends_with("gdb.out") || p.ends_with("at-breakpoint.out")),
        "left {left:?}"
    );
}

/// `weft run --stop-in-init` holds Weft's own programs too: 4 `fence_demo` processes on 2
/// logical nodes wait for their server's welcome (a second and a half later all four
/// still run, where unheld they end within milliseconds), until a PMIx tool's
/// `PMIX_DEBUGGER_RELEASE`, which the launcher passes to every server; then all four
/// finish their fence.
#[test]
fn weft_programs_held_in_init_go_on_at_a_pmix_tools_release() {
    let Some(ptool) = pmix_tool() else {
        return;
    };
    let prog = common::example("fence_demo");
    let name = format!("tools-native-held-{}", std::process::id());
    let job = Job::start(
        "tools-native-held",
        &[
            "--timeout",
            "90",
            "--nodes",
            "2",
            "--stop-in-init",
            "-n",
            "4",
            &prog,
        ],
    );
    let tmp = job.tmp.clone();
    std::thread::sleep(Duration::from_millis(1500));
    let procs = common::pids_whose("cmdline", |c| c.starts_with(&prog));
    assert_eq!(procs.len(), 4, "all four wait in init: {procs:?}");
    let pid = job.pid().to_string();
    let rel = tool(&tmp, &ptool, &["--pid", &pid, "--release"]);
    assert!(rel.status.success(), "{}", text(&rel));
    let d = job.wait(Duration::from_secs(60));
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    assert_eq!(d.lines_with(" ok"), 4, "{}", d.dump());
    assert_clean(&name, &tmp, &d);
}

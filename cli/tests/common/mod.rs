//! Test helper: run `weft run` for real, with a timeout, a unique job id and a private
//! TMPDIR, and check that the job left nothing behind.
#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod progs;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub fn weft() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_weft"))
}

/// Writes an executable shell script `body` as `name` in a fresh folder `dir` (under the
/// temporary directory), as a test's launch agent, and returns its path.
pub fn script(dir: &str, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("{dir}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// The path of a probe program of `weft-testkit` (testkit/src/bin/NAME.rs), built beside
/// `weft` by `cargo test --workspace` (or `cargo build -p weft-testkit`).
pub fn probe(name: &str) -> String {
    let p = weft().parent().expect("target dir").join(name);
    assert!(
        p.exists(),
        "{} is not built (cargo build -p weft-testkit builds the probes)",
        p.display()
    );
    p.display().to_string()
}

/// The path of an example program of the `weft` package (examples/NAME.rs).
pub fn example(name: &str) -> String {
    let p = weft()
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        p.exists(),
        "{} is not built (cargo build --examples builds it)",
        p.display()
    );
    p.display().to_string()
}

/// A launched job: killed (SIGKILL to the launcher) if dropped while running.
pub struct Job {
    pub name: String,
    pub tmp: PathBuf,
    child: Option<Child>,
    out: Option<std::thread::JoinHandle<String>>,
    err: Option<std::thread::JoinHandle<String>>,
    started: Instant,
    /// Whether its end must leave nothing behind (not for a job of a persistent runtime,
    /// whose segments stay with the runtime).
    check_clean: bool,
}

pub struct Done {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Done {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
    pub fn lines_with(&self, pat: &str) -> usize {
        self.stdout.lines().filter(|l| l.contains(pat)).count()
    }
    /// The `N` of every stdout line `... gone after N ms ...` (how long a survivor took
    /// to learn of a dead peer).
    pub fn gone_after_ms(&self) -> Vec<u64> {
        self.stdout
            .lines()
            .filter_map(|l| l.split(" gone after ").nth(1))
            .filter_map(|rest| rest.split(' ').next()?.parse().ok())
            .collect()
    }

    /// `fabric_probe slow-peer|busy-peer`'s figures: how long rank 0's first send waited
    /// (ms), how many round trips its other thread made meanwhile, and the line.
    pub fn slow_peer_figures(&self) -> (u64, u64, String) {
        let line = self
            .stdout
            .lines()
            .find(|l| l.contains("slow-peer:"))
            .unwrap_or_else(|| panic!("no slow-peer line: {}", self.dump()))
            .to_string();
        let num = |after: &str| -> u64 {
            line.split(after)
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{line}"))
        };
        (num("waited "), num("ms, "), line)
    }

    pub fn dump(&self) -> String {
        format!(
            "status {:?} after {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.elapsed, self.stdout, self.stderr
        )
    }
}

fn reader(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

impl Job {
    /// Starts `weft run --job-id <name> ARGS` with TMPDIR private to this test.
    pub fn start(name: &str, args: &[&str]) -> Job {
        Job::start_with_stdin(name, args, Stdio::null())
    }

    pub fn start_with_stdin(name: &str, args: &[&str], stdin: Stdio) -> Job {
        Job::start_as(name, &[], args, stdin)
    }

    /// Starts `PREFIX... weft run ...` (e.g. a `setpriv` that changes the user).
    pub fn start_as(name: &str, prefix: &[&str], args: &[&str], stdin: Stdio) -> Job {
        let name = format!("{name}-{}", std::process::id());
        let tmp = std::env::temp_dir().join("weft-tests").join(&name);
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).expect("test tmp dir");
        if !prefix.is_empty() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))
                .expect("chmod tmp");
        }
        let weft = weft();
        let mut cmd = match prefix.split_first() {
            None => Command::new(&weft),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&weft);
                c
            }
        };
        let mut child = cmd
            .arg("run")
            .args(["--job-id", &name])
            .args(args)
            .env("TMPDIR", &tmp)
            .env("WEFT_LOG", "warn")
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn weft run");
        let out = Some(reader(child.stdout.take().expect("stdout")));
        let err = Some(reader(child.stderr.take().expect("stderr")));
        Job {
            name,
            tmp,
            child: Some(child),
            out,
            err,
            started: Instant::now(),
            check_clean: true,
        }
    }

    /// Writes `bytes` to the job's stdin and closes it.
    pub fn feed_stdin(&mut self, bytes: &[u8]) {
        use std::io::Write;
        let mut s = self
            .child
            .as_mut()
            .expect("running")
            .stdin
            .take()
            .expect("stdin was piped");
        s.write_all(bytes).expect("write stdin");
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Waits for the job; panics (after killing it) if it outlives `timeout`.
    pub fn wait(mut self, timeout: Duration) -> Done {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = child.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() > deadline {
                stop(&mut child);
                // The ranks of a launcher killed hard may still hold the pipes: read what
                // came, without waiting for ever.
                let out = join_within(self.out.take(), Duration::from_secs(5));
                let err = join_within(self.err.take(), Duration::from_secs(5));
                panic!(
                    "job {} hung for more than {timeout:?}\n--- stdout\n{out}\n--- stderr\n{err}",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let elapsed = self.started.elapsed();
        let stdout = self
            .out
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        let stderr = self
            .err
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        let done = Done {
            status,
            stdout,
            stderr,
            elapsed,
        };
        if self.check_clean {
            assert_clean(&self.name, &self.tmp, &done);
        }
        done
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            stop(&mut c);
        }
    }
}

/// Stops a launcher: SIGTERM first (it terminates its job), SIGKILL after 5 s.
fn stop(child: &mut Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A reader thread's text, if it ends within `limit`.
fn join_within(h: Option<std::thread::JoinHandle<String>>, limit: Duration) -> String {
    let Some(h) = h else {
        return String::new();
    };
    let deadline = Instant::now() + limit;
    while !h.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if h.is_finished() {
        h.join().unwrap_or_default()
    } else {
        "(still held open by a process of the job)".into()
    }
}

/// Runs `weft ARGS` (a benchmark with `--json`) with a TMPDIR of its own (`tmp`), expecting
/// success; returns its JSON rows and its stdout.
pub fn bench_json(args: &[&str], tmp: &Path) -> (Vec<serde_json::Value>, String) {
    std::fs::create_dir_all(tmp).unwrap();
    let out = Command::new(weft())
        .args(args)
        .env("TMPDIR", tmp)
        .output()
        .unwrap_or_else(|e| panic!("run weft {args:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    (rows, stdout)
}

/// Shared-memory segments of job `name` (and of the jobs it spawned, `name.N`) still in
/// /dev/shm.
pub fn segments_of(name: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|f| {
                    f.starts_with(&format!("weft-{name}-"))
                        || f.starts_with(&format!("weft-{name}."))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Files left in the test's TMPDIR below weft-<uid>/.
pub fn leftovers(tmp: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![tmp.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p.clone());
                    // The per-user directory may stay (it is shared by the user's jobs).
                    if p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("weft-"))
                        && p.parent() == Some(tmp)
                    {
                        continue;
                    }
                }
                out.push(p);
            }
        }
    }
    out
}

pub fn assert_clean(name: &str, tmp: &Path, done: &Done) {
    let segs = segments_of(name);
    assert!(
        segs.is_empty(),
        "job {name} left segments {segs:?}\n{}",
        done.dump()
    );
    let left = leftovers(tmp);
    assert!(
        left.is_empty(),
        "job {name} left files {left:?}\n{}",
        done.dump()
    );
}

/// Runs a job to completion with a timeout.
pub fn run(name: &str, args: &[&str], timeout: Duration) -> Done {
    Job::start(name, args).wait(timeout)
}

/// Whether a process exists.
pub fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
}

/// The processes whose `/proc/PID/{file}` (NULs read as spaces) satisfies `keep`.
pub fn pids_whose(file: &str, keep: impl Fn(&str) -> bool) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/{file}"))
                .map(|b| keep(&String::from_utf8_lossy(&b).replace('\0', " ")))
                .unwrap_or(false)
        })
        .collect()
}

/// Checks that job `name` (as `run` named it) left no segment or file behind.
pub fn clean(name: &str, d: &Done) {
    let job = format!("{name}-{}", std::process::id());
    assert_clean(&job, &std::env::temp_dir().join("weft-tests").join(&job), d);
}

/// Whether a test can go on: `have`, else skipped with `hint` printed, or failed when
/// the environment variable `require` is set (`ci/test.sh` sets them).
pub fn available(have: bool, require: &str, hint: &str) -> bool {
    if !have {
        assert!(
            std::env::var_os(require).is_none(),
            "{require} is set but {hint}"
        );
        eprintln!("skipped: {hint}");
    }
    have
}

/// `benches/mpi/SOURCE` compiled by `cc` with `flags` into the test's target directory as
/// `out` (the build must succeed).
pub fn build_c(cc: &str, source: &str, out: &str, flags: &[String]) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(out);
    // Built under a name of this process, then renamed: tests running at once that build
    // the same program never run (or overwrite) a half-written one.
    let tmp = out.with_extension(format!("{}.tmp", std::process::id()));
    let built = Command::new(cc)
        .args(["-O2", "-o"])
        .arg(&tmp)
        .arg(root.join("benches/mpi").join(source))
        .args(flags)
        .output()
        .unwrap_or_else(|e| panic!("{cc}: {e}"));
    assert!(
        built.status.success(),
        "{cc} {source}: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    std::fs::rename(&tmp, &out).unwrap_or_else(|e| panic!("rename {}: {e}", tmp.display()));
    out.display().to_string()
}

/// A persistent runtime (`weft dvm start`) for a test: TMPDIR private to it, its URI in
/// `uri`; stopped (and its process killed if need be) when dropped.
pub struct Dvm {
    pub name: String,
    pub tmp: PathBuf,
    pub uri: PathBuf,
    child: Option<Child>,
    err: Option<std::thread::JoinHandle<String>>,
}

impl Dvm {
    /// Starts `weft dvm start --id <name> --report-uri ... ARGS` and waits until its URI
    /// is written.
    pub fn start(name: &str, args: &[&str]) -> Dvm {
        let name = format!("{name}-{}", std::process::id());
        let tmp = std::env::temp_dir().join("weft-tests").join(&name);
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).expect("test tmp dir");
        let uri = tmp.join("dvm.uri");
        let mut child = Command::new(weft())
            .args(["dvm", "start", "--id", &name, "--report-uri"])
            .arg(&uri)
            .args(args)
            .env("TMPDIR", &tmp)
            .env("WEFT_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn weft dvm start");
        let err = Some(reader(child.stderr.take().expect("stderr")));
        let t0 = Instant::now();
        while !uri.exists() {
            if let Ok(Some(st)) = child.try_wait() {
                panic!("weft dvm start ended ({st}) before it was ready");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the runtime did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Dvm {
            name,
            tmp,
            uri,
            child: Some(child),
            err,
        }
    }

    /// The pid of `weft dvm start` (PMIx tools find the runtime by it).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The `--dvm` argument naming this runtime.
    pub fn arg(&self) -> String {
        self.uri.display().to_string()
    }

    /// `weft run --dvm URI ARGS`, started (its TMPDIR the runtime's).
    pub fn submit(&self, args: &[&str]) -> Job {
        let mut all = vec!["--dvm".to_owned(), self.arg()];
        all.extend(args.iter().map(|a| a.to_string()));
        let mut child = Command::new(weft())
            .arg("run")
            .args(&all)
            .env("TMPDIR", &self.tmp)
            .env("WEFT_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn weft run --dvm");
        let out = Some(reader(child.stdout.take().expect("stdout")));
        let err = Some(reader(child.stderr.take().expect("stderr")));
        Job {
            name: self.name.clone(),
            tmp: self.tmp.clone(),
            child: Some(child),
            out,
            err,
            started: Instant::now(),
            check_clean: false,
        }
    }

    /// `weft SUBCOMMAND --dvm URI ARGS` (`ps`, `kill`, `dvm stop`): status, stdout, stderr.
    pub fn ctl(&self, sub: &[&str], args: &[&str]) -> (Option<i32>, String, String) {
        let o = Command::new(weft())
            .args(sub)
            .args(["--dvm", &self.arg()])
            .args(args)
            .output()
            .expect("weft");
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// `weft dvm stop`, then the runtime's exit: its status and stderr; and nothing of it
    /// may be left (segments, files).
    pub fn stop(mut self) -> (Option<i32>, String) {
        let (code, out, err) = self.ctl(&["dvm", "stop"], &[]);
        assert_eq!(code, Some(0), "weft dvm stop: {out}{err}");
        let mut child = self.child.take().expect("running");
        let t0 = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait") {
                break st;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("weft dvm start did not end within 30 s of weft dvm stop");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = join_within(self.err.take(), Duration::from_secs(5));
        let segs = segments_of(&self.name);
        assert!(
            segs.is_empty(),
            "runtime {} left segments {segs:?}\n{err}",
            self.name
        );
        let left = leftovers(&self.tmp);
        assert!(
            left.is_empty(),
            "runtime {} left files {left:?}\n{err}",
            self.name
        );
        (status.code(), err)
    }
}

impl Drop for Dvm {
    /// A runtime dropped without `stop` (a failing test): stopped, and what it said shown.
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            stop(&mut c);
            let err = join_within(self.err.take(), Duration::from_secs(5));
            eprintln!("--- weft dvm start {} said:\n{err}", self.name);
        }
    }
}

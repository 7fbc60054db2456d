//! Signals to processes the runtime started (the launcher its servers' agents, a server
//! its ranks), by pid.

/// Sends `sig` to process `pid` (best effort: it may have exited already).
pub(crate) fn kill(pid: u32, sig: rustix::process::Signal) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

/// Kills (SIGKILL) every process this server's job `ns` left behind: a process whose
/// environment says it is of that job and of this server (`WEFT_NSID`, `WEFT_SERVER_PID`,
/// which a rank's own children inherit), other than this one. Called once the job's ranks
/// ended, so what it finds are processes they started and did not wait for (a background
/// job of a shell rank, a helper daemon), which would otherwise outlive the job. Returns
/// their pids.
pub(crate) fn kill_leftovers(ns: weft_wireup::NsId) -> Vec<u32> {
    let me = std::process::id();
    let want_ns = format!("{}={}", weft_wireup::env::NSID, ns.0);
    let want_server = format!("{}={me}", weft_wireup::env::SERVER_PID);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut killed = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        // Another user's process (unreadable), or one that ended meanwhile: not ours.
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars = env.split(|&b| b == 0);
        let (mut of_ns, mut of_server) = (false, false);
        for v in vars {
            of_ns |= v == want_ns.as_bytes();
            of_server |= v == want_server.as_bytes();
        }
        if of_ns && of_server {
            kill(pid, rustix::process::Signal::KILL);
            killed.push(pid);
        }
    }
    killed
}

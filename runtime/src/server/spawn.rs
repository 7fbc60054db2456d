//! Starting the node's processes.

use std::process::Stdio;

use crate::topology;
use crate::wire::proto::{AppSpec, ExitKind};
use weft_wireup::{env, Rank};

use super::output::{self, forward};
use super::{pmi, JobEvent, State};

/// Starts local rank `rank` of the focused job; an error says why it could not be (it is
/// also reported as the process's end, `SpawnFailed`).
/// How long a rank's output is still forwarded after the rank exited, when a process it
/// started holds its stdout or stderr open.
const OUTPUT_AFTER_EXIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The program `app` runs: a bare name is looked up on `PATH` and, not found there, in
/// the app's working directory (as PRRTE finds OpenPMIx's `debugger.c` spawning `client`
/// with its directory as `cwd`).
fn program_of(app: &AppSpec) -> std::path::PathBuf {
    let prog = std::path::Path::new(&app.program);
    let Some(cwd) = app.cwd.as_deref().filter(|_| !app.program.contains('/')) else {
        return prog.to_path_buf();
    };
    let path = (app.env.iter().rev())
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| std::ffi::OsString::from(v))
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d.join(prog).is_file()) {
        return prog.to_path_buf();
    }
    let local = std::path::Path::new(cwd).join(prog);
    if local.is_file() {
        local
    } else {
        prog.to_path_buf()
    }
}

pub(super) fn spawn_child(st: &State, rank: Rank) -> Result<(), String> {
    let plan = &st.job.plan;
    let sock = &st.starter.sock;
    let ds = st.job.store.name();
    let info = &plan.job.procs[rank as usize];
    let app: &AppSpec = &plan.apps[info.app as usize];
    let mut cmd = tokio::process::Command::new(program_of(app));
    cmd.args(&app.args)
        .env(env::RANK, rank.to_string())
        .env(env::SIZE, plan.job.size().to_string())
        .env(env::LOCAL_RANK, info.local_rank.to_string())
        .env(env::LOCAL_SIZE, st.job.procs.local_count().to_string())
        .env(env::NODE, st.node.to_string())
        .env(env::NSPACE, &plan.job.nspace)
        .env(env::NSID, plan.ns.0.to_string())
        .env(env::SERVER_SOCKET, sock)
        .env(
            env::TOKEN,
            st.job.procs.token(rank).expect("a local rank").to_string(),
        )
        .env(env::DATASTORE, ds)
        .env(env::APPNUM, info.app.to_string())
        .env(env::SERVER_PID, std::process::id().to_string())
        .env_remove(env::HELD)
        .env_remove("WEFT_JOB_SECRET")
        .stdin(if rank == 0 {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    // Open MPI's way in (PMIx: the library's contact for this rank; `pmix`).
    if let Some(px) = st.job.pmix.as_ref() {
        for (k, v) in px.env_of(rank) {
            cmd.env(k, v);
        }
    }
    for (k, v) in plan.env.iter().chain(&app.env) {
        cmd.env(k, v);
    }
    if let Some(cwd) = &app.cwd {
        cmd.current_dir(cwd);
    }
    if plan.stop_in_init {
        cmd.env(env::HELD, "1");
    }
    // MPICH's way in (PMI-1 over an inherited socket; `pmi`).
    let pmi = pmi::prepare(&mut cmd, rank, plan.job.size());
    if pmi.is_some() && plan.pmi_preput.is_some() {
        // Spawned through PMI: MPICH's PMI_Init then says so, and MPI_Init connects to
        // the parent's port (the preput `PARENT_ROOT_PORT_NAME`).
        cmd.env("PMI_SPAWNED", "1");
    }
    let bind = plan.bind.get(rank as usize).cloned().flatten();
    let spawned = match bind {
        None => cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", app.program)),
        Some(cpus) => {
            let handle = tokio::runtime::Handle::current();
            std::thread::scope(|s| {
                s.spawn(|| {
                    let _g = handle.enter();
                    topology::bind_current_thread(&cpus)
                        .map_err(|e| format!("cannot bind to cpus {cpus}: {e}"))?;
                    cmd.spawn()
                        .map_err(|e| format!("cannot start {}: {e}", app.program))
                })
                .join()
                .unwrap_or_else(|_| Err("binding thread panicked".into()))
            })
        }
    };
    let ev = st.job_events();
    // The child has its end (or failed to start): the server keeps only its own.
    let pmi = pmi.map(|(ours, _theirs)| ours);
    match spawned {
        Err(reason) => {
            tracing::error!("rank {rank}: {reason}");
            ev.send(JobEvent::ChildExit {
                rank,
                how: ExitKind::SpawnFailed(reason.clone()),
            });
            Err(reason)
        }
        Ok(mut child) => {
            ev.send(JobEvent::Spawned {
                rank,
                pid: child.id(),
            });
            if let Some(ours) = pmi {
                pmi::serve(ours, rank, ev.clone());
            }
            let tag = |s: &str| output::output_tag(plan, rank, s);
            let sink = if plan.forward_output {
                output::Sink::Launcher(plan.ns, rank, st.io.ctl.clone())
            } else {
                output::Sink::Local(st.starter.out.clone())
            };
            let sink2 = sink.clone();
            let out = child
                .stdout
                .take()
                .map(|o| tokio::spawn(forward(o, false, tag("stdout"), sink)));
            let err = child
                .stderr
                .take()
                .map(|e| tokio::spawn(forward(e, true, tag("stderr"), sink2)));
            tokio::spawn(async move {
                let status = child.wait().await;
                // The output ends with the process, unless a process it started (and left
                // running) holds its stdout or stderr: then what is left is dropped after a
                // grace, rather than the rank's end waiting for that process, which the
                // job's end kills (`process::kill_leftovers`).
                let until = tokio::time::Instant::now() + OUTPUT_AFTER_EXIT;
                let mut held = false;
                for t in [out, err].into_iter().flatten() {
                    let abort = t.abort_handle();
                    if tokio::time::timeout_at(until, t).await.is_err() {
                        abort.abort();
                        held = true;
                    }
                }
                if held {
                    tracing::warn!(
                        "rank {rank} ended, but a process it started still holds its output \
                         open: that output is no longer forwarded, and the process is killed \
                         when the job ends"
                    );
                }
                let how = match status {
                    Ok(s) => {
                        use std::os::unix::process::ExitStatusExt;
                        match (s.code(), s.signal()) {
                            (Some(c), _) => ExitKind::Code(c),
                            (None, Some(sig)) => ExitKind::Signal(sig),
                            (None, None) => ExitKind::Code(-1),
                        }
                    }
                    Err(e) => ExitKind::SpawnFailed(format!("wait failed: {e}")),
                };
                ev.send(JobEvent::ChildExit { rank, how });
            });
            Ok(())
        }
    }
}

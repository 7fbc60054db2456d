//! docs/guide.md, "Controlling jobs and sessions": rank 0 asks the runtime for a session
//! of one logical node, starts two `sleep 60` there, then terminates that job and gives the
//! node back. Run with `weft run --nodes 2 -n 2 target/debug/examples/readme_control`.

// The guide's block keeps its layout here (tests/readme.rs compares them).
#[rustfmt::skip]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    // README: runtime-control
    use weft::wireup::{AllocRequest, Client, JobAction, ProcSel, SessionRef, SpawnApp, SpawnOptions};

    let wire = Client::init()?;
    if wire.rank() == 0 {
        // One logical node of the runtime, for this job's helpers.
        let s = wire.allocate(&AllocRequest::new(1).alloc_id("helpers"))?;
        println!("session {} on nodes {:?}", s.session, s.nodes);
        let opts = SpawnOptions { session: Some(SessionRef::Id(s.session)), separate: false };
        let sleepers = wire.spawn_with(&[SpawnApp {
            program: "sleep".into(), args: vec!["60".into()], np: 2, env: vec![], cwd: None,
        }], &opts)?;
        // Not needed after all: end that job (status 143), then give the node back.
        wire.job_control(&[ProcSel::All(sleepers.ns)], JobAction::Terminate)?;
        wire.allocate(&AllocRequest::release(SessionRef::Id(s.session)))?;
        println!("terminated {}, released session {}", sleepers.ns, s.session);
    }
    wire.finalize()?;
    // README end
    Ok(())
}

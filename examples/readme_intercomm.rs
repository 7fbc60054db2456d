//! docs/guide.md, "Connecting jobs: intercommunicators": the world spawns 2 children of this
//! program; the parents say hello to each child, both sides merge and count themselves with
//! an allreduce, then disconnect. Run with
//! `weft run -n 2 target/debug/examples/readme_intercomm`.

// The guide's block keeps its layout here (tests/readme.rs compares them).
#[rustfmt::skip]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let me = std::env::current_exe()?.display().to_string();
    // README: intercomm
    use weft::prelude::*;

    let fabric = Fabric::init()?;
    match fabric.parent()? {
        None => {
            // The parents: spawn 2 children of this program, say hello to each.
            let kids = fabric.world().spawn(&[SpawnApp {
                program: me, args: vec![], np: 2, env: vec![], cwd: None,
            }], 0)?;
            for c in 0..kids.remote_size() {
                kids.send(&[fabric.world().rank() as u64], c, Tag(1))?;
            }
            let all = kids.merge(false)?;                 // parents first
            let mut n = [0u64];
            all.allreduce(&[1], &mut n, Op::Sum)?;        // parents + children
            println!("parent {}: {} processes", kids.rank(), n[0]);
            kids.disconnect()?;
        }
        Some(parents) => {
            let mut hello = [0u64];
            for p in 0..parents.remote_size() {
                parents.recv(&mut hello, Source::Rank(p), Tag(1))?;
            }
            let all = parents.merge(true)?;
            let mut n = [0u64];
            all.allreduce(&[1], &mut n, Op::Sum)?;
            println!("child {}: {} processes, merged rank {}", parents.rank(), n[0], all.rank());
            parents.disconnect()?;
        }
    }
    fabric.finalize()?;
    // README end
    Ok(())
}

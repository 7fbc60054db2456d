//! docs/guide.md, "Spawning a job": a process starts a job of 4 workers (this program again,
//! with `--part 2`) in its runtime. Run with `weft run -n 1 target/debug/examples/readme_spawn`;
//! the parent prints the new job, each worker its rank, mode and part.

// The guide's block keeps its layout here (tests/readme.rs compares them).
#[rustfmt::skip]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--part") {
        let wire = weft::wireup::Client::init()?;
        println!(
            "worker {} of {} in {}: mode {}, part {}",
            wire.rank(),
            wire.size(),
            wire.nspace(),
            std::env::var("WORKER_MODE")?,
            args[i + 1]
        );
        wire.finalize()?;
        return Ok(());
    }
    let worker = std::env::current_exe()?.display().to_string();
    // README: wireup-spawn
    use weft::wireup::{Client, SpawnApp};

    let wire = Client::init()?;
    let job = wire.spawn(&[SpawnApp {
        program: worker,                                  // this program, as a worker
        args: vec!["--part".into(), "2".into()],
        np: 4,
        env: vec![("WORKER_MODE".into(), "fast".into())],
        cwd: None,
    }])?;
    println!("started {} ({})", job.nspace, job.ns); // e.g. weft-123-ab.2 (ns2)
    // README end
    wire.finalize()?;
    Ok(())
}

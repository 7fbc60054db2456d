//! Wire-up demo: run under `weft run`, e.g.
//! `weft run --nodes 2 -n 4 target/release/examples/fence_demo --mode full`.
//!
//! Every rank puts a Remote card and a Local card, commits, fences in the given mode,
//! then gets every peer's cards and checks them: the Local card must be visible exactly
//! on the owner's node, the Remote card exactly off it. Prints `rank R ok` and exits 0,
//! or names the mismatch and exits 1.

use std::process::ExitCode;
use std::time::Duration;

use weft_wireup::{Client, FenceMode, GetError, GetOpts, Procs, Scope};

fn card(kind: &str, rank: u32) -> Vec<u8> {
    format!("{kind}-card-of-rank-{rank}").into_bytes()
}

fn main() -> ExitCode {
    let mut mode = FenceMode::Full;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--mode" {
            mode = match args.next().as_deref() {
                Some("full") => FenceMode::Full,
                Some("sparse") => FenceMode::Sparse,
                Some("sync") => FenceMode::SyncOnly,
                other => {
                    eprintln!("fence_demo: --mode must be full, sparse or sync, not {other:?}");
                    return ExitCode::from(2);
                }
            };
        }
    }
    match run(mode) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fence_demo: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(mode: FenceMode) -> Result<(), Box<dyn std::error::Error>> {
    let wire = Client::init()?;
    let me = wire.rank();
    println!(
        "rank {me}/{} on {} (node {} of {}, local rank {}/{}, app {}), psets {:?}, cpuset {}, \
         locality {}",
        wire.size(),
        wire.hostname(),
        wire.node(),
        wire.job().num_nodes(),
        wire.local_rank(),
        wire.local_size(),
        wire.app_num(),
        wire.psets_of(me),
        wire.job()
            .cpuset_of(me)
            .map(|c| c.to_string())
            .unwrap_or_else(|| "unbound".into()),
        wire.job().locality_of(me).unwrap_or("none"),
    );
    wire.put(Scope::Remote, "demo.remote", card("remote", me))?;
    wire.put(Scope::Local, "demo.local", card("local", me))?;
    wire.put(Scope::Global, "demo.global", u64::from(me) * 1000)?;
    wire.commit()?;
    wire.fence(Procs::All, mode, Some(Duration::from_secs(60)))?;
    let opts = GetOpts::default().timeout(Duration::from_secs(30));
    for peer in 0..wire.size() {
        let same_node = wire.job().node_of(peer) == Some(wire.node());
        let (visible, hidden) = if same_node {
            ("demo.local", "demo.remote")
        } else {
            ("demo.remote", "demo.local")
        };
        let kind = if same_node { "local" } else { "remote" };
        let got = wire.get(peer, visible, opts)?;
        if got.as_bytes() != Some(card(kind, peer).as_slice()) {
            return Err(format!("rank {me}: {visible} of rank {peer} is {got:?}").into());
        }
        match wire.get(peer, hidden, opts) {
            Err(GetError::NotFound { .. }) => {}
            other => {
                return Err(format!(
                    "rank {me}: {hidden} of rank {peer} should be invisible here, got {other:?}"
                )
                .into())
            }
        }
        let g = wire.get(peer, "demo.global", opts)?;
        if g.as_u64() != Some(u64::from(peer) * 1000) {
            return Err(format!("rank {me}: demo.global of rank {peer} is {g:?}").into());
        }
    }
    wire.fence(
        Procs::All,
        FenceMode::SyncOnly,
        Some(Duration::from_secs(60)),
    )?;
    println!("rank {me} ok");
    wire.finalize()?;
    Ok(())
}

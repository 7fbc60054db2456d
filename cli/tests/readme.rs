//! Issue 31, item 7, and issue 32, part 4: the README and docs/ say what runs.
//!
//! - Every ```rust block of README.md and docs/*.md is real code: it occurs verbatim (modulo
//!   indentation) in an example program between `// README: <name>` and `// README end`,
//!   and every such region is a block of those documents, so the two cannot drift; the
//!   examples run under `weft run` and print what a reader of the documents expects.
//! - The files, examples and links the documents name exist, and the `weft run` and
//!   `weft bench` options their shell blocks use are options those commands accept.
//!
//! Paths are found from the workspace root (the nearest folder above this package's
//! manifest whose Cargo.toml has `[workspace]`), so this file works from any member.
#![allow(missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{example, run, weft};

const T: Duration = Duration::from_secs(120);

/// The workspace root: the nearest folder at or above `CARGO_MANIFEST_DIR` whose
/// Cargo.toml declares `[workspace]`.
fn root() -> PathBuf {
    let mut dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    loop {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
        if manifest.lines().any(|l| l.trim() == "[workspace]") {
            return dir.to_path_buf();
        }
        dir = dir
            .parent()
            .expect("no Cargo.toml with [workspace] above CARGO_MANIFEST_DIR");
    }
}

/// README.md and every docs/*.md: (path relative to the root, text).
fn documents() -> Vec<(String, String)> {
    let root = root();
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    docs.insert(0, "README.md".to_owned());
    docs.into_iter()
        .map(|d| {
            let text =
                std::fs::read_to_string(root.join(&d)).unwrap_or_else(|e| panic!("{d}: {e}"));
            (d, text)
        })
        .collect()
}

/// A block's lines with leading and trailing white space removed, blank ends dropped.
fn normalize(lines: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = lines.iter().map(|l| l.trim().to_owned()).collect();
    while v.first().is_some_and(String::is_empty) {
        v.remove(0);
    }
    while v.last().is_some_and(String::is_empty) {
        v.pop();
    }
    v
}

/// The fenced blocks of `text` whose opening fence is ```` ```lang ````: (line number, lines).
fn blocks(doc: &str, text: &str, lang: &str) -> Vec<(usize, Vec<String>)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(info) = lines[i].trim_start().strip_prefix("```") {
            let start = i + 1;
            let end = (start..lines.len())
                .find(|&j| lines[j].trim_start().starts_with("```"))
                .unwrap_or_else(|| panic!("{doc}:{}: unclosed ``` block", i + 1));
            if info.trim() == lang {
                out.push((i + 1, normalize(&lines[start..end])));
            }
            i = end;
        }
        i += 1;
    }
    out
}

/// The ```rust blocks of README.md and docs/*.md: ("file:line", lines).
fn rust_blocks() -> Vec<(String, Vec<String>)> {
    documents()
        .iter()
        .flat_map(|(doc, text)| {
            blocks(doc, text, "rust")
                .into_iter()
                .map(move |(line, b)| (format!("{doc}:{line}"), b))
        })
        .collect()
}

/// The marked regions of examples/*.rs: (file:name, lines).
fn example_regions() -> Vec<(String, Vec<String>)> {
    let dir = root().join("examples");
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let mut i = 0;
        while i < lines.len() {
            if let Some(name) = lines[i].trim().strip_prefix("// README: ") {
                let end = (i + 1..lines.len())
                    .find(|&j| lines[j].trim() == "// README end")
                    .unwrap_or_else(|| panic!("{file}:{}: no `// README end`", i + 1));
                out.push((format!("{file}:{name}"), normalize(&lines[i + 1..end])));
                i = end;
            }
            i += 1;
        }
    }
    out
}

#[test]
fn every_readme_rust_block_is_an_example_and_every_marked_example_a_readme_block() {
    let blocks = rust_blocks();
    let regions = example_regions();
    let in_readme = blocks
        .iter()
        .filter(|(at, _)| at.starts_with("README.md:"))
        .count();
    assert!(
        in_readme >= 1,
        "README.md has no rust block (the quickstart)"
    );
    assert!(
        blocks.len() >= 7,
        "README.md and docs/ have {} rust blocks",
        blocks.len()
    );
    for (at, block) in &blocks {
        assert!(
            regions.iter().any(|(_, r)| r == block),
            "{at}: this ```rust block is in no example between `// README: <name>` \
             and `// README end` (edit the example with the document):\n{}",
            block.join("\n")
        );
    }
    for (name, region) in &regions {
        assert!(
            blocks.iter().any(|(_, b)| b == region),
            "examples/{name}: the marked region is no longer a ```rust block of README.md or \
             docs/ (edit the document with the example):\n{}",
            region.join("\n")
        );
    }
}

/// The quickstart's program is a whole `src/main.rs`: its block has `fn main`, and the
/// example holding it has nothing outside the marked region but comments.
#[test]
fn the_quickstart_block_is_a_whole_program() {
    let text = std::fs::read_to_string(root().join("examples/readme_quickstart.rs")).unwrap();
    let mut inside = false;
    for (i, l) in text.lines().enumerate() {
        match l.trim() {
            "// README: quickstart" => inside = true,
            "// README end" => inside = false,
            t if !inside && !t.is_empty() && !t.starts_with("//") => panic!(
                "examples/readme_quickstart.rs:{}: code outside the README region, which \
                 a reader copying the block to src/main.rs would not have: {t}",
                i + 1
            ),
            _ => {}
        }
    }
    let (_, text) = &documents()[0];
    let quick = &text[text
        .find("## Quickstart")
        .expect("README.md has a Quickstart section")..];
    let quick = &quick[..quick[3..].find("\n## ").map_or(quick.len(), |e| e + 3)];
    let rust = blocks("README.md", quick, "rust");
    assert!(
        rust.iter()
            .any(|(_, b)| b.iter().any(|l| l.starts_with("fn main()"))),
        "README.md's Quickstart has no ```rust block with fn main()"
    );
    let sh = blocks("README.md", quick, "sh")
        .into_iter()
        .flat_map(|(_, b)| b)
        .collect::<Vec<_>>()
        .join("\n");
    for step in [
        "cargo new",
        "cargo add weft --path",
        "examples/readme_quickstart.rs",
        "weft run",
    ] {
        assert!(
            sh.contains(step),
            "README.md's Quickstart commands lack `{step}`"
        );
    }
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every relative link `[..](target)` of the documents leads to a file of the repository
/// and, with `#anchor`, to a heading of it.
#[test]
fn document_links_lead_to_files_and_headings() {
    let root = root();
    let mut checked = 0;
    for (doc, text) in documents() {
        let base = root.join(&doc).parent().unwrap().to_path_buf();
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let target = &rest[..rest.find(')').unwrap_or(rest.len())];
            if target.contains("://") || target.is_empty() || target.contains(' ') {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                root.join(&doc)
            } else {
                base.join(file)
            };
            assert!(
                path.exists(),
                "{doc}: link ({target}): {} does not exist",
                path.display()
            );
            if !frag.is_empty() {
                let t = std::fs::read_to_string(&path).unwrap();
                assert!(
                    t.lines()
                        .filter_map(|l| l.strip_prefix('#'))
                        .any(|h| anchor(h.trim_start_matches('#')) == frag),
                    "{doc}: link ({target}): {} has no heading with anchor #{frag}",
                    path.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} links checked");
}

/// The scripts, sources, examples and documents the documents name exist: words that start
/// with `ci/`, `benches/`, `examples/`, `docs/` or `target/{release,debug}/examples/` (the
/// last by their source in the examples/ folder of the root or of a member).
#[test]
fn files_the_documents_name_exist() {
    let root = root();
    let mut checked = 0;
    for (doc, text) in documents() {
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c))) {
            let word = word.trim_end_matches('.');
            if word.ends_with('_') {
                continue; // a pattern such as examples/readme_*.rs
            }
            let path = if let Some(ex) = word
                .strip_prefix("target/release/examples/")
                .or_else(|| word.strip_prefix("target/debug/examples/"))
            {
                // An example of the root package or of a member folder (weft-pmix's).
                let file = format!("{ex}.rs");
                std::iter::once(root.clone())
                    .chain(
                        std::fs::read_dir(&root)
                            .unwrap()
                            .flatten()
                            .map(|e| e.path()),
                    )
                    .map(|d| d.join("examples").join(&file))
                    .find(|p| p.exists())
                    .unwrap_or_else(|| root.join("examples").join(&file))
            } else if ["ci/", "benches/", "examples/", "docs/"]
                .iter()
                .any(|p| word.starts_with(p))
                && word.len() > 5
            {
                root.join(word)
            } else {
                continue;
            };
            assert!(
                path.exists(),
                "{doc} names {word}, but {} does not exist",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} names checked");
}

/// The options after `weft run` or `weft bench NAME` on the documents' shell lines, up to
/// the program: (command, options) for each such line.
fn weft_command_lines() -> Vec<(String, Vec<String>, String)> {
    let mut out = Vec::new();
    for (doc, text) in documents() {
        for (line, block) in blocks(&doc, &text, "sh") {
            for l in block {
                let l = l.split(" # ").next().unwrap_or("").to_owned();
                let words: Vec<&str> = l.split_whitespace().collect();
                let mut i = 0;
                while i + 1 < words.len() {
                    let w = words[i];
                    if (w == "weft" || w.ends_with("/weft"))
                        && (words[i + 1] == "run" || words[i + 1] == "bench")
                    {
                        let (cmd, first) = if words[i + 1] == "run" {
                            ("run".to_owned(), i + 2)
                        } else {
                            let name = words.get(i + 2).copied().unwrap_or("");
                            (format!("bench {name}"), i + 3)
                        };
                        let opts: Vec<String> = words[first..]
                            .iter()
                            .take_while(|w| {
                                !w.contains('/') && **w != ":" && **w != "&&" && **w != "|"
                            })
                            .filter(|w| w.starts_with('-'))
                            .map(|w| w.to_string())
                            .collect();
                        out.push((cmd, opts, format!("{doc}, block at line {line}: {l}")));
                        i = first;
                    } else {
                        i += 1;
                    }
                }
            }
        }
    }
    out
}

/// Every `weft run` and `weft bench NAME` option the documents' shell lines use is in that
/// command's `--help`.
#[test]
fn weft_options_the_documents_use_exist() {
    let lines = weft_command_lines();
    assert!(
        lines.iter().filter(|(c, _, _)| c == "run").count() >= 5,
        "few weft run lines: {lines:?}"
    );
    let mut helps = std::collections::HashMap::new();
    for (cmd, opts, at) in &lines {
        let help = helps.entry(cmd.clone()).or_insert_with(|| {
            let mut args: Vec<&str> = cmd.split(' ').collect();
            args.push("--help");
            let out = std::process::Command::new(weft())
                .args(&args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "weft {} --help failed ({at}): {out:?}",
                cmd
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        });
        for o in opts {
            let bare = o.split('=').next().unwrap();
            assert!(
                bare == "--help"
                    || help
                        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
                        .any(|w| w == bare),
                "{at}: `weft {cmd}` has no option {bare} (its --help:\n{help})"
            );
        }
    }
}

/// Runs `prog` under `weft run ARGS`, expecting exit 0; returns stdout's lines, sorted.
fn run_example(name: &str, args: &[&str], prog: &str) -> Vec<String> {
    let exe = example(prog);
    let mut a = args.to_vec();
    a.push(&exe);
    let done = run(name, &a, T);
    assert_eq!(done.code(), Some(0), "{prog} {args:?}: {}", done.dump());
    let mut lines: Vec<String> = done.stdout.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

fn expect(got: &[String], want: &[String], what: &str) {
    assert_eq!(
        got, want,
        "{what}: stdout (sorted) is not what the README promises"
    );
}

#[test]
fn readme_wireup_client_and_groups_run() {
    for (name, args) in [
        ("rd-wire1", &["-n", "6"][..]),
        ("rd-wire2", &["--nodes", "2", "-n", "6"]),
    ] {
        let got = run_example(name, args, "readme_wireup");
        let mut want = Vec::new();
        for r in 0..6 {
            want.push(format!("rank {r} got \"card of rank 5\""));
            want.push(format!("rank {r} group of 6 pgcid Some(2)"));
            want.push("readme_wireup ok".to_owned());
        }
        want.sort();
        expect(&got, &want, &format!("readme_wireup {args:?}"));
    }
}

#[test]
fn readme_spawn_runs() {
    let done = run("rd-spawn", &["-n", "1", &example("readme_spawn")], T);
    assert_eq!(done.code(), Some(0), "readme_spawn: {}", done.dump());
    let mut got: Vec<String> = done.stdout.lines().map(str::to_owned).collect();
    got.sort();
    let nspace = got
        .iter()
        .find_map(|l| l.strip_prefix("started ")?.strip_suffix(" (ns2)"))
        .unwrap_or_else(|| panic!("no job started: {}", done.dump()))
        .to_owned();
    let mut want: Vec<String> = (0..4)
        .map(|r| format!("worker {r} of 4 in {nspace}: mode fast, part 2"))
        .collect();
    want.push(format!("started {nspace} (ns2)"));
    want.sort();
    expect(&got, &want, "readme_spawn");
}

#[test]
fn readme_intercomm_runs() {
    let done = run("rd-icomm", &["-n", "2", &example("readme_intercomm")], T);
    assert_eq!(done.code(), Some(0), "readme_intercomm: {}", done.dump());
    let mut got: Vec<String> = done.stdout.lines().map(str::to_owned).collect();
    got.sort();
    // Parents first in the merged communicator: children are its ranks 2 and 3.
    let want = [
        "child 0: 4 processes, merged rank 2",
        "child 1: 4 processes, merged rank 3",
        "parent 0: 4 processes",
        "parent 1: 4 processes",
    ];
    expect(&got, &want.map(str::to_owned), "readme_intercomm");
}

#[test]
fn readme_control_runs() {
    let args = ["--nodes", "2", "-n", "2", &example("readme_control")];
    let done = run("rd-control", &args, T);
    assert_eq!(done.code(), Some(0), "readme_control: {}", done.dump());
    let got: Vec<String> = done.stdout.lines().map(str::to_owned).collect();
    let want = [
        "session 1 on nodes [0]".to_owned(),
        "terminated ns2, released session 1".to_owned(),
    ];
    expect(&got, &want, "readme_control");
    // The sleepers were ended by the request, not after their 60 s.
    assert!(
        done.stderr.contains("(job control); terminating the job"),
        "{}",
        done.dump()
    );
    assert!(done.elapsed < Duration::from_secs(30), "{}", done.dump());
}

#[test]
fn readme_names_runs() {
    let done = run("rd-names", &["-n", "2", &example("readme_names")], T);
    assert_eq!(done.code(), Some(0), "readme_names: {}", done.dump());
    let mut got: Vec<String> = done.stdout.lines().map(str::to_owned).collect();
    got.sort();
    let nspace = format!("weft-rd-names-{}", std::process::id());
    let want: Vec<String> = (0..2)
        .map(|r| format!("rank {r}: my-port published by {nspace}:0"))
        .collect();
    expect(&got, &want, "readme_names");
}

#[test]
fn readme_messaging_runs() {
    for (name, args) in [
        ("rd-msg1", &["-n", "4"][..]),
        ("rd-msg2", &["--nodes", "2", "-n", "4"]),
    ] {
        let got = run_example(name, args, "readme_messaging");
        let want: Vec<String> = (0..4)
            .map(|r| format!("rank {r} got [{0}] from {0}, big intact: true", (r + 3) % 4))
            .collect();
        expect(&got, &want, &format!("readme_messaging {args:?}"));
    }
}

#[test]
fn readme_sessions_run() {
    for (name, args) in [
        ("rd-ses1", &["-n", "4"][..]),
        ("rd-ses2", &["--nodes", "2", "-n", "4"]),
    ] {
        let got = run_example(name, args, "readme_sessions");
        let mut want: Vec<String> = (0..4)
            .map(|r| format!("rank {r} of 4, context id (PGCID) 2"))
            .chain((0..4).map(|_| "evens has 2 members".to_owned()))
            .collect();
        want.sort();
        expect(&got, &want, &format!("readme_sessions {args:?}"));
    }
}

/// The scan with the README's user operation: member r of each half gets r+1 ones.
#[test]
fn readme_collectives_scan_gives_1_11_111_1111() {
    for (name, n, nodes) in [("rd-coll1", 4u32, 1u32), ("rd-coll2", 8, 2)] {
        let (ns, nn) = (n.to_string(), nodes.to_string());
        let got = run_example(name, &["--nodes", &nn, "-n", &ns], "readme_collectives");
        let ones = |k: u32| "1".repeat(k as usize);
        let mut want: Vec<String> = (0..n)
            .map(|r| {
                format!(
                    "rank {r} of a node of {}: total {n}, scan {}",
                    n / nodes,
                    ones(r / 2 + 1)
                )
            })
            .chain((0..n).map(|_| format!("sum [{n}.0, {n}.0, {n}.0, {n}.0]")))
            .collect();
        want.sort();
        expect(
            &got,
            &want,
            &format!("readme_collectives -n {n} --nodes {nodes}"),
        );
    }
}

#[test]
fn readme_fabric_fence_and_create_comm_run() {
    for (name, args) in [
        ("rd-fw1", &["-n", "4"][..]),
        ("rd-fw2", &["--nodes", "2", "-n", "4"]),
    ] {
        let got = run_example(name, args, "readme_fabric_wire");
        let want: Vec<String> = (0..4)
            .map(|r| format!("rank {r} card of 64 bytes, comm of 4"))
            .collect();
        expect(&got, &want, &format!("readme_fabric_wire {args:?}"));
    }
}

#[test]
fn readme_quickstart_runs() {
    for (name, args) in [
        ("rd-quick1", &["-n", "4"][..]),
        ("rd-quick2", &["--nodes", "2", "-n", "4"]),
    ] {
        let got = run_example(name, args, "readme_quickstart");
        let want: Vec<String> = (0..4)
            .map(|r| {
                format!(
                    "rank {r} of 4: got [{}] from the left, sum [6]",
                    (r + 3) % 4
                )
            })
            .collect();
        expect(&got, &want, &format!("readme_quickstart {args:?}"));
    }
}

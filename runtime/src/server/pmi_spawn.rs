//! The spawns PMI clients ask for, as MPICH and Slurm's PMI-2 library write them: PMI-1's
//! `mcmd=spawn` blocks (`parse_v1`) and PMI-2's `spawn` pairs (`parse_v2`), each read into
//! the apps of the new job and the keys its processes read as their job's (the spawner's
//! "preput": MPICH's parent port). Errors say what is wrong; the front ends (`pmi`,
//! `pmi2`) answer them.

use std::collections::HashMap;

use weft_wireup::SpawnApp;

/// A PMI spawn: its apps, and the keys its processes read as their job's (the preput).
pub(super) type PmiSpawn = (Vec<SpawnApp>, Vec<(String, String)>);

/// A PMI-1 spawn (`mcmd=spawn`, one block per app): its apps, and the keys the new job's
/// processes read as their job's ("preput": MPICH's parent port). An error says what is
/// wrong.
pub(super) fn parse_v1(text: &str) -> Result<PmiSpawn, String> {
    let mut blocks: Vec<HashMap<&str, &str>> = Vec::new();
    let mut open = false;
    for l in text.lines() {
        let l = l.trim_start();
        if l.is_empty() {
            continue;
        }
        if l == "mcmd=spawn" {
            blocks.push(HashMap::new());
            open = true;
        } else if l == "endcmd" {
            open = false;
        } else if !open {
            return Err(format!("{l:?} outside a mcmd=spawn ... endcmd block"));
        } else {
            let (k, v) = l
                .split_once('=')
                .ok_or_else(|| format!("{l:?} is not key=value"))?;
            blocks.last_mut().expect("open").insert(k, v);
        }
    }
    if blocks.is_empty() {
        return Err("a spawn with no mcmd=spawn block".into());
    }
    let num = |b: &HashMap<&str, &str>, k: &str| -> Result<Option<u32>, String> {
        b.get(k)
            .map(|v| {
                v.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{k}={v:?} is not a count"))
            })
            .transpose()
    };
    let mut apps = Vec::new();
    let mut preput: Vec<(String, String)> = Vec::new();
    for b in &blocks {
        let program = b.get("execname").ok_or("a spawn block without execname")?;
        let np = num(b, "nprocs")?.ok_or("a spawn block without nprocs")?;
        let argc = num(b, "argcnt")?.unwrap_or(0);
        let args = (1..=argc)
            .map(|i| {
                b.get(format!("arg{i}").as_str())
                    .map(|v| (*v).to_owned())
                    .ok_or_else(|| format!("argcnt={argc} but no arg{i}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // `count` pairs `key_I`/`val_I` of block `b`, I from 0.
        let pairs = |count: &str, n: u32, key: &str, val: &str| {
            (0..n)
                .map(|i| {
                    match (
                        b.get(format!("{key}{i}").as_str()),
                        b.get(format!("{val}{i}").as_str()),
                    ) {
                        (Some(k), Some(v)) => Ok((*k, *v)),
                        _ => Err(format!(
                            "{count} counts a {key}{i}/{val}{i} pair that is missing"
                        )),
                    }
                })
                .collect::<Result<Vec<_>, String>>()
        };
        let n = num(b, "preput_num")?.unwrap_or(0);
        for (k, v) in pairs("preput_num", n, "preput_key_", "preput_val_")? {
            if !preput.iter().any(|(pk, _)| pk == k) {
                preput.push((k.to_owned(), v.to_owned()));
            }
        }
        let n = num(b, "info_num")?.or(num(b, "infonum")?).unwrap_or(0);
        let info = pairs("info_num", n, "info_key_", "info_val_")?;
        apps.push(spawn_app(program, np, args, &info));
    }
    Ok((apps, preput))
}

/// An app of a PMI spawn, with its info keys: `wdir` is its working directory, `path`
/// where its program is looked for; the others (placement: `host`, `hostfile`) are not
/// used by a spawn that runs on the spawner's node, and are logged.
pub(super) fn spawn_app(
    program: &str,
    np: u32,
    args: Vec<String>,
    info: &[(&str, &str)],
) -> SpawnApp {
    let mut app = SpawnApp {
        program: program.to_owned(),
        args,
        np,
        env: Vec::new(),
        cwd: None,
    };
    for (k, v) in info {
        match *k {
            "wdir" => app.cwd = Some((*v).to_owned()),
            "path" => {
                if !program.contains('/') {
                    let found = v
                        .split(':')
                        .map(|d| std::path::Path::new(d).join(program))
                        .find(|p| p.is_file());
                    if let Some(p) = found {
                        app.program = p.to_string_lossy().into_owned();
                    }
                }
            }
            other => tracing::debug!("PMI spawn of {program}: info key {other:?} not used"),
        }
    }
    app
}

/// A PMI-2 spawn's pairs (`ncmds`, `preputcount`, `ppkeyI`/`ppvalI`, then per app
/// `subcmd`, `maxprocs`, `argc`, `argvI`, `infokeycount`, `infokeyI`/`infovalI`) as its
/// apps and the keys its processes read as their job's; an error says what is wrong.
pub(super) fn parse_v2(pairs: &[(String, String)]) -> Result<PmiSpawn, String> {
    let count = |v: &str, k: &str| -> Result<u32, String> {
        v.trim()
            .parse::<u32>()
            .map_err(|_| format!("{k}={v:?} is not a count"))
    };
    // The job's part, then one segment per app, each starting at its `subcmd`.
    let first_app = pairs
        .iter()
        .position(|(k, _)| k == "subcmd")
        .ok_or("a spawn without subcmd")?;
    let (head, rest) = pairs.split_at(first_app);
    fn find<'a>(ps: &'a [(String, String)], k: &str) -> Option<&'a str> {
        ps.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str())
    }
    let mut preput = Vec::new();
    for i in 0..find(head, "preputcount").map_or(Ok(0), |v| count(v, "preputcount"))? {
        match (
            find(head, &format!("ppkey{i}")),
            find(head, &format!("ppval{i}")),
        ) {
            (Some(k), Some(v)) => preput.push((k.to_owned(), v.to_owned())),
            _ => {
                return Err(format!(
                    "preputcount counts a ppkey{i}/ppval{i} pair that is missing"
                ))
            }
        }
    }
    let mut segments: Vec<&[(String, String)]> = Vec::new();
    let mut start = 0;
    for (i, (k, _)) in rest.iter().enumerate().skip(1) {
        if k == "subcmd" {
            segments.push(&rest[start..i]);
            start = i;
        }
    }
    segments.push(&rest[start..]);
    if let Some(n) = find(head, "ncmds") {
        let n = count(n, "ncmds")?;
        if n as usize != segments.len() {
            return Err(format!("ncmds={n} but {} subcmd", segments.len()));
        }
    }
    let mut apps = Vec::new();
    for seg in segments {
        let program = find(seg, "subcmd").unwrap_or_default();
        let np = count(
            find(seg, "maxprocs").ok_or("a spawn app without maxprocs")?,
            "maxprocs",
        )?;
        let argc = find(seg, "argc").map_or(Ok(0), |v| count(v, "argc"))?;
        // MPICH numbers the arguments from 0 (argv0 is the first argument, not the program).
        let base = u32::from(find(seg, "argv0").is_none() && argc > 0);
        let args = (base..base + argc)
            .map(|i| {
                find(seg, &format!("argv{i}"))
                    .map(str::to_owned)
                    .ok_or_else(|| format!("argc={argc} but no argv{i}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut info = Vec::new();
        for i in 0..find(seg, "infokeycount").map_or(Ok(0), |v| count(v, "infokeycount"))? {
            match (
                find(seg, &format!("infokey{i}")),
                find(seg, &format!("infoval{i}")),
            ) {
                (Some(k), Some(v)) => info.push((k, v)),
                _ => {
                    return Err(format!(
                        "infokeycount counts an infokey{i}/infoval{i} pair that is missing"
                    ))
                }
            }
        }
        apps.push(spawn_app(program, np, args, &info));
    }
    Ok((apps, preput))
}

#[cfg(test)]
mod tests {
    use super::parse_v1;

    #[test]
    fn spawns_parse_as_mpich_writes_them_or_are_refused() {
        // MPICH 4.0's PMI_Spawn_multiple of two apps, the second without arguments.
        let text = "mcmd=spawn\nnprocs=2\nexecname=./a\ntotspawns=2\nspawnssofar=1\n\
                    arg1=x y=z\narg2=w\nargcnt=2\npreput_num=1\n\
                    preput_key_0=PARENT_ROOT_PORT_NAME\npreput_val_0=tag#0$p=1$\n\
                    info_num=1\ninfo_key_0=wdir\ninfo_val_0=/tmp\nendcmd\n\
                    mcmd=spawn\nnprocs=1\nexecname=b\ntotspawns=2\nspawnssofar=2\n\
                    argcnt=0\npreput_num=1\npreput_key_0=PARENT_ROOT_PORT_NAME\n\
                    preput_val_0=tag#0$p=1$\ninfo_num=1\ninfo_key_0=host\ninfo_val_0=n1\n\
                    endcmd";
        let (apps, preput) = parse_v1(text).expect("parses");
        assert_eq!(apps.len(), 2);
        assert_eq!(
            (apps[0].program.as_str(), apps[0].np, apps[0].cwd.as_deref()),
            ("./a", 2, Some("/tmp"))
        );
        assert_eq!(apps[0].args, ["x y=z", "w"]);
        assert_eq!((apps[1].program.as_str(), apps[1].np), ("b", 1));
        assert!(apps[1].args.is_empty() && apps[1].cwd.is_none());
        // The preput is the job's, given once.
        assert_eq!(
            preput,
            [(
                "PARENT_ROOT_PORT_NAME".to_string(),
                "tag#0$p=1$".to_string()
            )]
        );
        for (bad, why) in [
            ("mcmd=spawn\nexecname=a\nendcmd", "without nprocs"),
            ("mcmd=spawn\nnprocs=1\nendcmd", "without execname"),
            (
                "mcmd=spawn\nnprocs=-1\nexecname=a\nendcmd",
                "is not a count",
            ),
            (
                "mcmd=spawn\nnprocs=1\nexecname=a\nargcnt=2\narg1=x\nendcmd",
                "no arg2",
            ),
            (
                "mcmd=spawn\nnprocs=1\nexecname=a\npreput_num=1\nendcmd",
                "preput_key_0",
            ),
            (
                "mcmd=spawn\nnprocs=1\nexecname=a\nendcmd\nnprocs=2",
                "outside",
            ),
            ("mcmd=spawn\nnonsense\nendcmd", "not key=value"),
            ("", "no mcmd=spawn block"),
        ] {
            let err = parse_v1(bad).expect_err(bad);
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn spawns_parse_as_slurms_library_writes_them_or_are_refused() {
        let pairs = |t: &str| crate::server::pmi2::parse(t).expect("pairs");
        let text = "cmd=spawn;thrid=1;ncmds=2;preputcount=1;ppkey0=PARENT_ROOT_PORT_NAME;\
                    ppval0=p=1;subcmd=./a;maxprocs=2;argc=2;argv0=x y;argv1=z;\
                    infokeycount=1;infokey0=wdir;infoval0=/tmp;\
                    subcmd=b;maxprocs=1;argc=0;infokeycount=0;";
        let (apps, preput) = super::parse_v2(&pairs(text)).expect("parses");
        assert_eq!(apps.len(), 2);
        assert_eq!(
            (apps[0].program.as_str(), apps[0].np, apps[0].cwd.as_deref()),
            ("./a", 2, Some("/tmp"))
        );
        assert_eq!(apps[0].args, ["x y", "z"]);
        assert_eq!((apps[1].program.as_str(), apps[1].np), ("b", 1));
        assert_eq!(preput, [("PARENT_ROOT_PORT_NAME".into(), "p=1".into())]);
        for (bad, why) in [
            ("cmd=spawn;ncmds=1;", "without subcmd"),
            (
                "cmd=spawn;ncmds=2;subcmd=a;maxprocs=1;",
                "ncmds=2 but 1 subcmd",
            ),
            ("cmd=spawn;subcmd=a;argc=0;", "without maxprocs"),
            ("cmd=spawn;subcmd=a;maxprocs=x;", "is not a count"),
            ("cmd=spawn;subcmd=a;maxprocs=1;argc=2;argv0=x;", "no argv1"),
            ("cmd=spawn;preputcount=1;subcmd=a;maxprocs=1;", "ppkey0"),
        ] {
            let err = super::parse_v2(&pairs(bad)).expect_err(bad);
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }
}

//! The PMI-2 wire protocol, on the same descriptor as PMI-1 (`pmi`): a client that opens
//! with the PMI-1 line `cmd=init pmi_version=2` gets `response_to_init pmi_version=2`,
//! then speaks PMI-2: each command is its length in 6 characters (decimal, left-aligned,
//! space-padded) followed by `key=value;` pairs (`;` inside a value doubled), the first
//! pair `cmd=NAME`; each reply is `cmd=NAME-response;...;rc=0;` in the same framing.
//!
//! - `fullinit` answers rank, size, app number; `job-getid` the job's namespace;
//! - `kvs-put` commits the key for the process (as PMI-1's `put`: the two share keys),
//!   `kvs-fence` is a Full fence of the whole job, `kvs-get` reads a key from whichever
//!   process put it;
//! - `info-getjobattr` answers `PMI_process_mapping` and `universeSize`;
//!   `info-putnodeattr` and `info-getnodeattr` keep attributes of the node, visible to
//!   its processes (a get with `wait=TRUE` waits for the put);
//! - `finalize` as PMI-1's; `abort` ends the process and the job (exit code 1);
//! - `spawn` (`PMI2_Job_Spawn`) as PMI-1's `mcmd=spawn`, answered with the new job's id;
//!   a process of a job spawned so is told its spawner in `fullinit` (`spawner-jobid`);
//! - `name-publish`, `name-unpublish`, `name-lookup` as PMI-1's name commands (a lookup's
//!   port is answered as both `port` and `value`: MPICH's and Slurm's libraries differ).
//!
//! A malformed command or an unknown one gets a reply with `rc=-1` and `errmsg` saying
//! why.

use std::io::Read;

use super::pmi::{msg, Wait, VALLEN_MAX};
use weft_wireup::{Rank, Value};

use super::pmi_keys::NodeAttr;
use super::published::PmiName;
use super::{pmi, pmi_spawn, State};

/// Reads one PMI-2 command (its 6-character length, then that many bytes).
pub(super) fn read_command(r: &mut impl Read, max: usize) -> Result<String, String> {
    let mut len = [0u8; 6];
    r.read_exact(&mut len)
        .map_err(|e| format!("a PMI-2 command's length: {e}"))?;
    let text = String::from_utf8_lossy(&len);
    let n: usize = text
        .trim()
        .parse()
        .map_err(|_| format!("a PMI-2 command's length {text:?} is not a number"))?;
    if n > max {
        return Err(format!("a PMI-2 command of {n} bytes (at most {max})"));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)
        .map_err(|e| format!("a PMI-2 command of {n} bytes: {e}"))?;
    String::from_utf8(body).map_err(|_| "a PMI-2 command that is not UTF-8".to_string())
}

/// `key=value;` pairs (`;;` inside a value is one `;`), in order; `None` when malformed.
pub(super) fn parse(text: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while chars.peek().is_some() {
        let mut key = String::new();
        loop {
            match chars.next()? {
                '=' => break,
                ';' => return None,
                c => key.push(c),
            }
        }
        let mut value = String::new();
        loop {
            match chars.next() {
                None => return None, // the last pair too ends with ';'
                Some(';') if chars.peek() == Some(&';') => {
                    chars.next();
                    value.push(';');
                }
                Some(';') => break,
                Some(c) => value.push(c),
            }
        }
        if key.is_empty() {
            return None;
        }
        out.push((key, value));
    }
    Some(out)
}

/// One reply: `pairs` as `k=v;` (`;` in values doubled), framed with its length.
pub(super) fn frame(pairs: &[(&str, String)]) -> Vec<u8> {
    let mut body = String::new();
    for (k, v) in pairs {
        body.push_str(k);
        body.push('=');
        body.push_str(&v.replace(';', ";;"));
        body.push(';');
    }
    format!("{:<6}{body}", body.len()).into_bytes()
}

fn truth(b: bool) -> String {
    if b { "TRUE" } else { "FALSE" }.to_string()
}

impl State {
    fn pmi2_send(&self, rank: Rank, pairs: &[(&str, String)]) {
        if let Some(c) = self.job.pmi.conns.get(&rank) {
            let _ = c.tx.send(frame(pairs));
        }
    }

    fn pmi2_error(&self, rank: Rank, cmd: &str, why: &str) {
        let name = format!("{cmd}-response");
        self.pmi2_send(
            rank,
            &[
                ("cmd", name),
                ("rc", "-1".into()),
                ("errmsg", why.to_string()),
            ],
        );
    }

    /// A PMI-2 command from rank `rank` (or why its connection failed).
    pub(super) fn on_pmi2(&mut self, rank: Rank, cmd: Result<String, String>) {
        let text = match cmd {
            Ok(t) => t,
            Err(why) => {
                tracing::warn!("rank {rank}: PMI-2: {why}; closing its PMI connection");
                return self.pmi2_error(rank, "error", &why);
            }
        };
        if !self.job.pmi.conns.get(&rank).is_some_and(|c| c.v2) {
            tracing::warn!("rank {rank}: a PMI-2 command before init asked for version 2");
            return self.pmi2_error(rank, "error", "send cmd=init pmi_version=2 first");
        }
        let Some(pairs) = parse(&text) else {
            tracing::warn!("rank {rank}: malformed PMI-2 command {text:?}");
            return self.pmi2_error(
                rank,
                "error",
                "malformed command (expected key=value pairs, each ending with a semicolon)",
            );
        };
        let get = |k: &str| pairs.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str());
        let Some(cmd) = get("cmd") else {
            return self.pmi2_error(rank, "error", "the command has no cmd=");
        };
        let resp = |name: &str| ("cmd", format!("{name}-response"));
        let ok = || ("rc", "0".to_string());
        let size = self.job.plan.job.size();
        let app = self.job.app_of(rank);
        match cmd {
            "fullinit" => {
                if let Some(r) = get("pmirank") {
                    if r != rank.to_string() {
                        let why = format!("pmirank={r}, but this connection is rank {rank}'s");
                        return self.pmi2_error(rank, cmd, &why);
                    }
                }
                let mut reply = vec![
                    resp(cmd),
                    ("pmi-version", "2".into()),
                    ("pmi-subversion", "0".into()),
                    ("rank", rank.to_string()),
                    ("size", size.to_string()),
                    ("appnum", app.to_string()),
                ];
                // A job spawned through PMI: MPICH then reads its parent's port.
                if let (Some(_), Some((_, parent))) =
                    (&self.job.plan.pmi_preput, &self.job.plan.parent)
                {
                    reply.push(("spawner-jobid", msg(parent)));
                }
                reply.extend([
                    ("debugged", truth(false)),
                    ("pmiverbose", truth(false)),
                    ok(),
                ]);
                self.pmi2_send(rank, &reply);
            }
            "job-getid" => {
                let id = msg(&self.job.plan.job.nspace);
                self.pmi2_send(rank, &[resp(cmd), ("jobid", id), ok()]);
            }
            "info-getjobattr" => {
                let value = match get("key") {
                    Some("PMI_process_mapping") => {
                        let nodes: Vec<u32> =
                            self.job.plan.job.procs.iter().map(|p| p.node).collect();
                        Some(pmi::process_mapping(&nodes))
                    }
                    Some("universeSize") => Some(size.to_string()),
                    _ => None,
                };
                let mut reply = vec![resp(cmd), ("found", truth(value.is_some()))];
                if let Some(v) = value {
                    reply.push(("value", v));
                }
                reply.push(ok());
                self.pmi2_send(rank, &reply);
            }
            "info-putnodeattr" => {
                let (Some(k), Some(v)) = (get("key"), get("value")) else {
                    return self.pmi2_error(rank, cmd, "needs key and value");
                };
                let (k, v) = (k.to_string(), v.to_string());
                let waiting = self.job.pmi.keys.on_put_node_attr(k, v.clone());
                self.pmi2_send(rank, &[resp(cmd), ok()]);
                // Gets that waited for it.
                for r in waiting {
                    self.pmi2_send(
                        r,
                        &[
                            resp("info-getnodeattr"),
                            ("found", truth(true)),
                            ("value", v.clone()),
                            ok(),
                        ],
                    );
                }
            }
            "info-getnodeattr" => {
                let Some(k) = get("key") else {
                    return self.pmi2_error(rank, cmd, "needs a key");
                };
                let wait = get("wait") == Some("TRUE");
                match self.job.pmi.keys.on_get_node_attr(rank, k, wait) {
                    NodeAttr::Found(v) => {
                        self.pmi2_send(
                            rank,
                            &[resp(cmd), ("found", truth(true)), ("value", v), ok()],
                        );
                    }
                    NodeAttr::Waiting => {}
                    NodeAttr::NotFound => {
                        self.pmi2_send(rank, &[resp(cmd), ("found", truth(false)), ok()])
                    }
                }
            }
            "kvs-put" => {
                let (Some(key), Some(value)) = (get("key"), get("value")) else {
                    return self.pmi2_error(rank, cmd, "needs key and value");
                };
                if value.len() > VALLEN_MAX {
                    let why = format!("value longer than {VALLEN_MAX} bytes");
                    return self.pmi2_error(rank, cmd, &why);
                }
                self.pmi_put(rank, key, value);
                self.pmi2_send(rank, &[resp(cmd), ok()]);
            }
            "kvs-fence" => self.pmi_barrier(rank, "pmi2"),
            "kvs-get" => {
                let Some(key) = get("key") else {
                    return self.pmi2_error(rank, cmd, "needs a key");
                };
                if let Some(v) = self.preput(key) {
                    let pairs = [resp(cmd), ("found", truth(true)), ("value", v.into()), ok()];
                    return self.pmi2_send(rank, &pairs);
                }
                let Some(owner) = self.job.pmi.keys.owner(key) else {
                    return self.pmi2_send(rank, &[resp(cmd), ("found", truth(false)), ok()]);
                };
                let (key, owner) = (key.to_string(), owner);
                self.pmi_get(rank, owner, &key);
            }
            "finalize" => {
                self.job.procs.on_finalize_at_exit(rank);
                self.pmi2_send(rank, &[resp(cmd), ok()]);
            }
            "name-publish" => match (get("name"), get("port")) {
                (Some(n), Some(p)) => {
                    let (n, p) = (n.to_owned(), p.to_owned());
                    self.pmi_name(rank, PmiName::Publish, &n, Some(&p));
                }
                _ => self.pmi2_error(rank, cmd, "needs name and port"),
            },
            "name-unpublish" | "name-lookup" => match get("name") {
                Some(n) => {
                    let what = if cmd == "name-lookup" {
                        PmiName::Lookup
                    } else {
                        PmiName::Unpublish
                    };
                    let n = n.to_owned();
                    self.pmi_name(rank, what, &n, None);
                }
                None => self.pmi2_error(rank, cmd, "needs a name"),
            },
            "spawn" => match pmi_spawn::parse_v2(&pairs) {
                Ok((apps, preput)) => self.pmi_spawn(rank, apps, preput),
                Err(why) => {
                    tracing::warn!("rank {rank}: PMI-2 spawn refused: {why}");
                    self.pmi2_error(rank, cmd, &why);
                }
            },
            "abort" => {
                let what = format!("called PMI2_Abort: {}", get("msg").unwrap_or(""));
                self.proc_aborted(rank, 1, &what);
            }
            other => {
                tracing::warn!("rank {rank}: unsupported PMI-2 command {other:?}");
                self.pmi2_error(rank, other, "unsupported PMI-2 command");
            }
        }
    }

    /// The name service's answer to rank `rank`'s `cmd` (`name-publish`, ...): a lookup's
    /// port (as `port`, MPICH's key, and `value`, Slurm's library's), or why it failed.
    pub(super) fn pmi2_named(&self, rank: Rank, cmd: &str, port: Result<Option<String>, String>) {
        let name = format!("{cmd}-response");
        match port {
            Ok(Some(p)) => self.pmi2_send(
                rank,
                &[
                    ("cmd", name),
                    ("rc", "0".into()),
                    ("port", p.clone()),
                    ("value", p),
                ],
            ),
            Ok(None) => self.pmi2_send(rank, &[("cmd", name), ("rc", "0".into())]),
            Err(why) => self.pmi2_error(rank, cmd, &why),
        }
    }

    /// The answer to rank `rank`'s PMI-2 spawn: the new job's namespace, or why not.
    pub(super) fn pmi2_spawned(&self, rank: Rank, result: Result<String, String>) {
        match result {
            Ok(nspace) => self.pmi2_send(
                rank,
                &[
                    ("cmd", "spawn-response".into()),
                    ("rc", "0".into()),
                    ("jobid", msg(&nspace)),
                    ("nerrs", "0".into()),
                ],
            ),
            Err(why) => self.pmi2_error(rank, "spawn", &why),
        }
    }

    /// The core's answer to a PMI-2 request (a fence or a get), in PMI-2's words.
    pub(super) fn pmi2_reply(&self, rank: Rank, wait: Wait, text: Option<Result<Value, String>>) {
        let ok = || ("rc", "0".to_string());
        match (wait, text) {
            (Wait::Barrier, None) => {
                self.pmi2_send(rank, &[("cmd", "kvs-fence-response".into()), ok()]);
            }
            (Wait::Barrier, Some(Err(why))) => self.pmi2_error(rank, "kvs-fence", &why),
            (Wait::Get, Some(Ok(Value::Str(v)))) => self.pmi2_send(
                rank,
                &[
                    ("cmd", "kvs-get-response".into()),
                    ("found", truth(true)),
                    ("value", v),
                    ok(),
                ],
            ),
            (Wait::Get, Some(Err(_))) => self.pmi2_send(
                rank,
                &[
                    ("cmd", "kvs-get-response".into()),
                    ("found", truth(false)),
                    ok(),
                ],
            ),
            (Wait::Barrier, _) => self.pmi2_error(rank, "kvs-fence", "unexpected reply"),
            (Wait::Get, _) => self.pmi2_error(rank, "kvs-get", "unexpected reply"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{frame, parse, read_command};

    #[test]
    fn commands_parse_with_escaped_semicolons_or_are_refused() {
        let p = parse("cmd=kvs-put;key=a;value=x;;y;").expect("parses");
        assert_eq!(
            p,
            vec![
                ("cmd".to_string(), "kvs-put".to_string()),
                ("key".into(), "a".into()),
                ("value".into(), "x;y".into())
            ]
        );
        assert!(parse("cmd=x").is_none(), "the last pair ends with ;");
        assert!(parse("=x;").is_none(), "an empty key");
        assert!(parse("cmd;").is_none(), "a pair without =");
        assert_eq!(parse(""), Some(vec![]));
    }

    #[test]
    fn replies_are_framed_with_their_length() {
        let f = frame(&[("cmd", "x-response".into()), ("value", "a;b".into())]);
        let s = String::from_utf8(f).expect("utf-8");
        assert_eq!(s, "26    cmd=x-response;value=a;;b;");
        let mut r = s.as_bytes();
        let back = read_command(&mut r, 1024).expect("reads");
        assert_eq!(parse(&back).expect("parses")[1].1, "a;b");
        let mut short = &b"12    cmd=x;"[..];
        assert!(read_command(&mut short, 1024).is_err(), "truncated");
        let mut big = &b"99999 cmd=x;"[..];
        assert!(read_command(&mut big, 1024)
            .unwrap_err()
            .contains("at most"));
        let mut bad = &b"abcdefcmd=x;"[..];
        assert!(read_command(&mut bad, 1024)
            .unwrap_err()
            .contains("not a number"));
    }
}

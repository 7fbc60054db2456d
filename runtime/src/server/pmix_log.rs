//! `PMIx_Log` of the node's PMIx clients: messages to `PMIX_LOG_STDERR` and
//! `PMIX_LOG_STDOUT` join the process's forwarded output (with `--tag-output`'s prefix,
//! and the time stamp asked for as OpenPMIx and PRRTE write it: `[Fri Nov 27 16:14:45
//! 2026]`); `PMIX_LOG_SYSLOG` and `PMIX_LOG_LOCAL_SYSLOG` were written to the node's
//! syslog by the PMIx library before the host hears of them; any other channel (global
//! syslog, email, the global datastore, ...) is not served: the call fails with
//! `PMIX_ERR_NOT_SUPPORTED` rather than succeed with its message dropped.

use weft_pmix::server::{log_time, Failure, Log, LogChannel};

use super::output::{self, Chunk};
use super::State;

/// Message `text` for `stream` ("stdout" or "stderr") as it is forwarded: whole lines
/// (a last line without its newline gets one), each with time stamp `stamp` and
/// output tag `tag` in front, as `pmix_iof_prep_output` of OpenPMIx arranges them
/// (`[time]<stream>: ` alone, `[time][job,rank]<stream>: ` with the tag).
pub(super) fn log_lines(
    text: &str,
    stamp: Option<&str>,
    tag: Option<&str>,
    stream: &str,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 64);
    for line in text.split_inclusive('\n') {
        if let Some(ts) = stamp {
            out.extend_from_slice(format!("[{ts}]").as_bytes());
            if tag.is_none() {
                out.extend_from_slice(format!("<{stream}>: ").as_bytes());
            }
        }
        if let Some(t) = tag {
            out.extend_from_slice(t.as_bytes());
        }
        out.extend_from_slice(line.as_bytes());
    }
    if !text.ends_with('\n') {
        out.push(b'\n');
    }
    out
}

impl State {
    /// A local client's `PMIx_Log`: each entry to its channel; the status is success
    /// when every channel took its message (with `PMIX_LOG_ONCE`, when one did), else
    /// not supported.
    pub(super) fn pmix_log(&mut self, log: Log) {
        let (Some(px), Some(front)) = (self.job.pmix.as_ref(), self.pmix.as_ref()) else {
            return log.reply.fail(Failure::Other);
        };
        let stamp = log.timestamp.map(log_time).or_else(|| {
            log.timestamp_output.then(|| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64);
                log_time(now)
            })
        });
        let rank = log.source.rank.filter(|_| log.source.nspace == px.nspace);
        let (mut served, mut refused) = (0usize, Vec::new());
        for (channel, text) in &log.entries {
            match channel {
                LogChannel::Stderr | LogChannel::Stdout => {
                    let is_err = *channel == LogChannel::Stderr;
                    let stream = if is_err { "stderr" } else { "stdout" };
                    let tag = rank.and_then(|r| output::output_tag(&self.job.plan, r, stream));
                    if !text.is_empty() {
                        let lines = log_lines(text, stamp.as_deref(), tag.as_deref(), stream);
                        let _ = front.output.send(Chunk::Data(is_err, lines));
                    }
                    served += 1;
                }
                // OpenPMIx's own syslog component wrote these (it runs first, in this
                // process, with PMIX_LOG_SYSLOG_PRI and the time stamp).
                LogChannel::Syslog | LogChannel::LocalSyslog => served += 1,
                LogChannel::GlobalSyslog => refused.push("pmix.log.gsys (global syslog)".into()),
                LogChannel::Other(k) => refused.push(k.clone()),
            }
            if log.once && served > 0 {
                break;
            }
        }
        let taken = refused.is_empty() || (log.once && served > 0);
        if !taken {
            tracing::debug!(
                "PMIx_Log of {:?}: channel(s) {} not served (PMIX_ERR_NOT_SUPPORTED)",
                log.source,
                refused.join(", ")
            );
            return log.reply.fail(Failure::NotSupported);
        }
        log.reply.ok();
    }
}

#[cfg(test)]
mod log_tests {
    use super::log_lines;

    #[test]
    fn plain_tagged_stamped_and_unterminated_messages() {
        let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
        assert_eq!(s(log_lines("hi\n", None, None, "stderr")), "hi\n");
        assert_eq!(s(log_lines("hi", None, None, "stderr")), "hi\n");
        assert_eq!(
            s(log_lines("a\nb\n", None, Some("[j,0]<stderr>: "), "stderr")),
            "[j,0]<stderr>: a\n[j,0]<stderr>: b\n"
        );
        assert_eq!(
            s(log_lines(
                "a\n",
                Some("Fri Nov 27 16:14:45 2026"),
                None,
                "stdout"
            )),
            "[Fri Nov 27 16:14:45 2026]<stdout>: a\n"
        );
        assert_eq!(
            s(log_lines("a", Some("T"), Some("[j,1]<stderr>: "), "stderr")),
            "[T][j,1]<stderr>: a\n"
        );
    }
}

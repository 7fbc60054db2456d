//! The PMIx server in a build without libpmix: [`Server::init`] says it is unavailable;
//! nothing else can exist.

use super::*;

/// Where a result goes (none exists in this build).
#[derive(Debug)]
pub struct ModexReply {
    _none: (),
}

impl ModexReply {
    /// Never called (no reply exists in this build).
    pub fn ok(self, _data: Vec<u8>) {}
    /// Never called (no reply exists in this build).
    pub fn fail(self, _why: Failure) {}
}

/// Where a spawn's result goes (none exists in this build).
#[derive(Debug)]
pub struct SpawnReply {
    _none: (),
}

impl SpawnReply {
    /// Never called (no reply exists in this build).
    pub fn ok(self, _nspace: &str) {}
    /// Never called (no reply exists in this build).
    pub fn fail(self, _why: Failure) {}
}

/// Where a lookup's names go (none exists in this build).
#[derive(Debug)]
pub struct LookupReply {
    _none: (),
}

impl LookupReply {
    /// Never called (no reply exists in this build).
    pub fn found(self, _names: Vec<Found>) {}
    /// Never called (no reply exists in this build).
    pub fn fail(self, _why: Failure) {}
}

/// Where a tool's name goes (none exists in this build).
#[derive(Debug)]
pub struct ToolReply {
    _none: (),
}

impl ToolReply {
    /// Never called (no reply exists in this build).
    pub fn ok(self, _name: ProcName) {}
    /// Never called (no reply exists in this build).
    pub fn fail(self, _why: Failure) {}
}

/// Nothing to load in this build.
pub fn preload() {}

/// Where a group operation's result goes (none exists in this build).
#[derive(Debug)]
pub struct GroupReply {
    _none: (),
}

impl GroupReply {
    /// Never called (no reply exists in this build).
    pub fn ok(self, _context_id: Option<u64>, _endpt: Vec<u8>) {}
    /// Never called (no reply exists in this build).
    pub fn answers(self, _answers: Vec<QueryAnswer>) {}
    /// Never called (no reply exists in this build).
    pub fn fail(self, _why: Failure) {}
}

/// Where a log's or event's status goes (none exists in this build).
#[derive(Debug)]
pub struct OpReply {
    _none: (),
}

impl OpReply {
    /// Never called (no reply exists in this build).
    pub fn ok(self) {}
    /// Never called (no reply exists in this build).
    pub fn fail(self, _why: Failure) {}
}

/// `secs` since the epoch, as a number (this build has no `ctime`).
pub fn log_time(secs: i64) -> String {
    format!("{secs}")
}

/// The PMIx server (this build has no library: [`Server::init`] says so).
#[derive(Debug)]
pub struct Server {
    _none: (),
}

impl Server {
    /// Always [`PmixError::Unavailable`] in this build.
    pub fn init(
        _dir: &std::path::Path,
        _host: std::sync::Arc<dyn Host>,
        _tools: ToolSupport,
    ) -> Result<Server, PmixError> {
        Err(crate::unavailable())
    }
    /// Never called (no server exists in this build).
    pub fn ack_promptly(&self) {}
    /// Never called (no server exists in this build).
    pub fn register_nspace(&self, _ns: &Nspace) -> Result<(), PmixError> {
        Err(crate::unavailable())
    }
    /// Never called (no server exists in this build).
    pub fn register_client(&self, _nspace: &str, _rank: u32) -> Result<(), PmixError> {
        Err(crate::unavailable())
    }
    /// Never called (no server exists in this build).
    pub fn setup_fork(
        &self,
        _nspace: &str,
        _rank: u32,
    ) -> Result<Vec<(String, String)>, PmixError> {
        Err(crate::unavailable())
    }
    /// Never called (no server exists in this build).
    pub fn dmodex_request(
        &self,
        _nspace: &str,
        _rank: u32,
        _done: impl FnOnce(Result<Vec<u8>, Failure>) + Send + 'static,
    ) -> Result<(), PmixError> {
        Err(crate::unavailable())
    }
    /// Never called (no server exists in this build).
    pub fn deregister_nspace(&self, _nspace: &str) {}
    /// Never called (no server exists in this build).
    pub fn notify_packed(
        &self,
        _code: i32,
        _source: &ProcName,
        _range: Range,
        _info: &[u8],
    ) -> Result<(), PmixError> {
        Err(crate::unavailable())
    }
    /// Never called (no server exists in this build).
    pub fn notify_release(&self, _nspace: &str, _ranks: &[u32]) {}
    /// Never called (no server exists in this build).
    pub fn iof_deliver(&self, _nspace: &str, _rank: u32, _stderr: bool, _bytes: Vec<u8>) {}
    /// Never called (no server exists in this build).
    pub fn notify_job_terminated(&self, _to: &ProcName, _nspace: &str, _code: i32) {}
    /// Never called (no server exists in this build).
    pub fn notify_ended(&self, _nspace: &str, _rank: u32, _exit_code: Option<i32>) {}
    /// Never called (no server exists in this build).
    pub fn notify_alloc_complete(
        &self,
        _nspace: &str,
        _rank: u32,
        _alloc_id: &str,
        _session: Option<u32>,
    ) {
    }
}

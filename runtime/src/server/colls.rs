//! Collectives between servers: fences (and the data they carry), their deadlines and failures.

use super::*;

impl State {
    pub(super) fn new_coll(&self, id: &CollId, group: Option<GroupSpec>) -> Coll {
        let job = &self.plan.job;
        let ranks = id.procs.ranks(job.size());
        let mut nodes: Vec<u32> = ranks.iter().map(|&r| job.procs[r as usize].node).collect();
        let assign = group
            .as_ref()
            .is_some_and(|g| g.directives.assign_context_id);
        if id.kind == CollKind::GroupConstruct && assign {
            // The root server takes part to hand out the PGCID in its block.
            nodes.push(0);
        }
        nodes.sort_unstable();
        nodes.dedup();
        let me = nodes.iter().position(|&n| n == self.node).unwrap_or(0);
        let tolerant = group.as_ref().is_some_and(|g| g.directives.tolerant());
        let digest = id.digest();
        Coll {
            digest,
            mode: None,
            local_expected: ranks
                .into_iter()
                .filter(|r| self.procs.contains_key(r))
                // A tolerant group does not wait for members that are already gone.
                .filter(|r| {
                    !tolerant || self.gone.get(r).is_none_or(|g| g.joined.contains(&digest))
                })
                .collect(),
            arrived: BTreeSet::new(),
            waiters: Vec::new(),
            nodes,
            me,
            started: false,
            step: 0,
            sent_step: None,
            blocks: BTreeMap::new(),
            inbox: HashMap::new(),
            deadline: None,
            timing_out: false,
            group,
        }
    }

    pub(super) fn remember_finished(&mut self, id: CollId, error: Option<WireError>) {
        self.finished.insert(id.clone(), error);
        self.finished_order.push_back(id);
        while self.finished_order.len() > 100_000 {
            if let Some(old) = self.finished_order.pop_front() {
                self.finished.remove(&old);
            }
        }
    }

    /// A local process joins collective `id` (a fence or a group operation).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn coll_arrive(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        id: CollId,
        mode: FenceMode,
        timeout_ms: Option<u64>,
        group: Option<GroupSpec>,
    ) {
        let size = self.plan.job.size();
        let op = id.op();
        let bad = match &id.procs {
            Procs::List(v) if v.windows(2).any(|w| w[0] >= w[1]) => {
                Some(format!("participants {v:?} are not sorted and distinct"))
            }
            Procs::List(v) if v.iter().any(|&r| r >= size) => Some(format!(
                "participants {v:?} name ranks outside the job (size {size})"
            )),
            p if !p.contains(rank) => Some(format!("rank {rank} is not among the participants")),
            _ => None,
        };
        if let Some(reason) = bad {
            return self.send_client(
                conn,
                &ServerMsg::Failed {
                    req,
                    error: WireError::Invalid {
                        op: op.into(),
                        reason,
                    },
                },
            );
        }
        match self.finished.get(&id) {
            Some(Some(error)) => {
                let error = error.clone();
                return self.send_client(conn, &ServerMsg::Failed { req, error });
            }
            Some(None) if id.is_group() => {
                let error = WireError::Invalid {
                    op: op.into(),
                    reason: format!(
                        "group {:?}: this operation already completed without rank {rank} (it arrived after the deadline)",
                        id.name
                    ),
                };
                return self.send_client(conn, &ServerMsg::Failed { req, error });
            }
            _ => {}
        }
        if !self.colls.contains_key(&id) {
            let c = self.new_coll(&id, group.clone());
            self.colls.insert(id.clone(), c);
        }
        let c = &self.colls[&id];
        if c.arrived.contains(&rank) || (c.started && !c.local_expected.contains(&rank)) {
            let reason = if c.arrived.contains(&rank) {
                format!("rank {rank} joined it twice (the same id used twice concurrently?)")
            } else {
                format!("this node's part completed without rank {rank} (it arrived after the deadline)")
            };
            let error = WireError::Invalid {
                op: format!("{op} {:?}", id.name),
                reason,
            };
            return self.send_client(conn, &ServerMsg::Failed { req, error });
        }
        let digest = c.digest;
        let tolerant = c.group.as_ref().is_some_and(|g| g.directives.tolerant());
        if let Some(p) = self.procs.get_mut(&rank) {
            p.joined.push_back(digest);
            if p.joined.len() > JOINED_HISTORY {
                p.joined.pop_front();
            }
        }
        // A participant that is gone and never joined dooms the collective (unless the
        // group tolerates it: then it was left out of `local_expected`).
        let dead = self
            .gone
            .iter()
            .filter(|(r, g)| !tolerant && id.procs.contains(**r) && !g.joined.contains(&digest))
            // The first death this server learned of: the root cause (later ones, such as
            // peers that finalized because of it, follow from it).
            .min_by_key(|(_, g)| g.order)
            .map(|(r, g)| (*r, g.reason.clone()));
        let c = self.colls.get_mut(&id).expect("just inserted");
        c.waiters.push((conn, req));
        if let Some((dead_rank, reason)) = dead {
            let error = WireError::ProcGone {
                op: op.into(),
                rank: dead_rank,
                reason,
            };
            return self.fail_coll(&id, error, true);
        }
        if let Some(m) = c.mode {
            if m != mode {
                let error = WireError::Invalid {
                    op: op.into(),
                    reason: format!(
                        "rank {rank} asked for mode {mode:?} but others asked for {m:?}"
                    ),
                };
                return self.fail_coll(&id, error, true);
            }
        }
        if let (Some(mine), Some(theirs)) = (&group, &c.group) {
            if mine.directives != theirs.directives {
                let error = WireError::Invalid {
                    op: format!("{op} {:?}", id.name),
                    reason: format!(
                        "rank {rank} gave directives {:?} but others gave {:?}",
                        mine.directives, theirs.directives
                    ),
                };
                return self.fail_coll(&id, error, true);
            }
        }
        c.mode = Some(mode);
        c.arrived.insert(rank);
        if let Some(ms) = timeout_ms {
            self.arm_deadline(&id, ms);
        }
        self.maybe_start(&id);
    }

    /// Sets collective `id`'s deadline `ms` from now, if that is earlier than its own.
    pub(super) fn arm_deadline(&mut self, id: &CollId, ms: u64) {
        let Some(c) = self.colls.get_mut(id) else {
            return;
        };
        let Some(d) = Instant::now().checked_add(Duration::from_millis(ms)) else {
            return;
        };
        if c.deadline.is_none_or(|old| d < old) {
            c.deadline = Some(d);
            let ev = self.ev.clone();
            let id2 = id.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(d).await;
                let _ = ev.send(Event::CollTimeout { id: id2 });
            });
        }
    }

    /// Starts the inter-node part of `id` once every expected local process has joined.
    pub(super) fn maybe_start(&mut self, id: &CollId) {
        let Some(c) = self.colls.get(id) else {
            return;
        };
        if c.started || !c.local_expected.is_subset(&c.arrived) {
            return;
        }
        let mode = c.mode.unwrap_or(FenceMode::SyncOnly);
        let block = match id.kind {
            // Every mode carries the participants' generations (so that other nodes learn
            // which of their copies are older); Full carries the data too.
            CollKind::Fence => {
                let data: ProcData = c
                    .local_expected
                    .iter()
                    .map(|&r| self.proc_block(r, mode == FenceMode::Full))
                    .collect();
                postcard::to_stdvec(&data).expect("encode")
            }
            CollKind::GroupDestruct => Vec::new(),
            CollKind::GroupConstruct => {
                let joined: Vec<Rank> = c.arrived.iter().copied().collect();
                let data: ProcData = joined
                    .iter()
                    .map(|&r| self.proc_block(r, mode == FenceMode::Full))
                    .collect();
                let assign = c
                    .group
                    .as_ref()
                    .is_some_and(|g| g.directives.assign_context_id);
                let pgcid = (assign && self.node == 0).then(|| {
                    let p = self.next_pgcid;
                    self.next_pgcid += 1;
                    p
                });
                postcard::to_stdvec(&GroupBlock {
                    joined,
                    data,
                    pgcid,
                })
                .expect("encode")
            }
        };
        let c = self.colls.get_mut(id).expect("exists");
        c.blocks.insert(self.node, block);
        c.started = true;
        self.advance(id);
    }

    /// Drives the Bruck all-gather of collective `id` as far as received data allows.
    pub(super) fn advance(&mut self, id: &CollId) {
        loop {
            let Some(c) = self.colls.get_mut(id) else {
                return;
            };
            if !c.started {
                return;
            }
            let n = c.nodes.len();
            let dist = 1usize << c.step;
            if dist >= n {
                return self.complete(id);
            }
            if c.sent_step != Some(c.step) {
                let cnt = dist.min(n - dist);
                let to = c.nodes[(c.me + n - dist) % n];
                let blocks: Vec<(u32, Vec<u8>)> = (0..cnt)
                    .filter_map(|j| {
                        let node = c.nodes[(c.me + j) % n];
                        c.blocks.get(&node).map(|b| (node, b.clone()))
                    })
                    .collect();
                c.sent_step = Some(c.step);
                let mode = c.mode.unwrap_or(FenceMode::SyncOnly);
                let group = c.group.as_ref().map(|g| GroupSpec {
                    directives: g.directives.clone(),
                    timeout_ms: c.deadline.map(|d| {
                        let left = d.saturating_duration_since(Instant::now());
                        u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
                    }),
                });
                let msg = PeerMsg::Gather {
                    id: id.clone(),
                    mode,
                    step: c.step,
                    blocks,
                    group,
                };
                self.send_peer(to, &msg);
                continue;
            }
            let Some(got) = c.inbox.remove(&c.step) else {
                return;
            };
            for (node, b) in got {
                c.blocks.insert(node, b);
            }
            c.step += 1;
        }
    }

    pub(super) fn complete(&mut self, id: &CollId) {
        let Some(c) = self.colls.remove(id) else {
            return;
        };
        let mut err = None;
        let mut record = None;
        match id.kind {
            CollKind::Fence => {
                for (node, b) in &c.blocks {
                    if *node == self.node {
                        continue;
                    }
                    match postcard::from_bytes::<ProcData>(b) {
                        Ok(data) => self.learn_remote(data),
                        Err(e) => {
                            err = Some(WireError::Invalid {
                                op: "fence".into(),
                                reason: format!("corrupt data block from node {node}: {e}"),
                            })
                        }
                    }
                }
            }
            CollKind::GroupConstruct => match self.group_result(id, &c) {
                Ok(r) => record = Some(r),
                Err(e) => err = Some(e),
            },
            CollKind::GroupDestruct => {
                self.groups.remove(&id.name);
            }
        }
        for (conn, req) in &c.waiters {
            let msg = match (&err, &record) {
                (Some(e), _) => ServerMsg::Failed {
                    req: *req,
                    error: e.clone(),
                },
                (None, Some(g)) => ServerMsg::Group {
                    req: *req,
                    group: g.clone(),
                },
                (None, None) => ServerMsg::Done { req: *req },
            };
            self.send_client(*conn, &msg);
        }
        self.remember_finished(id.clone(), err);
    }

    /// What a collective carried of other nodes' participants.
    pub(super) fn learn_remote(&mut self, data: ProcData) {
        self.pmi_learn(&data);
        for (rank, gen, entries) in data {
            if rank < self.plan.job.size() {
                let acts = self.modex.learn(rank, gen, entries);
                self.apply(acts);
            }
        }
    }

    /// Fails collective `id` everywhere because its participants disagree (`reason`).
    pub(super) fn fail_disagreement(&mut self, id: &CollId, reason: String) {
        let error = WireError::Invalid {
            op: id.op().into(),
            reason,
        };
        self.fail_coll(id, error, true);
    }

    pub(super) fn fail_coll(&mut self, id: &CollId, error: WireError, broadcast: bool) {
        if let Some(c) = self.colls.remove(id) {
            for (conn, req) in &c.waiters {
                self.send_client(
                    *conn,
                    &ServerMsg::Failed {
                        req: *req,
                        error: error.clone(),
                    },
                );
            }
            if broadcast {
                let me = self.node;
                for &n in c.nodes.iter().filter(|&&n| n != me) {
                    self.send_peer(
                        n,
                        &PeerMsg::Abort {
                            id: id.clone(),
                            error: error.clone(),
                        },
                    );
                }
            }
        } else if broadcast {
            let nodes = self.new_coll(id, None).nodes;
            let me = self.node;
            for n in nodes.into_iter().filter(|&n| n != me) {
                self.send_peer(
                    n,
                    &PeerMsg::Abort {
                        id: id.clone(),
                        error: error.clone(),
                    },
                );
            }
        }
        self.remember_finished(id.clone(), Some(error));
    }

    pub(super) fn coll_timeout(&mut self, id: CollId) {
        let Some(c) = self.colls.get_mut(&id) else {
            return;
        };
        if c.timing_out || c.deadline.is_none_or(|d| d > Instant::now()) {
            return;
        }
        if c.group.as_ref().is_some_and(|g| g.directives.optional) {
            // An optional group goes on with the members that joined in time.
            if !c.started {
                c.local_expected = c.arrived.clone();
                let id2 = id.clone();
                self.maybe_start(&id2);
            }
            return;
        }
        c.timing_out = true;
        let missing: BTreeSet<Rank> = c.local_expected.difference(&c.arrived).copied().collect();
        let others: HashSet<u32> = c
            .nodes
            .iter()
            .copied()
            .filter(|&n| n != self.node)
            .collect();
        let qid = self.next_qid;
        self.next_qid += 1;
        for &n in &others {
            self.send_peer(
                n,
                &PeerMsg::ArrivalQuery {
                    id: id.clone(),
                    qid,
                },
            );
        }
        self.queries.insert(
            qid,
            Query {
                id,
                waiting: others,
                missing,
            },
        );
        after(&self.ev, ARRIVAL_QUERY_WAIT, Event::QueryTimeout { qid });
        self.maybe_finish_query(qid);
    }
}

//! Checks every collective against references computed with point-to-point messages:
//! run with `weft run -n N [--nodes M] target/release/coll_check`.
//!
//! On the world communicator, on the halves of a split (and a split with the ranks
//! reversed by key), on a dup and on the node-local communicator of `split_type`, for
//! counts from 0 to `--max` elements (default 65536 u64s: 512 KiB), it runs barrier,
//! bcast, reduce, allreduce (built-in, in-place and a non-commutative user operation),
//! gather(v), scatter(v), allgather(v), alltoall(v), reduce_scatter_block, scan, exscan
//! (and the in-place forms of reduce, allreduce, gather, scatter, allgather(v),
//! alltoall(v), reduce_scatter_block, scan and exscan), then every non-blocking form
//! (in place too) started at once beside point-to-point messages. Every rank's inputs are exchanged
//! with plain sends and receives, the expected results computed locally and compared.
//! Each rank prints `rank R coll ok` and exits 0, or names the first mismatch and exits 1.

use weft::prelude::*;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The reference exchange's tag (point-to-point, never seen by collectives).
const REF_TAG: Tag = Tag(0x5eed);

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Rank `r`'s input element `i` for test `seed`.
fn val(seed: u64, r: u32, i: usize) -> u64 {
    splitmix(seed ^ (u64::from(r) << 40) ^ i as u64)
}

/// A 2x2 matrix of u16 (mod 2^16) packed in a u64; multiplication is associative and
/// not commutative: the non-commutative reduction of the check.
fn mat_mul(a: u64, b: u64) -> u64 {
    let u = |m: u64, k: u32| (m >> (16 * k)) as u16;
    let (a0, a1, a2, a3) = (u(a, 0), u(a, 1), u(a, 2), u(a, 3));
    let (b0, b1, b2, b3) = (u(b, 0), u(b, 1), u(b, 2), u(b, 3));
    let c0 = a0.wrapping_mul(b0).wrapping_add(a1.wrapping_mul(b2));
    let c1 = a0.wrapping_mul(b1).wrapping_add(a1.wrapping_mul(b3));
    let c2 = a2.wrapping_mul(b0).wrapping_add(a3.wrapping_mul(b2));
    let c3 = a2.wrapping_mul(b1).wrapping_add(a3.wrapping_mul(b3));
    u64::from(c0) | u64::from(c1) << 16 | u64::from(c2) << 32 | u64::from(c3) << 48
}

fn matmul_op() -> Op<u64> {
    Op::user(
        |i: &[u64], o: &mut [u64]| {
            for (o, &i) in o.iter_mut().zip(i) {
                *o = mat_mul(i, *o);
            }
        },
        false,
    )
}

/// Every member's vector, exchanged with point-to-point messages only.
fn exchange(comm: &Communicator, mine: &[u64]) -> Res<Vec<Vec<u64>>> {
    let (n, me) = (comm.size(), comm.rank());
    let mut lens = vec![[0u64]; n as usize];
    let my_len = [mine.len() as u64];
    let my_len = &my_len;
    comm.scope(|s| -> Res<()> {
        let mut reqs = Vec::new();
        for (r, l) in lens.iter_mut().enumerate() {
            if r as u32 != me {
                reqs.push(s.irecv(l, Source::Rank(r as u32), REF_TAG)?);
                reqs.push(s.isend(my_len, r as u32, REF_TAG)?);
            }
        }
        wait_all(reqs)?;
        Ok(())
    })?;
    let mut all: Vec<Vec<u64>> = lens.iter().map(|l| vec![0; l[0] as usize]).collect();
    all[me as usize] = mine.to_vec();
    comm.scope(|s| -> Res<()> {
        let mut reqs = Vec::new();
        for (r, v) in all.iter_mut().enumerate() {
            if r as u32 != me {
                reqs.push(s.irecv(v, Source::Rank(r as u32), REF_TAG)?);
                reqs.push(s.isend(mine, r as u32, REF_TAG)?);
            }
        }
        wait_all(reqs)?;
        Ok(())
    })?;
    Ok(all)
}

fn expect(what: &str, got: &[u64], want: &[u64]) -> Res<()> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} elements, expected {}", got.len(), want.len()).into());
    }
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        return Err(format!(
            "{what}: element {i} is {:#x}, expected {:#x}",
            got[i], want[i]
        )
        .into());
    }
    Ok(())
}

/// Elementwise fold over the members' vectors in rank order.
fn fold(all: &[Vec<u64>], upto: usize, f: impl Fn(u64, u64) -> u64) -> Vec<u64> {
    let mut acc = all[0].clone();
    for v in &all[1..upto] {
        for (a, &x) in acc.iter_mut().zip(v) {
            *a = f(*a, x);
        }
    }
    acc
}

/// The v-variants' uneven blocks: rank r has `(count + r) % 5 + r` elements, with a
/// gap of one element between blocks. Returns (counts, displacements, span).
fn uneven(count: usize, n: usize) -> (Vec<usize>, Vec<usize>, usize) {
    let counts: Vec<usize> = (0..n).map(|r| (count + r) % 5 + r).collect();
    let displs = offsets(&counts, 1);
    let span = displs[n - 1] + counts[n - 1];
    (counts, displs, span)
}

/// Displacements of consecutive blocks of `counts` with `gap` elements between them.
fn offsets(counts: &[usize], gap: usize) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |d, &c| {
            let x = *d;
            *d += c + gap;
            Some(x)
        })
        .collect()
}

/// alltoallv's counts at rank `me`: it exchanges `(me + j) % 3` elements with rank j
/// both ways (symmetric, so the in-place form applies too).
fn pair_counts(me: usize, n: usize) -> (Vec<usize>, Vec<usize>) {
    let c: Vec<usize> = (0..n).map(|j| (me + j) % 3).collect();
    let d = offsets(&c, 0);
    (c, d)
}

struct Checker<'a> {
    comm: &'a Communicator,
    name: String,
    seed: u64,
}

impl Checker<'_> {
    fn next_seed(&mut self) -> u64 {
        self.seed = splitmix(self.seed);
        self.seed
    }

    fn input(&mut self, count: usize) -> (u64, Vec<u64>) {
        let seed = self.next_seed();
        let me = self.comm.rank();
        (seed, (0..count).map(|i| val(seed, me, i)).collect())
    }

    fn run(&mut self, count: usize) -> Res<()> {
        let c = self.comm;
        let (n, me) = (c.size(), c.rank());
        let nu = n as usize;
        let name = self.name.clone();
        let tag = |op: &str| format!("{name} count {count}: {op}");
        c.barrier()?;

        // bcast from several roots.
        for root in [0, n - 1, n / 2] {
            let (seed, _) = self.input(0);
            let want: Vec<u64> = (0..count).map(|i| val(seed, root, i)).collect();
            let mut buf = if me == root {
                want.clone()
            } else {
                vec![0; count]
            };
            c.bcast(&mut buf, root)?;
            expect(&tag(&format!("bcast root {root}")), &buf, &want)?;
        }

        // reduce (sum, non-commutative) and allreduce.
        let (_, mine) = self.input(count);
        let all = exchange(c, &mine)?;
        let sum = fold(&all, nu, u64::wrapping_add);
        let prod = fold(&all, nu, mat_mul);
        let max = fold(&all, nu, u64::max);
        for root in [0, n - 1] {
            let mut out = vec![0; if me == root { count } else { 0 }];
            c.reduce(&mine, &mut out, Op::Sum, root)?;
            if me == root {
                expect(&tag(&format!("reduce sum root {root}")), &out, &sum)?;
            }
            let mut out = vec![0; if me == root { count } else { 0 }];
            c.reduce(&mine, &mut out, matmul_op(), root)?;
            if me == root {
                expect(&tag(&format!("reduce user root {root}")), &out, &prod)?;
            }
        }
        let mut inplace = mine.clone();
        c.reduce_in_place(&mut inplace, Op::Sum, n - 1)?;
        if me == n - 1 {
            expect(&tag("reduce in place"), &inplace, &sum)?;
        }
        let mut out = vec![0; count];
        c.allreduce(&mine, &mut out, Op::Sum)?;
        expect(&tag("allreduce sum"), &out, &sum)?;
        c.allreduce(&mine, &mut out, Op::Max)?;
        expect(&tag("allreduce max"), &out, &max)?;
        c.allreduce(&mine, &mut out, matmul_op())?;
        expect(&tag("allreduce user"), &out, &prod)?;
        let mut inplace = mine.clone();
        c.allreduce_in_place(&mut inplace, Op::Sum)?;
        expect(&tag("allreduce in place"), &inplace, &sum)?;

        // scan and exscan.
        c.scan(&mine, &mut out, Op::Sum)?;
        expect(
            &tag("scan sum"),
            &out,
            &fold(&all, me as usize + 1, u64::wrapping_add),
        )?;
        c.scan(&mine, &mut out, matmul_op())?;
        expect(
            &tag("scan user"),
            &out,
            &fold(&all, me as usize + 1, mat_mul),
        )?;
        let mut ex = vec![7; count];
        c.exscan(&mine, &mut ex, matmul_op())?;
        if me > 0 {
            expect(&tag("exscan user"), &ex, &fold(&all, me as usize, mat_mul))?;
        } else {
            expect(&tag("exscan leaves rank 0"), &ex, &vec![7; count])?;
        }
        let mut sip = mine.clone();
        c.scan_in_place(&mut sip, matmul_op())?;
        expect(
            &tag("scan in place"),
            &sip,
            &fold(&all, me as usize + 1, mat_mul),
        )?;
        let mut exip = mine.clone();
        c.exscan_in_place(&mut exip, Op::Sum)?;
        if me > 0 {
            expect(
                &tag("exscan in place"),
                &exip,
                &fold(&all, me as usize, u64::wrapping_add),
            )?;
        } else {
            expect(&tag("exscan in place leaves rank 0"), &exip, &mine)?;
        }

        // gather, scatter, allgather, alltoall with equal blocks.
        let block = count / nu.max(1) + 1;
        let (seed, mine) = self.input(block);
        let every: Vec<u64> = (0..n)
            .flat_map(|r| (0..block).map(move |i| val(seed, r, i)))
            .collect();
        for root in [0, n - 1] {
            let mut g = vec![0; if me == root { block * nu } else { 0 }];
            c.gather(&mine, &mut g, root)?;
            if me == root {
                expect(&tag(&format!("gather root {root}")), &g, &every)?;
            }
            let mut sc = vec![0; block];
            let src = if me == root {
                every.clone()
            } else {
                Vec::new()
            };
            c.scatter(&src, &mut sc, root)?;
            expect(&tag(&format!("scatter root {root}")), &sc, &mine)?;
            // In place at the root (its block already there / staying in the source).
            if me == root {
                let mut gi = vec![0; block * nu];
                gi[me as usize * block..][..block].copy_from_slice(&mine);
                c.gather_in_place(&mut gi, root)?;
                expect(&tag(&format!("gather in place root {root}")), &gi, &every)?;
                c.scatter_in_place(&every, root)?;
            } else {
                c.gather(&mine, &mut [], root)?;
                let mut si = vec![0; block];
                c.scatter(&[], &mut si, root)?;
                expect(&tag(&format!("scatter in place root {root}")), &si, &mine)?;
            }
        }
        let mut ag = vec![0; block * nu];
        c.allgather(&mine, &mut ag)?;
        expect(&tag("allgather"), &ag, &every)?;
        let mut agi = vec![0; block * nu];
        agi[me as usize * block..][..block].copy_from_slice(&mine);
        c.allgather_in_place(&mut agi)?;
        expect(&tag("allgather in place"), &agi, &every)?;

        // alltoall: rank r's block j is val(seed, r, j*block + i).
        let (seed, a2a) = self.input(block * nu);
        let mut got = vec![0; block * nu];
        c.alltoall(&a2a, &mut got)?;
        let want: Vec<u64> = (0..n)
            .flat_map(|r| (0..block).map(move |i| val(seed, r, me as usize * block + i)))
            .collect();
        expect(&tag("alltoall"), &got, &want)?;
        let mut a2ai = a2a.clone();
        c.alltoall_in_place(&mut a2ai)?;
        expect(&tag("alltoall in place"), &a2ai, &want)?;

        // reduce_scatter_block: sum and the non-commutative op.
        let (_, rs_in) = self.input(block * nu);
        let all = exchange(c, &rs_in)?;
        let mut rs = vec![0; block];
        c.reduce_scatter_block(&rs_in, &mut rs, Op::Sum)?;
        let total = fold(&all, nu, u64::wrapping_add);
        expect(
            &tag("reduce_scatter_block sum"),
            &rs,
            &total[me as usize * block..][..block],
        )?;
        c.reduce_scatter_block(&rs_in, &mut rs, matmul_op())?;
        let total = fold(&all, nu, mat_mul);
        expect(
            &tag("reduce_scatter_block user"),
            &rs,
            &total[me as usize * block..][..block],
        )?;
        let mut rsi = rs_in.clone();
        c.reduce_scatter_block_in_place(&mut rsi, matmul_op())?;
        expect(
            &tag("reduce_scatter_block in place"),
            &rsi[..block],
            &total[me as usize * block..][..block],
        )?;

        // v-variants with uneven counts.
        let (counts, displs, span) = uneven(count, nu);
        let (seed, _) = self.input(0);
        let mine: Vec<u64> = (0..counts[me as usize]).map(|i| val(seed, me, i)).collect();
        let mut want = vec![0u64; span];
        for r in 0..nu {
            for i in 0..counts[r] {
                want[displs[r] + i] = val(seed, r as u32, i);
            }
        }
        let root = n / 2;
        let mut g = vec![0; if me == root { span } else { 0 }];
        c.gatherv(&mine, &mut g, &counts, &displs, root)?;
        if me == root {
            expect(&tag("gatherv"), &g, &want)?;
        }
        let mut sv = vec![0; counts[me as usize]];
        let src = if me == root { want.clone() } else { Vec::new() };
        c.scatterv(&src, &counts, &displs, &mut sv, root)?;
        expect(&tag("scatterv"), &sv, &mine)?;
        let mut agv = vec![0; span];
        c.allgatherv(&mine, &mut agv, &counts, &displs)?;
        expect(&tag("allgatherv"), &agv, &want)?;
        // In place: the gaps stay as they were (zero).
        let mut agvi = vec![0; span];
        agvi[displs[me as usize]..][..mine.len()].copy_from_slice(&mine);
        c.allgatherv_in_place(&mut agvi, &counts, &displs)?;
        expect(&tag("allgatherv in place"), &agvi, &want)?;

        // alltoallv: rank r exchanges (r + j) % 3 elements with rank j.
        let (pc, pd) = pair_counts(me as usize, nu);
        let (seed, _) = self.input(0);
        let send: Vec<u64> = (0..nu)
            .flat_map(|j| (0..pc[j]).map(move |i| val(seed, me, j * 8 + i)))
            .collect();
        let mut recv = vec![0; pc.iter().sum()];
        c.alltoallv(&send, &pc, &pd, &mut recv, &pc, &pd)?;
        let want: Vec<u64> = (0..nu)
            .flat_map(|r| (0..pc[r]).map(move |i| val(seed, r as u32, me as usize * 8 + i)))
            .collect();
        expect(&tag("alltoallv"), &recv, &want)?;
        let mut a2avi = send.clone();
        c.alltoallv_in_place(&mut a2avi, &pc, &pd)?;
        expect(&tag("alltoallv in place"), &a2avi, &want)?;

        self.run_nonblocking(count)
    }

    /// Every non-blocking collective at once in one scope beside point-to-point
    /// messages (started in the same order everywhere, completed in whatever order they
    /// finish), checked against the same references as the blocking forms.
    fn run_nonblocking(&mut self, count: usize) -> Res<()> {
        let c = self.comm;
        let (n, me) = (c.size(), c.rank());
        let (nu, mu) = (n as usize, me as usize);
        let name = self.name.clone();
        let tag = |op: &str| format!("{name} count {count}: {op} (non-blocking)");
        let root = n - 1;
        let is_root = me == root;
        let at_root = |len: usize| if is_root { len } else { 0 };

        // Vectors: bcast, reduce, allreduce, scan, exscan.
        let (_, mine) = self.input(count);
        let all = exchange(c, &mine)?;
        let sum = fold(&all, nu, u64::wrapping_add);
        let prod = fold(&all, nu, mat_mul);
        let (seed, _) = self.input(0);
        let bwant: Vec<u64> = (0..count).map(|i| val(seed, root, i)).collect();
        let mut bbuf = if is_root {
            bwant.clone()
        } else {
            vec![0; count]
        };
        let mut red = vec![0; at_root(count)];
        let mut red_ip = mine.clone();
        let mut ared = vec![0; count];
        let mut ared_ip = mine.clone();
        let mut scan = vec![0; count];
        let mut scan_ip = mine.clone();
        let mut ex = vec![7; count];
        let mut ex_ip = mine.clone();

        // Equal blocks: gather, scatter, allgather, alltoall, reduce_scatter_block.
        let block = count / nu + 1;
        let (seed, blk) = self.input(block);
        let every: Vec<u64> = (0..n)
            .flat_map(|r| (0..block).map(move |i| val(seed, r, i)))
            .collect();
        let mut g = vec![0; at_root(block * nu)];
        let mut g_ip = vec![0; at_root(block * nu)];
        if is_root {
            g_ip[mu * block..][..block].copy_from_slice(&blk);
        }
        let src = if is_root { every.clone() } else { Vec::new() };
        let mut sc = vec![0; block];
        let mut sc_ip = vec![0; if is_root { 0 } else { block }];
        let mut ag = vec![0; block * nu];
        let mut ag_ip = vec![0; block * nu];
        ag_ip[mu * block..][..block].copy_from_slice(&blk);
        let (seed, a2a) = self.input(block * nu);
        let a2a_want: Vec<u64> = (0..n)
            .flat_map(|r| (0..block).map(move |i| val(seed, r, mu * block + i)))
            .collect();
        let mut a2 = vec![0; block * nu];
        let mut a2_ip = a2a.clone();
        let (_, rs_in) = self.input(block * nu);
        let rs_total = fold(&exchange(c, &rs_in)?, nu, mat_mul);
        let mut rs = vec![0; block];
        let mut rs_ip = rs_in.clone();

        // The v-variants.
        let (counts, displs, span) = uneven(count, nu);
        let (seed, _) = self.input(0);
        let vmine: Vec<u64> = (0..counts[mu]).map(|i| val(seed, me, i)).collect();
        let mut vwant = vec![0u64; span];
        for r in 0..nu {
            for i in 0..counts[r] {
                vwant[displs[r] + i] = val(seed, r as u32, i);
            }
        }
        let vsrc = if is_root { vwant.clone() } else { Vec::new() };
        let mut gv = vec![0; at_root(span)];
        let mut sv = vec![0; counts[mu]];
        let mut agv = vec![0; span];
        let mut agv_ip = vec![0; span];
        agv_ip[displs[mu]..][..vmine.len()].copy_from_slice(&vmine);
        let (pc, pd) = pair_counts(mu, nu);
        let (seed, _) = self.input(0);
        let a2v_send: Vec<u64> = (0..nu)
            .flat_map(|j| (0..pc[j]).map(move |i| val(seed, me, j * 8 + i)))
            .collect();
        let a2v_want: Vec<u64> = (0..nu)
            .flat_map(|r| (0..pc[r]).map(move |i| val(seed, r as u32, mu * 8 + i)))
            .collect();
        let mut a2v = vec![0; a2v_send.len()];
        let mut a2v_ip = a2v_send.clone();

        let token = [u64::from(me)];
        let mut left = [0u64];
        c.scope(|s| -> Res<()> {
            let mut reqs = vec![
                s.ibarrier()?,
                s.irecv(&mut left, Source::Rank((me + n - 1) % n), Tag(3))?,
                s.ibcast(&mut bbuf, root)?,
                s.ireduce(&mine, &mut red, matmul_op(), root)?,
                s.ireduce_in_place(&mut red_ip, Op::Sum, root)?,
                s.iallreduce(&mine, &mut ared, Op::Sum)?,
                s.isend(&token, (me + 1) % n, Tag(3))?,
                s.iallreduce_in_place(&mut ared_ip, matmul_op())?,
                s.iscan(&mine, &mut scan, matmul_op())?,
                s.iscan_in_place(&mut scan_ip, Op::Sum)?,
                s.iexscan(&mine, &mut ex, Op::Sum)?,
                s.iexscan_in_place(&mut ex_ip, matmul_op())?,
                s.igather(&blk, &mut g, root)?,
            ];
            reqs.push(if is_root {
                s.igather_in_place(&mut g_ip, root)?
            } else {
                s.igather(&blk, &mut [], root)?
            });
            reqs.push(s.iscatter(&src, &mut sc, root)?);
            reqs.push(if is_root {
                s.iscatter_in_place(&src, root)?
            } else {
                s.iscatter(&[], &mut sc_ip, root)?
            });
            reqs.push(s.iallgather(&blk, &mut ag)?);
            reqs.push(s.iallgather_in_place(&mut ag_ip)?);
            reqs.push(s.ialltoall(&a2a, &mut a2)?);
            reqs.push(s.ialltoall_in_place(&mut a2_ip)?);
            reqs.push(s.ireduce_scatter_block(&rs_in, &mut rs, matmul_op())?);
            reqs.push(s.ireduce_scatter_block_in_place(&mut rs_ip, matmul_op())?);
            reqs.push(s.igatherv(&vmine, &mut gv, &counts, &displs, root)?);
            reqs.push(s.iscatterv(&vsrc, &counts, &displs, &mut sv, root)?);
            reqs.push(s.iallgatherv(&vmine, &mut agv, &counts, &displs)?);
            reqs.push(s.iallgatherv_in_place(&mut agv_ip, &counts, &displs)?);
            reqs.push(s.ialltoallv(&a2v_send, &pc, &pd, &mut a2v, &pc, &pd)?);
            reqs.push(s.ialltoallv_in_place(&mut a2v_ip, &pc, &pd)?);
            while !reqs.is_empty() {
                let (_, r) = wait_any(&mut reqs);
                r?;
            }
            Ok(())
        })?;

        expect(&tag("ibcast"), &bbuf, &bwant)?;
        if is_root {
            expect(&tag("ireduce user"), &red, &prod)?;
            expect(&tag("ireduce in place"), &red_ip, &sum)?;
            expect(&tag("igather"), &g, &every)?;
            expect(&tag("igather in place"), &g_ip, &every)?;
            expect(&tag("igatherv"), &gv, &vwant)?;
        } else {
            expect(&tag("iscatter in place"), &sc_ip, &blk)?;
        }
        expect(&tag("iallreduce"), &ared, &sum)?;
        expect(&tag("iallreduce in place user"), &ared_ip, &prod)?;
        expect(&tag("iscan user"), &scan, &fold(&all, mu + 1, mat_mul))?;
        expect(
            &tag("iscan in place"),
            &scan_ip,
            &fold(&all, mu + 1, u64::wrapping_add),
        )?;
        if me > 0 {
            expect(&tag("iexscan"), &ex, &fold(&all, mu, u64::wrapping_add))?;
            expect(
                &tag("iexscan in place user"),
                &ex_ip,
                &fold(&all, mu, mat_mul),
            )?;
        } else {
            expect(&tag("iexscan leaves rank 0"), &ex, &vec![7; count])?;
            expect(&tag("iexscan in place leaves rank 0"), &ex_ip, &mine)?;
        }
        expect(&tag("iscatter"), &sc, &blk)?;
        expect(&tag("iallgather"), &ag, &every)?;
        expect(&tag("iallgather in place"), &ag_ip, &every)?;
        expect(&tag("ialltoall"), &a2, &a2a_want)?;
        expect(&tag("ialltoall in place"), &a2_ip, &a2a_want)?;
        let my_rs = &rs_total[mu * block..][..block];
        expect(&tag("ireduce_scatter_block user"), &rs, my_rs)?;
        expect(
            &tag("ireduce_scatter_block in place user"),
            &rs_ip[..block],
            my_rs,
        )?;
        expect(&tag("iscatterv"), &sv, &vmine)?;
        expect(&tag("iallgatherv"), &agv, &vwant)?;
        expect(&tag("iallgatherv in place"), &agv_ip, &vwant)?;
        expect(&tag("ialltoallv"), &a2v, &a2v_want)?;
        expect(&tag("ialltoallv in place"), &a2v_ip, &a2v_want)?;
        expect(
            &tag("isend beside collectives"),
            &left,
            &[u64::from((me + n - 1) % n)],
        )?;
        Ok(())
    }
}

fn check(comm: &Communicator, name: &str, counts: &[usize]) -> Res<()> {
    let mut ch = Checker {
        comm,
        name: format!("{name} (rank {} of {})", comm.rank(), comm.size()),
        seed: splitmix(comm.size() as u64 ^ 0xc011),
    };
    for &count in counts {
        ch.run(count)?;
    }
    Ok(())
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("coll_check: {e}");
        std::process::exit(1);
    }
}

fn real_main() -> Res<()> {
    let mut max = 65536usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--max" => max = args.next().ok_or("--max N")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let mut counts = vec![0usize, 1, 2, 3, 7, 64, 1000];
    let mut c = 4096;
    while c <= max {
        counts.push(c);
        c *= 4;
    }
    counts.retain(|&c| c <= max);
    // The largest size asked for is always among them.
    if counts.last() != Some(&max) {
        counts.push(max);
    }
    let fabric = Fabric::init()?;
    let world = fabric.world();
    let me = world.rank();
    check(&world, "world", &counts)?;
    let small: Vec<usize> = counts.iter().copied().filter(|&c| c <= 4096).collect();
    let half = world
        .split(Some(me % 2), 0)?
        .ok_or("split gave no communicator")?;
    check(&half, "split by parity", &small)?;
    let rev = world
        .split(Some(0), -(me as i32))?
        .ok_or("split gave no communicator")?;
    if rev.rank() != world.size() - 1 - me {
        return Err(format!(
            "split by reversed key: rank {} here, expected {}",
            rev.rank(),
            world.size() - 1 - me
        )
        .into());
    }
    check(&rev, "split reversed", &small)?;
    let none = world.split(None, 0)?;
    if none.is_some() {
        return Err("split with no color gave a communicator".into());
    }
    let dup = world.dup()?;
    if dup.context_id() == world.context_id() || dup.context_id() == half.context_id() {
        return Err("dup reused a context id".into());
    }
    check(&dup, "dup", &small)?;
    let node = world.split_type(SplitType::Shared, 0)?;
    check(&node, "node", &small)?;
    // Collectives on two communicators at once from two threads.
    std::thread::scope(|s| -> Res<()> {
        let t = s.spawn(|| check(&dup, "dup (thread)", &[0, 5, 3000]).map_err(|e| e.to_string()));
        check(&half, "split by parity (beside a thread)", &[0, 5, 3000])?;
        t.join().map_err(|_| "thread panicked")??;
        Ok(())
    })?;
    world.barrier()?;
    println!("rank {me} coll ok");
    fabric.finalize()?;
    Ok(())
}

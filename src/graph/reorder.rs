//! `graphscale reorder`: relabel a graph so that `--partition block` keeps neighbourhoods on one
//! rank (the source design's level-2 placement; storage stays balanced: block gives every rank
//! the same number of rows). Size-constrained label propagation (as in the coarsening of
//! multilevel partitioners) groups nodes into clusters of at most `n / (4 parts)` nodes; clusters
//! go to the parts (the contiguous ranges `--partition block` will cut) in breadth-first order of
//! the cluster graph, each to the part it is most connected to, discounted by that part's volume
//! (linear deterministic greedy), so that parts hold the same number of nodes and about the same
//! sum of degrees (a rank's share of walk steps); balanced label propagation then swaps nodes
//! between parts while that lowers the edges between them. The new file
//! holds `original_ids` (the original id of each new id), and training writes its embeddings
//! back in the original order: row i of the output is original node i.
//!
//! `--by degree` orders the nodes by degree instead, hubs first: on one rank (or with the
//! default `--partition striped`, which deals the ids out so that every rank gets its share of
//! hubs) the rows that walks and degree^0.75 negatives touch most share cache lines and pages,
//! which matters once the rows no longer fit in cache.
//!
//! Serial and in memory (about 40 bytes per edge): for graphs one machine can hold.

use std::path::Path;

use rand::{RngExt, SeedableRng};

use crate::error::{Error, Result};
use crate::graph::h5::{EdgeFile, EdgeWriter};
use crate::graph::{Edge, NodeId};

/// How `reorder` orders the nodes (`--by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum By {
    /// Clusters of neighbours in contiguous ranges, one range per part (`--partition block`).
    Clusters,
    /// Descending degree, hubs first (`--partition striped`).
    Degree,
}

impl By {
    /// The partition the new ids are meant for.
    pub fn partition(self) -> &'static str {
        match self {
            By::Clusters => "block",
            By::Degree => "striped",
        }
    }
}

/// What a reorder did: the share of edges whose endpoints fall on different ranks, for the
/// original ids under `striped` and `block` and for the new ids under the partition they are
/// meant for (`block` for clusters, `striped` for degree order; the field keeps its name).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reordered {
    pub by: By,
    pub nodes: u64,
    pub edges: u64,
    pub parts: usize,
    pub clusters: usize,
    pub cut_striped_before: f64,
    pub cut_block_before: f64,
    pub cut_block_after: f64,
    /// Largest part's sum of degrees over the mean (walk steps follow degree), with the new ids
    /// under `block`.
    pub volume_balance: f64,
    pub seconds: f64,
}

/// Edges read per chunk.
const CHUNK: u64 = 1 << 22;

/// Relabel `input` into `output` for `parts` ranks with `--partition block`.
pub fn reorder(
    input: &Path,
    output: &Path,
    parts: usize,
    rounds: usize,
    seed: u64,
    by: By,
) -> Result<Reordered> {
    let t = std::time::Instant::now();
    if parts == 0 {
        return Err(Error::config(
            "--parts must be at least 1 (the ranks that will train)",
        ));
    }
    let f = EdgeFile::open(input)?;
    if f.has_rel {
        return Err(Error::bad_input(
            input,
            "has relations ('rel'): knowledge graphs are not reordered",
        ));
    }
    let n = f.num_nodes;
    if n > u32::MAX as u64 {
        return Err(Error::bad_input(
            input,
            format!("{n} nodes: reorder handles up to 2^32 - 1 nodes"),
        ));
    }
    let mut edges: Vec<Edge> = Vec::with_capacity(f.num_edges as usize);
    let mut at = 0;
    while at < f.num_edges {
        let end = (at + CHUNK).min(f.num_edges);
        edges.extend(f.read_edges(at, end)?);
        at = end;
    }
    let names = read_names(input)?;
    let (order, clusters) = match by {
        By::Clusters => order_nodes(n as usize, &edges, parts, rounds, seed),
        By::Degree => (by_degree(n as usize, &edges), 0),
    };
    let mut new_id = vec![0u32; n as usize];
    for (new, &old) in order.iter().enumerate() {
        new_id[old as usize] = new as u32;
    }
    let cut = |part: &dyn Fn(u64) -> usize, relabel: bool| -> f64 {
        let crossing = edges
            .iter()
            .filter(|e| {
                let (a, b) = if relabel {
                    (new_id[e.src as usize] as u64, new_id[e.dst as usize] as u64)
                } else {
                    (e.src, e.dst)
                };
                part(a) != part(b)
            })
            .count();
        crossing as f64 / edges.len().max(1) as f64
    };
    let block =
        crate::graph::partition::Partitioner::new(crate::graph::partition::Scheme::Block, n, parts);
    let p = parts as u64;
    let cut_striped_before = cut(&|v| (v % p) as usize, false);
    let cut_block_before = cut(&|v| block.owner(v), false);
    let after = |v: u64| match by {
        By::Clusters => block.owner(v),
        By::Degree => (v % p) as usize,
    };
    let cut_block_after = cut(&after, true);
    let mut vol = vec![0u64; parts];
    for e in edges.iter().filter(|e| e.src != e.dst) {
        vol[after(new_id[e.src as usize] as u64)] += 1;
        vol[after(new_id[e.dst as usize] as u64)] += 1;
    }
    let mean = vol.iter().sum::<u64>() as f64 / parts as f64;
    let volume_balance = vol.iter().copied().max().unwrap_or(0) as f64 / mean.max(1.0);

    let mut w = EdgeWriter::create(output, f.weighted)?;
    for e in &edges {
        w.push(Edge {
            src: new_id[e.src as usize] as NodeId,
            dst: new_id[e.dst as usize] as NodeId,
            weight: e.weight,
        })?;
    }
    let names: Option<Vec<String>> =
        names.map(|v| order.iter().map(|&o| v[o as usize].clone()).collect());
    w.finish(Some(n), f.directed, names.as_deref())?;
    let out = hdf5::File::open_rw(output).map_err(|e| Error::hdf5(output, "reopen", e))?;
    let ids: Vec<u64> = order.iter().map(|&o| o as u64).collect();
    out.new_dataset_builder()
        .with_data(&ids)
        .create("original_ids")
        .map_err(|e| Error::hdf5(output, "dataset original_ids", e))?;
    crate::graph::h5::flush(&out, output)?;
    Ok(Reordered {
        by,
        nodes: n,
        edges: edges.len() as u64,
        parts,
        clusters,
        cut_striped_before,
        cut_block_before,
        cut_block_after,
        volume_balance,
        seconds: t.elapsed().as_secs_f64(),
    })
}

fn read_names(path: &Path) -> Result<Option<Vec<String>>> {
    let f = crate::graph::h5::open_h5(path)?;
    let Ok(ds) = f.dataset("node_names") else {
        return Ok(None);
    };
    let v: Vec<hdf5::types::VarLenUnicode> = ds
        .read_raw()
        .map_err(|e| Error::hdf5(path, "read node_names", e))?;
    Ok(Some(v.iter().map(|s| s.as_str().to_string()).collect()))
}

/// The nodes by descending degree (self-loops not counted), ties by id: position -> original id.
fn by_degree(n: usize, edges: &[Edge]) -> Vec<u32> {
    let mut deg = vec![0u32; n];
    for e in edges.iter().filter(|e| e.src != e.dst) {
        deg[e.src as usize] += 1;
        deg[e.dst as usize] += 1;
    }
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by_key(|&v| (std::cmp::Reverse(deg[v as usize]), v));
    order
}

/// The new order of the nodes (position -> original id) and the number of clusters.
fn order_nodes(
    n: usize,
    edges: &[Edge],
    parts: usize,
    rounds: usize,
    seed: u64,
) -> (Vec<u32>, usize) {
    let (deg, off, adj) = undirected(n, edges);
    let nb = |v: usize| &adj[off[v]..off[v + 1]];

    let label = propagate_labels(&deg, &off, &adj, parts, rounds, seed);
    // The clusters' members.
    let mut id_of = vec![u32::MAX; n];
    let mut members: Vec<Vec<u32>> = Vec::new();
    for (v, &l) in label.iter().enumerate() {
        let l = l as usize;
        if id_of[l] == u32::MAX {
            id_of[l] = members.len() as u32;
            members.push(Vec::new());
        }
        members[id_of[l] as usize].push(v as u32);
    }
    let k = members.len();
    let deg = |v: u32| nb(v as usize).len() as u64;
    let cluster_of = |v: u32| id_of[label[v as usize] as usize] as usize;
    // Clusters to parts (the contiguous ranges `--partition block` will cut), in breadth-first
    // order of the cluster graph, each to the part it has the most edges to, discounted by how
    // full that part's volume (sum of degrees: a rank's share of the walk steps) already is
    // (linear deterministic greedy, Stanton and Kliot, KDD 2012); a cluster larger than the room
    // left is split. Every part gets its block range's node count and about the same volume.
    let block = crate::graph::partition::Partitioner::new(
        crate::graph::partition::Scheme::Block,
        n as u64,
        parts,
    );
    let room: Vec<usize> = (0..parts).map(|p| block.num_local(p)).collect();
    let total: u64 = (0..n as u32).map(deg).sum();
    let target = (total as f64 / parts as f64).max(1.0);
    let bfs = cluster_bfs(&members, &nb, &cluster_of);
    // Two packings, each refined; the one that cuts fewer edges wins. Largest volume first to
    // the least full part balances well on dense graphs (BlogCatalog 2 parts: 30% of the edges
    // cut, against 47% for the greedy); the greedy keeps sparse communities whole (an SBM: 15%
    // against 33%).
    let mut by_vol: Vec<(u64, usize)> = (0..k)
        .map(|c| (members[c].iter().map(|&v| deg(v)).sum(), c))
        .collect();
    by_vol.sort_unstable_by(|a, b| b.cmp(a));
    let by_vol: Vec<usize> = by_vol.into_iter().map(|(_, c)| c).collect();
    let mut best: Option<((bool, usize), Vec<u32>)> = None;
    for greedy in [false, true] {
        const UNSET: u32 = u32::MAX;
        let (mut cnt, mut vol) = (vec![0usize; parts], vec![0u64; parts]);
        let mut part = vec![UNSET; n];
        let mut order: Vec<u32> = Vec::with_capacity(n);
        let mut conn = vec![0u64; parts];
        for &c in if greedy { &bfs } else { &by_vol } {
            conn.iter_mut().for_each(|x| *x = 0);
            for &v in &members[c] {
                for &u in nb(v as usize) {
                    let p = part[u as usize];
                    if p != UNSET {
                        conn[p as usize] += 1;
                    }
                }
            }
            let mut rest = &members[c][..];
            while !rest.is_empty() {
                let fits = |p: usize| cnt[p] + rest.len() <= room[p];
                let any_fits = (0..parts).any(fits);
                let p = (0..parts)
                    .filter(|&p| cnt[p] < room[p] && (!any_fits || fits(p)))
                    .max_by(|&a, &b| {
                        let score = |p: usize| {
                            if greedy {
                                conn[p] as f64 * (1.0 - vol[p] as f64 / target)
                            } else {
                                0.0
                            }
                        };
                        score(a).total_cmp(&score(b)).then(vol[b].cmp(&vol[a]))
                    })
                    .expect("the parts hold every node");
                let take = rest.len().min(room[p] - cnt[p]);
                for &v in &rest[..take] {
                    part[v as usize] = p as u32;
                    vol[p] += deg(v);
                    order.push(v);
                }
                cnt[p] += take;
                rest = &rest[take..];
            }
        }
        let order = refine(&order, &mut part, &mut vol, rounds, &nb, &deg, parts);
        let cut = (0..n)
            .map(|v| {
                nb(v)
                    .iter()
                    .filter(|&&u| part[u as usize] != part[v])
                    .count()
            })
            .sum::<usize>();
        // Balanced (within 5% of the mean volume) before fewer cut edges.
        let mean = vol.iter().sum::<u64>() as f64 / parts as f64;
        let over = vol.iter().copied().max().unwrap_or(0) as f64 / mean.max(1.0) > 1.05 + 1e-9;
        let key = (over, cut);
        if best.as_ref().is_none_or(|(b, _)| key < *b) {
            best = Some((key, order));
        }
    }
    (best.expect("two packings").1, k)
}

/// The undirected adjacency without self-loops: degrees, offsets and neighbours.
fn undirected(n: usize, edges: &[Edge]) -> (Vec<u32>, Vec<usize>, Vec<u32>) {
    // Undirected adjacency without self-loops.
    let mut deg = vec![0u32; n + 1];
    for e in edges.iter().filter(|e| e.src != e.dst) {
        deg[e.src as usize] += 1;
        deg[e.dst as usize] += 1;
    }
    let mut off = vec![0usize; n + 1];
    for v in 0..n {
        off[v + 1] = off[v] + deg[v] as usize;
    }
    let mut fill = off.clone();
    let mut adj = vec![0u32; off[n]];
    for e in edges.iter().filter(|e| e.src != e.dst) {
        let (a, b) = (e.src as usize, e.dst as usize);
        adj[fill[a]] = b as u32;
        fill[a] += 1;
        adj[fill[b]] = a as u32;
        fill[b] += 1;
    }
    (deg, off, adj)
}

/// Size-constrained label propagation: every node takes its neighbours' most frequent label,
/// while the cluster holds fewer than a quarter of a part's nodes and of its volume (so that
/// hubs spread). Returns each node's label.
fn propagate_labels(
    deg: &[u32],
    off: &[usize],
    adj: &[u32],
    parts: usize,
    rounds: usize,
    seed: u64,
) -> Vec<u32> {
    let n = off.len() - 1;
    let nb = |v: usize| &adj[off[v]..off[v + 1]];
    // Size-constrained label propagation.
    let cap = (n / (4 * parts.max(1))).max(1) as u32;
    let mut label: Vec<u32> = (0..n as u32).collect();
    let mut size = vec![1u32; n];
    // Clusters also hold at most a quarter of a part's volume, so that hubs spread.
    let vcap = (off[n] as u64 / (4 * parts.max(1)) as u64).max(1);
    let mut cvol: Vec<u64> = (0..n).map(|v| deg[v] as u64).collect();
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut visit: Vec<u32> = (0..n as u32).collect();
    let mut count = vec![0u32; n];
    let mut seen: Vec<u32> = Vec::new();
    for _ in 0..rounds {
        for i in (1..n).rev() {
            let j = rng.random_range(0..=i);
            visit.swap(i, j);
        }
        let mut moved = 0usize;
        for &v in &visit {
            let v = v as usize;
            seen.clear();
            for &u in nb(v) {
                let l = label[u as usize];
                if count[l as usize] == 0 {
                    seen.push(l);
                }
                count[l as usize] += 1;
            }
            let mine = label[v];
            let mut best = (count[mine as usize], mine);
            for &l in &seen {
                let c = count[l as usize];
                if l != mine
                    && size[l as usize] < cap
                    && cvol[l as usize] + deg[v] as u64 <= vcap
                    && c > best.0
                {
                    best = (c, l);
                }
            }
            for &l in &seen {
                count[l as usize] = 0;
            }
            if best.1 != mine {
                size[mine as usize] -= 1;
                size[best.1 as usize] += 1;
                cvol[mine as usize] -= deg[v] as u64;
                cvol[best.1 as usize] += deg[v] as u64;
                label[v] = best.1;
                moved += 1;
            }
        }
        if moved == 0 {
            break;
        }
    }

    label
}

/// The clusters in breadth-first order of the cluster graph, from the largest unvisited.
fn cluster_bfs<'a>(
    members: &[Vec<u32>],
    nb: &impl Fn(usize) -> &'a [u32],
    cluster_of: &impl Fn(u32) -> usize,
) -> Vec<usize> {
    let k = members.len();
    let mut by_size: Vec<usize> = (0..k).collect();
    by_size.sort_by_key(|&c| std::cmp::Reverse(members[c].len()));
    let mut queued = vec![false; k];
    let mut bfs: Vec<usize> = Vec::with_capacity(k);
    for &start in &by_size {
        if queued[start] {
            continue;
        }
        queued[start] = true;
        let mut head = bfs.len();
        bfs.push(start);
        while head < bfs.len() {
            let c = bfs[head];
            head += 1;
            for &v in &members[c] {
                for &u in nb(v as usize) {
                    let d = cluster_of(u);
                    if !queued[d] {
                        queued[d] = true;
                        bfs.push(d);
                    }
                }
            }
        }
    }
    bfs
}

/// Balanced label propagation over the parts (Ugander and Backstrom, WSDM 2013): every node that
/// has more neighbours in another part wants to move there, and per pair of parts the most eager
/// nodes swap, as many each way (every part keeps its node count), unless a swap would take a
/// part's volume above 1.05 x the mean (or above what it is). Returns the order: part by part,
/// each in the order of `order`.
#[allow(clippy::too_many_arguments)]
fn refine<'a>(
    order: &[u32],
    part: &mut [u32],
    vol: &mut [u64],
    rounds: usize,
    nb: &impl Fn(usize) -> &'a [u32],
    deg: &impl Fn(u32) -> u64,
    parts: usize,
) -> Vec<u32> {
    let n = order.len();
    let mut pos = vec![0u32; n];
    for (i, &v) in order.iter().enumerate() {
        pos[v as usize] = i as u32;
    }
    let cap = (vol.iter().sum::<u64>() as f64 / parts as f64 * 1.05) as u64;
    if parts > 1 {
        let mut count = vec![0u32; parts];
        for _ in 0..rounds {
            // (gain, node) per (from, to).
            let mut want: Vec<Vec<(u32, u32)>> = vec![Vec::new(); parts * parts];
            for v in 0..n {
                count.iter_mut().for_each(|c| *c = 0);
                for &u in nb(v) {
                    count[part[u as usize] as usize] += 1;
                }
                let from = part[v] as usize;
                let (to, best) = count
                    .iter()
                    .enumerate()
                    .max_by_key(|&(p, &c)| (c, p == from))
                    .map(|(p, &c)| (p, c))
                    .expect("at least one part");
                if to != from && best > count[from] {
                    want[from * parts + to].push((best - count[from], v as u32));
                }
            }
            let mut swapped = 0;
            for a in 0..parts {
                for b in a + 1..parts {
                    let (mut ab, mut ba) = (
                        std::mem::take(&mut want[a * parts + b]),
                        std::mem::take(&mut want[b * parts + a]),
                    );
                    ab.sort_unstable_by(|x, y| y.cmp(x));
                    ba.sort_unstable_by(|x, y| y.cmp(x));
                    for (&(_, u), &(_, v)) in ab.iter().zip(&ba) {
                        let (du, dv) = (deg(u), deg(v));
                        let va = vol[a] + dv - du;
                        let vb = vol[b] + du - dv;
                        if (va > cap && va > vol[a]) || (vb > cap && vb > vol[b]) {
                            continue;
                        }
                        (vol[a], vol[b]) = (va, vb);
                        part[u as usize] = b as u32;
                        part[v as usize] = a as u32;
                        swapped += 1;
                    }
                }
            }
            if swapped == 0 {
                break;
            }
        }
    }
    let mut out: Vec<u32> = order.to_vec();
    out.sort_by_key(|&v| (part[v as usize], pos[v as usize]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two cliques whose ids interleave (even ids one, odd ids the other) and one bridge: block
    /// ranges of the original ids cut half of the edges, of the new ids only the bridge.
    #[test]
    fn interleaved_cliques_come_apart() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a.h5"), d.path().join("b.h5"));
        let n = 64u64;
        let mut edges = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                if i % 2 == j % 2 {
                    edges.push(Edge {
                        src: i,
                        dst: j,
                        weight: 1.0,
                    });
                }
            }
        }
        edges.push(Edge {
            src: 0,
            dst: 1,
            weight: 1.0,
        });
        crate::graph::h5::write_edges(&a, &edges, n, false, false).unwrap();
        let r = reorder(&a, &b, 2, 10, 1, By::Clusters).unwrap();
        assert!(r.cut_block_before > 0.49, "{r:?}");
        assert!(
            r.cut_block_after <= 1.0 / edges.len() as f64 + 1e-12,
            "{r:?}"
        );
        // Same edges under the map, and the map is a permutation.
        let f = hdf5::File::open(&b).unwrap();
        let ids: Vec<u64> = f.dataset("original_ids").unwrap().read_raw().unwrap();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        let g = EdgeFile::open(&b).unwrap();
        let mut back: Vec<(u64, u64)> = g
            .read_edges(0, g.num_edges)
            .unwrap()
            .iter()
            .map(|e| (ids[e.src as usize], ids[e.dst as usize]))
            .collect();
        let mut orig: Vec<(u64, u64)> = edges.iter().map(|e| (e.src, e.dst)).collect();
        back.sort_unstable();
        orig.sort_unstable();
        assert_eq!(back, orig);
    }

    /// A star's hub and a path: by degree the hub becomes node 0, degrees never increase along
    /// the new ids, and the edges are the same under the map.
    #[test]
    fn degree_order_puts_hubs_first() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a.h5"), d.path().join("b.h5"));
        let n = 40u64;
        let e = |src: u64, dst: u64| Edge {
            src,
            dst,
            weight: 1.0,
        };
        // Hub 37 joined to 0..20, a path over 20..37, a self-loop that does not count.
        let mut edges: Vec<Edge> = (0..20).map(|v| e(37, v)).collect();
        edges.extend((20..36).map(|v| e(v, v + 1)));
        edges.push(e(5, 5));
        crate::graph::h5::write_edges(&a, &edges, n, false, false).unwrap();
        let r = reorder(&a, &b, 2, 10, 1, By::Degree).unwrap();
        assert_eq!((r.by, r.clusters), (By::Degree, 0));
        let ids: Vec<u64> = hdf5::File::open(&b)
            .unwrap()
            .dataset("original_ids")
            .unwrap()
            .read_raw()
            .unwrap();
        assert_eq!(ids[0], 37, "the hub first");
        let g = EdgeFile::open(&b).unwrap();
        let new = g.read_edges(0, g.num_edges).unwrap();
        let mut deg = vec![0u32; n as usize];
        for x in new.iter().filter(|x| x.src != x.dst) {
            deg[x.src as usize] += 1;
            deg[x.dst as usize] += 1;
        }
        assert!(deg.windows(2).all(|w| w[0] >= w[1]), "{deg:?}");
        let mut back: Vec<(u64, u64)> = new
            .iter()
            .map(|x| (ids[x.src as usize], ids[x.dst as usize]))
            .collect();
        let mut orig: Vec<(u64, u64)> = edges.iter().map(|x| (x.src, x.dst)).collect();
        back.sort_unstable();
        orig.sort_unstable();
        assert_eq!(back, orig);
    }
}

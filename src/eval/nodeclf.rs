//! Node classification, the DeepWalk protocol: one-vs-rest L2 logistic regression (C = 1, bias
//! as a regularised constant feature, as liblinear does) on a random fraction of the labeled
//! nodes; each test node is predicted with as many labels as it truly has, the top-scoring ones;
//! Micro- and Macro-F1 averaged over repeated splits. Solver: Newton-CG (truncated Newton with
//! exact Hessian-vector products and a backtracking line search), stopping at |g| <= 1e-4 |g0|.

use std::collections::BTreeMap;
use std::path::Path;

use rand::RngExt;
use rayon::prelude::*;

use crate::error::{Error, Result};

/// Labels per node: `labels[node]` holds dense label ids (empty = unlabeled).
pub struct Labels {
    pub per_node: Vec<Vec<u32>>,
    pub num_labels: usize,
}

/// Read `node<TAB>label` lines (any whitespace); labels may be any tokens. Nodes are row numbers,
/// or, when the embeddings carry `node_names` (a graph converted with `--string-ids`), names.
pub fn read_labels(path: &Path, num_nodes: usize, names: Option<&[String]>) -> Result<Labels> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let by_name: Option<std::collections::HashMap<&str, usize>> =
        names.map(|v| v.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect());
    let mut ids: BTreeMap<String, u32> = BTreeMap::new();
    let mut raw = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let bad = |msg: String| Error::BadLine {
            path: path.to_path_buf(),
            line: i as u64 + 1,
            msg,
        };
        let mut f = t.split_whitespace();
        let (Some(n), Some(l), None) = (f.next(), f.next(), f.next()) else {
            return Err(bad("expected 'node label'".into()));
        };
        let node: usize = match &by_name {
            Some(m) => *m.get(n).ok_or_else(|| {
                bad(format!(
                    "node '{n}' is not among the embeddings' node_names (labels name nodes as the edge file did)"
                ))
            })?,
            None => n.parse().map_err(|_| {
                bad(format!(
                    "node '{n}' is not a non-negative integer (the embeddings have no node_names: convert the graph with --string-ids to use names)"
                ))
            })?,
        };
        if node >= num_nodes {
            return Err(bad(format!(
                "node {node} does not exist: the embeddings have {num_nodes} rows"
            )));
        }
        raw.push((node, l.to_string()));
    }
    if raw.is_empty() {
        return Err(Error::bad_input(
            path,
            "no labels found (empty file or only comments)",
        ));
    }
    for (_, l) in &raw {
        let next = ids.len() as u32;
        ids.entry(l.clone()).or_insert(next);
    }
    let mut per_node = vec![Vec::new(); num_nodes];
    for (n, l) in raw {
        let id = ids[&l];
        if !per_node[n].contains(&id) {
            per_node[n].push(id);
        }
    }
    Ok(Labels {
        per_node,
        num_labels: ids.len(),
    })
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct F1 {
    pub micro_f1: f64,
    pub micro_f1_std: f64,
    pub macro_f1: f64,
    pub macro_f1_std: f64,
}

/// Binary L2 logistic regression: min 0.5|w|^2 + C sum log(1 + exp(-y_i w.x_i)), x with a
/// trailing constant 1 (the bias, regularised like liblinear's).
pub fn fit_binary(x: &[f32], d: usize, y: &[f32], c: f64) -> Vec<f64> {
    let n = y.len();
    let xd = d + 1;
    let row = |i: usize| &x[i * d..(i + 1) * d];
    let margin = |w: &[f64], i: usize| -> f64 {
        row(i)
            .iter()
            .zip(w)
            .map(|(&a, &b)| f64::from(a) * b)
            .sum::<f64>()
            + w[d]
    };
    let objective = |w: &[f64]| -> f64 {
        let reg = 0.5 * w.iter().map(|v| v * v).sum::<f64>();
        let loss: f64 = (0..n)
            .map(|i| {
                let z = f64::from(y[i]) * margin(w, i);
                if z > 0.0 {
                    (-z).exp().ln_1p()
                } else {
                    -z + z.exp().ln_1p()
                }
            })
            .sum();
        reg + c * loss
    };
    let mut w = vec![0f64; xd];
    let mut g0 = None;
    for _newton in 0..50 {
        let mut g = w.clone();
        let mut dvec = vec![0f64; n];
        for (i, di) in dvec.iter_mut().enumerate() {
            let yi = f64::from(y[i]);
            let s = 1.0 / (1.0 + (-yi * margin(&w, i)).exp());
            *di = s * (1.0 - s);
            let coef = c * (s - 1.0) * yi;
            for (gj, &xj) in g.iter_mut().zip(row(i)) {
                *gj += coef * f64::from(xj);
            }
            g[d] += coef;
        }
        let gn = g.iter().map(|v| v * v).sum::<f64>().sqrt();
        let g0n = *g0.get_or_insert(gn);
        if gn <= 1e-4 * g0n || gn < 1e-10 {
            break;
        }
        // CG on H s = -g, H v = v + C X^T D X v.
        let hv = |v: &[f64]| -> Vec<f64> {
            let mut out = v.to_vec();
            for (i, di) in dvec.iter().enumerate() {
                let xv = row(i)
                    .iter()
                    .zip(v)
                    .map(|(&a, &b)| f64::from(a) * b)
                    .sum::<f64>()
                    + v[d];
                let k = c * di * xv;
                for (o, &xj) in out.iter_mut().zip(row(i)) {
                    *o += k * f64::from(xj);
                }
                out[d] += k;
            }
            out
        };
        let mut s = vec![0f64; xd];
        let mut r: Vec<f64> = g.iter().map(|v| -v).collect();
        let mut p = r.clone();
        let mut rr: f64 = r.iter().map(|v| v * v).sum();
        for _ in 0..100 {
            if rr.sqrt() <= 0.1 * gn {
                break;
            }
            let hp = hv(&p);
            let alpha = rr / p.iter().zip(&hp).map(|(a, b)| a * b).sum::<f64>();
            for j in 0..xd {
                s[j] += alpha * p[j];
                r[j] -= alpha * hp[j];
            }
            let rr2: f64 = r.iter().map(|v| v * v).sum();
            let beta = rr2 / rr;
            rr = rr2;
            for j in 0..xd {
                p[j] = r[j] + beta * p[j];
            }
        }
        let f0 = objective(&w);
        let gs: f64 = g.iter().zip(&s).map(|(a, b)| a * b).sum();
        let mut step = 1.0;
        loop {
            let cand: Vec<f64> = w.iter().zip(&s).map(|(a, b)| a + step * b).collect();
            if objective(&cand) <= f0 + 1e-4 * step * gs || step < 1e-8 {
                w = cand;
                break;
            }
            step *= 0.5;
        }
    }
    w
}

/// Micro/Macro-F1 of top-k predictions (k = true label count) for one split.
fn f1_of(scores: &[Vec<f64>], truth: &[&Vec<u32>], num_labels: usize) -> (f64, f64) {
    let (mut tp, mut fp, mut fne) = (
        vec![0u64; num_labels],
        vec![0u64; num_labels],
        vec![0u64; num_labels],
    );
    for (s, t) in scores.iter().zip(truth) {
        let mut order: Vec<usize> = (0..num_labels).collect();
        order.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
        let pred = &order[..t.len()];
        for &p in pred {
            if t.contains(&(p as u32)) {
                tp[p] += 1;
            } else {
                fp[p] += 1;
            }
        }
        for &l in t.iter() {
            if !pred.contains(&(l as usize)) {
                fne[l as usize] += 1;
            }
        }
    }
    let f1 = |tp: u64, fp: u64, fne: u64| {
        let den = 2 * tp + fp + fne;
        if den == 0 {
            0.0
        } else {
            2.0 * tp as f64 / den as f64
        }
    };
    let micro = f1(tp.iter().sum(), fp.iter().sum(), fne.iter().sum());
    let macro_ = (0..num_labels)
        .map(|l| f1(tp[l], fp[l], fne[l]))
        .sum::<f64>()
        / num_labels as f64;
    (micro, macro_)
}

/// Read `--splits`: JSON `{"perms": [[node, ...], ...]}`, one permutation of the labeled nodes
/// per repeat (the first round(f n) train, the rest test), to evaluate on exactly the splits of
/// another tool (`bench/crosscheck_nodeclf.py` uses it against scikit-learn).
pub fn read_splits(path: &Path, labels: &Labels) -> Result<Vec<Vec<usize>>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    #[derive(serde::Deserialize)]
    struct Splits {
        perms: Vec<Vec<usize>>,
    }
    let s: Splits = serde_json::from_str(&text).map_err(|e| {
        Error::bad_input(
            path,
            format!("expected {{\"perms\": [[node, ...], ...]}}: {e}"),
        )
    })?;
    let mut labeled: Vec<usize> = (0..labels.per_node.len())
        .filter(|&i| !labels.per_node[i].is_empty())
        .collect();
    labeled.sort_unstable();
    for (k, p) in s.perms.iter().enumerate() {
        let mut q = p.clone();
        q.sort_unstable();
        if q != labeled {
            return Err(Error::bad_input(
                path,
                format!(
                    "permutation {k} is not a permutation of the {} labeled nodes",
                    labeled.len()
                ),
            ));
        }
    }
    if s.perms.is_empty() {
        return Err(Error::bad_input(path, "no permutations"));
    }
    Ok(s.perms)
}

/// Run the protocol for each training fraction (random splits from `seed`, or `splits`).
pub fn node_classification(
    emb: &[f32],
    dim: usize,
    labels: &Labels,
    fractions: &[f64],
    repeats: usize,
    seed: u64,
    splits: Option<&[Vec<usize>]>,
) -> Result<Vec<(f64, F1)>> {
    let nodes: Vec<usize> = (0..labels.per_node.len())
        .filter(|&i| !labels.per_node[i].is_empty())
        .collect();
    if nodes.len() < 2 {
        return Err(Error::Mismatch("fewer than 2 labeled nodes".into()));
    }
    let mut out = Vec::new();
    for &frac in fractions {
        if !(frac > 0.0 && frac < 1.0) {
            return Err(Error::config(format!(
                "--train-fractions: {frac} is not in (0, 1)"
            )));
        }
        let mut runs = Vec::new();
        let reps = splits.map_or(repeats, <[_]>::len);
        for rep in 0..reps {
            let perm = match splits {
                Some(s) => s[rep].clone(),
                None => {
                    let mut rng = crate::sample::rng_for(seed, rep, (frac * 1e6) as u64);
                    let mut perm = nodes.clone();
                    for i in (1..perm.len()).rev() {
                        perm.swap(i, rng.random_range(0..=i));
                    }
                    perm
                }
            };
            let ntr = ((frac * perm.len() as f64).round() as usize).clamp(1, perm.len() - 1);
            let (train, test) = perm.split_at(ntr);
            let x: Vec<f32> = train
                .iter()
                .flat_map(|&i| emb[i * dim..(i + 1) * dim].iter().copied())
                .collect();
            // A label without a positive training node cannot be learned: it is never predicted
            // (it still counts in Macro-F1), as in the reference protocol.
            let mut present = vec![false; labels.num_labels];
            for &i in train {
                for &l in &labels.per_node[i] {
                    present[l as usize] = true;
                }
            }
            let models: Vec<Option<Vec<f64>>> = (0..labels.num_labels)
                .into_par_iter()
                .map(|l| {
                    if !present[l] {
                        return None;
                    }
                    let y: Vec<f32> = train
                        .iter()
                        .map(|&i| {
                            if labels.per_node[i].contains(&(l as u32)) {
                                1.0
                            } else {
                                -1.0
                            }
                        })
                        .collect();
                    Some(fit_binary(&x, dim, &y, 1.0))
                })
                .collect();
            let scores: Vec<Vec<f64>> = test
                .par_iter()
                .map(|&i| {
                    let e = &emb[i * dim..(i + 1) * dim];
                    models
                        .iter()
                        .map(|w| match w {
                            None => f64::NEG_INFINITY,
                            Some(w) => {
                                e.iter()
                                    .zip(w)
                                    .map(|(&a, &b)| f64::from(a) * b)
                                    .sum::<f64>()
                                    + w[dim]
                            }
                        })
                        .collect()
                })
                .collect();
            let truth: Vec<&Vec<u32>> = test.iter().map(|&i| &labels.per_node[i]).collect();
            runs.push(f1_of(&scores, &truth, labels.num_labels));
        }
        let mean_std = |v: Vec<f64>| {
            let m = v.iter().sum::<f64>() / v.len() as f64;
            let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64;
            (m, var.sqrt())
        };
        let (mi, mis) = mean_std(runs.iter().map(|r| r.0).collect());
        let (ma, mas) = mean_std(runs.iter().map(|r| r.1).collect());
        out.push((
            frac,
            F1 {
                micro_f1: mi,
                micro_f1_std: mis,
                macro_f1: ma,
                macro_f1_std: mas,
            },
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separable_classes_are_learned() {
        // Two clusters in 2-D; the classifier must separate them.
        let mut x = Vec::new();
        let mut y = Vec::new();
        for i in 0..200 {
            let s = if i % 2 == 0 { 1.0f32 } else { -1.0 };
            x.extend_from_slice(&[
                s * 2.0 + (i as f32 * 0.37).sin() * 0.5,
                (i as f32 * 0.11).cos(),
            ]);
            y.push(s);
        }
        let w = fit_binary(&x, 2, &y, 1.0);
        let correct = (0..200)
            .filter(|&i| {
                ((f64::from(x[2 * i]) * w[0] + f64::from(x[2 * i + 1]) * w[1] + w[2]) > 0.0)
                    == (y[i] > 0.0)
            })
            .count();
        assert_eq!(correct, 200);
    }

    #[test]
    fn the_optimum_has_zero_gradient() {
        let x = [0.5f32, 1.0, -0.3, 0.2, 0.9, -1.0, 0.1, 0.4];
        let y = [1.0f32, -1.0, 1.0, -1.0];
        let w = fit_binary(&x, 2, &y, 1.0);
        let mut g = w.clone();
        for i in 0..4 {
            let yi = f64::from(y[i]);
            let m = f64::from(x[2 * i]) * w[0] + f64::from(x[2 * i + 1]) * w[1] + w[2];
            let coef = (1.0 / (1.0 + (-yi * m).exp()) - 1.0) * yi;
            g[0] += coef * f64::from(x[2 * i]);
            g[1] += coef * f64::from(x[2 * i + 1]);
            g[2] += coef;
        }
        assert!(g.iter().all(|v| v.abs() < 1e-4), "{g:?}");
    }

    #[test]
    fn f1_counts_top_k() {
        let scores = vec![vec![0.9, 0.1, 0.5], vec![0.2, 0.8, 0.1]];
        let t0 = vec![0u32, 2];
        let t1 = vec![2u32];
        let (micro, macro_) = f1_of(&scores, &[&t0, &t1], 3);
        // node 0 predicts {0,2}: 2 TP; node 1 predicts {1}: 1 FP (label 1), 1 FN (label 2)
        assert!((micro - 4.0 / 6.0).abs() < 1e-12);
        // per label: 0 -> 1.0; 1 -> 0; 2 -> 2/3
        assert!((macro_ - (1.0 + 0.0 + 2.0 / 3.0) / 3.0).abs() < 1e-12);
    }
}

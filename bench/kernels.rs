//! Criterion benchmarks of the hot kernels, with throughput in elements so that results read as
//! pairs/s, rows/s or draws/s. Roofline: a skip-gram pair with K negatives at d = 128 does
//! ~(1 + K) * 3 * 2 * d flops on (2 + K) rows of d * 4 bytes. Run: `cargo bench --bench kernels`.
//! Groups: skip-gram (batched, hogwild pairs, hogwild token blocks), LINE first order, walk epochs (DeepWalk and node2vec),
//! row gather and scatter-add, row codecs (f32/f16/bf16, int8 on the wire), alias draws.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::RngExt;

use graphscale::config::Dtype;
use graphscale::config::WireDtype;
use graphscale::model::cells::Shared::{F16, F32};
use graphscale::model::sgns;
use graphscale::sample::alias::AliasTable;
use graphscale::sample::rng_for;
use graphscale::store::{decode_row, decode_wire, encode_row, encode_wire, OptParams};

/// `n` uniform (center, context) pairs and `k` uniform negatives each over `rows` rows.
fn random_batch(
    rng: &mut graphscale::sample::Rng,
    n: usize,
    k: usize,
    rows: usize,
) -> (Vec<[u32; 2]>, Vec<u32>) {
    let r = rows as u32;
    let pairs = (0..n)
        .map(|_| [rng.random_range(0..r), rng.random_range(0..r)])
        .collect();
    let negs = (0..n * k).map(|_| rng.random_range(0..r)).collect();
    (pairs, negs)
}

fn skipgram(c: &mut Criterion) {
    let (dim, k, pairs_n) = (128, 5, 4096);
    let mut g = c.benchmark_group("skipgram_batch");
    for slots in [2_000usize, 40_000] {
        let mut rng = rng_for(1, 0, 0);
        let rows: Vec<f32> = (0..slots * dim)
            .map(|_| rng.random_range(-0.1f32..0.1))
            .collect();
        let (pairs, negs) = random_batch(&mut rng, pairs_n, k, slots);
        g.throughput(Throughput::Elements(pairs_n as u64));
        g.bench_with_input(BenchmarkId::new("incidence", slots), &slots, |b, _| {
            b.iter(|| sgns::batch_gradients(&rows, dim, &pairs, &negs, k))
        });
        g.bench_with_input(
            BenchmarkId::new("sequential_reference", slots),
            &slots,
            |b, _| {
                let mut grads = vec![0f32; rows.len()];
                b.iter(|| sgns::accumulate(&rows, dim, &pairs, &negs, k, &mut grads))
            },
        );
    }
    g.finish();
}

/// HOGWILD in-place skip-gram (`--update hogwild`) on the global pool, with vertex and context
/// matrices of `rows` rows each: 10,312 is BlogCatalog (in L3), 1M is out of cache.
fn skipgram_in_place(c: &mut Criterion) {
    use std::sync::atomic::AtomicU32;
    let (dim, k, pairs_n) = (128, 5, 65536);
    let mut g = c.benchmark_group("skipgram_in_place");
    g.sample_size(20);
    for rows in [10_312usize, 1_000_000] {
        let mut rng = rng_for(1, 0, 0);
        let cells = |rng: &mut graphscale::sample::Rng| -> Vec<AtomicU32> {
            (0..rows * dim)
                .map(|_| AtomicU32::new(rng.random_range(-0.1f32..0.1).to_bits()))
                .collect()
        };
        let (centers, targets) = (cells(&mut rng), cells(&mut rng));
        let (pairs, negs) = random_batch(&mut rng, pairs_n, k, rows);
        g.throughput(Throughput::Elements(pairs_n as u64));
        g.bench_with_input(BenchmarkId::new("hogwild", rows), &rows, |b, _| {
            b.iter(|| {
                sgns::sgd_in_place(
                    F32(&centers),
                    F32(&targets),
                    F32(&[]),
                    dim,
                    &pairs,
                    &negs,
                    k,
                    sgns::Step::sgd(1e-4),
                )
            })
        });
    }
    g.finish();
}

/// The token-blocked kernel (`--kernel token`, `sgns::sgd_segments`) against the pair kernel on
/// the same walks: 64 walks of 80 uniform random tokens over `rows` rows, window 10 with
/// word2vec's reduced windows, 5 negatives (per token for the blocks, per pair for the pairs).
/// Throughput is in pairs, so the two rows compare directly.
fn skipgram_segments(c: &mut Criterion) {
    use graphscale::sample::walk::{group_inputs, Segments};
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::atomic::{AtomicU16, AtomicU32};
    let (dim, k, window, walks, len) = (128, 5, 10u32, 64, 80);
    let mut g = c.benchmark_group("skipgram_segments");
    g.sample_size(20);
    for rows in [200usize, 10_312, 1_000_000] {
        let mut rng = rng_for(3, 0, 0);
        let cells = |rng: &mut graphscale::sample::Rng| -> Vec<AtomicU32> {
            (0..rows * dim)
                .map(|_| AtomicU32::new(rng.random_range(-0.1f32..0.1).to_bits()))
                .collect()
        };
        let (centers, targets) = (cells(&mut rng), cells(&mut rng));
        let r = rows as u32;
        let mut segs = Segments::default();
        for _ in 0..walks {
            segs.segs.push((segs.tokens.len() as u32, 0));
            for _ in 0..len {
                let w = window - rng.random_range(0..window);
                segs.tokens.push((u64::from(rng.random_range(0..r)), w));
            }
        }
        let refs: Vec<[u32; 2]> = segs.tokens.iter().map(|&(n, _)| [n as u32; 2]).collect();
        let wins: Vec<u32> = segs.tokens.iter().map(|&(_, w)| w).collect();
        let (mut first_group, mut groups, mut npairs) = (Vec::new(), 0, 0);
        for s in 0..segs.segs.len() {
            first_group.push(groups as u32);
            let (t, h) = segs.segment(s);
            for (b, &(_, w)) in t.iter().enumerate() {
                let (lo, hi) = group_inputs(t.len(), h, b, w);
                let m = sgns::group_size(lo, hi, b);
                groups += usize::from(m > 0);
                npairs += m;
            }
        }
        let negs: Vec<u32> = (0..groups * k).map(|_| rng.random_range(0..r)).collect();
        let rows_ref = sgns::SegmentRows {
            refs: &refs,
            wins: &wins,
            segs: &segs.segs,
            negs: &negs,
            first_group: &first_group,
        };
        let mut pairs = Vec::new();
        segs.pairs(&mut pairs);
        let pidx: Vec<[u32; 2]> = pairs.iter().map(|&(a, b)| [a as u32, b as u32]).collect();
        let pnegs: Vec<u32> = (0..pidx.len() * k)
            .map(|_| rng.random_range(0..r))
            .collect();
        g.throughput(Throughput::Elements(npairs as u64));
        g.bench_with_input(BenchmarkId::new("token_blocks", rows), &rows, |b, _| {
            b.iter(|| {
                sgns::sgd_segments(
                    F32(&centers),
                    F32(&targets),
                    F32(&[]),
                    dim,
                    &rows_ref,
                    k,
                    window,
                    sgns::Step::sgd(1e-4),
                )
            })
        });
        // The same rows stored as f16 (`--dtype f16`): half the bytes, a conversion per copy.
        let half = |c: &[AtomicU32]| -> Vec<AtomicU16> {
            c.iter()
                .map(|x| {
                    AtomicU16::new(half::f16::from_f32(f32::from_bits(x.load(Relaxed))).to_bits())
                })
                .collect()
        };
        let (hc, ht) = (half(&centers), half(&targets));
        g.bench_with_input(BenchmarkId::new("token_blocks_f16", rows), &rows, |b, _| {
            b.iter(|| {
                sgns::sgd_segments(
                    F16(&hc),
                    F16(&ht),
                    F32(&[]),
                    dim,
                    &rows_ref,
                    k,
                    window,
                    sgns::Step::sgd(1e-4),
                )
            })
        });
        // Implicit steps (the small budgets' large rates) and row-wise Adagrad in place: the
        // same blocks against `token_blocks` above.
        g.bench_with_input(
            BenchmarkId::new("token_blocks_implicit", rows),
            &rows,
            |b, _| {
                b.iter(|| {
                    sgns::sgd_segments(
                        F32(&centers),
                        F32(&targets),
                        F32(&[]),
                        dim,
                        &rows_ref,
                        k,
                        window,
                        sgns::Step::new(1e-4, true, None),
                    )
                })
            },
        );
        let zeros = |n: usize| -> Vec<AtomicU32> { (0..n).map(|_| AtomicU32::new(0)).collect() };
        let (acc_c, acc_t) = (zeros(centers.len() / dim), zeros(targets.len() / dim));
        g.bench_with_input(
            BenchmarkId::new("token_blocks_adagrad", rows),
            &rows,
            |b, _| {
                b.iter(|| {
                    let acc = graphscale::model::Accumulators {
                        matrices: [&acc_c, &acc_t],
                        remote: &[],
                    };
                    sgns::sgd_segments(
                        F32(&centers),
                        F32(&targets),
                        F32(&[]),
                        dim,
                        &rows_ref,
                        k,
                        window,
                        sgns::Step::new(1e-4, false, Some(acc)),
                    )
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("pairs", rows), &rows, |b, _| {
            b.iter(|| {
                sgns::sgd_in_place(
                    F32(&centers),
                    F32(&targets),
                    F32(&[]),
                    dim,
                    &pidx,
                    &pnegs,
                    k,
                    sgns::Step::sgd(1e-4),
                )
            })
        });
    }
    g.finish();
}

/// LINE first order on the hogwild path: one matrix is both the input and the output side.
fn line_in_place(c: &mut Criterion) {
    use std::sync::atomic::AtomicU32;
    let (dim, k, pairs_n, rows) = (128, 5, 65536, 10_312);
    let mut rng = rng_for(2, 0, 0);
    let m: Vec<AtomicU32> = (0..rows * dim)
        .map(|_| AtomicU32::new(rng.random_range(-0.1f32..0.1).to_bits()))
        .collect();
    let (pairs, negs) = random_batch(&mut rng, pairs_n, k, rows);
    let mut g = c.benchmark_group("line_in_place");
    g.sample_size(20);
    g.throughput(Throughput::Elements(pairs_n as u64));
    g.bench_function("first_order_10312", |b| {
        b.iter(|| {
            sgns::sgd_in_place(
                F32(&m),
                F32(&m),
                F32(&[]),
                dim,
                &pairs,
                &negs,
                k,
                sgns::Step::sgd(1e-4),
            )
        })
    });
    g.finish();
}

/// Walk steps (one epoch of 80-step walks, pairs emitted with window 10) and the gather and
/// scatter-add of rows, on one in-process rank over a uniform random graph of BlogCatalog's size
/// (10,312 nodes, 333,983 edges).
fn walks_and_rows(c: &mut Criterion) {
    use graphscale::graph::partition::{Partitioner, Scheme};
    use graphscale::graph::{csr::route_edges, Edge, LocalGraph};
    use graphscale::sample::walk::{Segments, WalkEngine, WalkParams};
    use graphscale::store::Shard;
    // Criterion is not Send and a communicator lives on its rank's thread: the rank thread
    // measures with its own Criterion, configured from the same command line.
    let _ = c;
    graphscale::comm::local::run(1, std::time::Duration::from_secs(3600), |comm| {
        let mut c = Criterion::default().configure_from_args();
        let (n, m) = (10_312u64, 333_983usize);
        let mut rng = rng_for(4, 0, 0);
        let edges: Vec<Edge> = (0..m)
            .map(|_| {
                let s = rng.random_range(0..n);
                let d = (s + rng.random_range(1..n)) % n;
                Edge {
                    src: s,
                    dst: d,
                    weight: 1.0,
                }
            })
            .collect();
        let part = Partitioner::new(Scheme::Striped, n, 1);
        let entries = route_edges(&comm, &part, &edges, false);
        let g = LocalGraph::from_entries(0, part, &entries, m as u64, false, false);
        let mut group = c.benchmark_group("walk_epoch");
        group.sample_size(10);
        group.throughput(Throughput::Elements(n * 80));
        for (name, node2vec) in [("deepwalk", None), ("node2vec_p0.25_q4", Some((0.25, 4.0)))] {
            let params = WalkParams {
                walk_length: 80,
                window: 10,
                walks_per_node: 1,
                node2vec,
                in_flight: 32,
                local_steps: 80,
                node_walks: false,
            };
            let mut wrng = rng_for(5, 0, 3);
            let sum_deg = comm.sum_u64(g.local_entries());
            let mut e = WalkEngine::new(&g, params, 0.0, sum_deg, None, &mut wrng);
            let mut segs = Segments::default();
            group.bench_function(name, |b| {
                b.iter(|| {
                    e.new_epoch();
                    loop {
                        segs.clear();
                        e.superstep(&g, &mut wrng, &mut segs, |s| comm.all_to_all_v(s));
                        if e.pending() == 0 {
                            break;
                        }
                    }
                })
            });
        }
        group.finish();

        let (dim, batch) = (128, 4096usize);
        let mut group = c.benchmark_group("rows");
        group.throughput(Throughput::Elements(batch as u64));
        for dt in [Dtype::F32, Dtype::F16] {
            let mut shard = Shard::new(
                &comm,
                n as usize,
                dim,
                dt,
                graphscale::config::Optimizer::Sgd,
                false,
            );
            let idx: Vec<u32> = (0..batch).map(|_| rng.random_range(0..n as u32)).collect();
            let rb = shard.row_bytes();
            let (mut buf, mut rows) = (vec![0u8; batch * rb], vec![0f32; batch * dim]);
            group.bench_function(format!("gather_{dt:?}"), |b| {
                b.iter(|| {
                    let req = [(0usize, idx.as_slice())];
                    shard
                        .window
                        .get_rows(comm.watchdog(), &req, rb, 4096, &mut buf);
                    for (inp, out) in buf.chunks_exact(rb).zip(rows.chunks_exact_mut(dim)) {
                        decode_row(dt, inp, out);
                    }
                })
            });
            // The owner-side SGD step of the batched path: decode, add, encode per row.
            let grad = vec![1e-3f32; dim];
            let sgd = OptParams::new(graphscale::config::Optimizer::Sgd, 0.0);
            group.bench_function(format!("scatter_add_{dt:?}"), |b| {
                b.iter(|| shard.apply(&sgd, 1.0, idx.iter().map(|&r| (r, grad.as_slice()))))
            });
        }
        group.finish();
        c.final_summary();
    });
}

fn rows_codec(c: &mut Criterion) {
    let dim = 128;
    let n = 4096;
    let data: Vec<f32> = (0..n * dim).map(|i| (i % 97) as f32 * 0.01).collect();
    let mut g = c.benchmark_group("row_codec");
    g.throughput(Throughput::Elements(n as u64));
    for dt in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        let mut bytes = vec![0u8; n * dim * dt.size()];
        let rb = dim * dt.size();
        g.bench_function(format!("encode_{dt:?}"), |b| {
            b.iter(|| {
                for (r, out) in data.chunks_exact(dim).zip(bytes.chunks_exact_mut(rb)) {
                    encode_row(dt, r, out);
                }
            })
        });
        let mut back = vec![0f32; n * dim];
        g.bench_function(format!("decode_{dt:?}"), |b| {
            b.iter(|| {
                for (inp, out) in bytes.chunks_exact(rb).zip(back.chunks_exact_mut(dim)) {
                    decode_row(dt, inp, out);
                }
            })
        });
    }
    // int8 on the wire: rows to nearest, deltas dithered, against the serial-generator encoder
    // it replaced (kept here as the baseline of the same invocation).
    let wb = WireDtype::Int8.row_bytes(dim);
    let mut bytes = vec![0u8; n * wb];
    for (name, dither) in [("nearest", None), ("dithered", Some(7u64))] {
        g.bench_function(format!("encode_int8_{name}"), |b| {
            b.iter(|| {
                for (i, (r, out)) in data
                    .chunks_exact(dim)
                    .zip(bytes.chunks_exact_mut(wb))
                    .enumerate()
                {
                    encode_wire(WireDtype::Int8, r, out, dither.map(|d| d ^ i as u64));
                }
            })
        });
        g.bench_function(format!("encode_int8_{name}_serial_baseline"), |b| {
            b.iter(|| {
                for (i, (r, out)) in data
                    .chunks_exact(dim)
                    .zip(bytes.chunks_exact_mut(wb))
                    .enumerate()
                {
                    encode_int8_serial(r, out, dither.map(|d| d ^ i as u64));
                }
            })
        });
    }
    let mut back = vec![0f32; n * dim];
    g.bench_function("decode_int8", |b| {
        b.iter(|| {
            for (inp, out) in bytes.chunks_exact(wb).zip(back.chunks_exact_mut(dim)) {
                decode_wire(WireDtype::Int8, inp, out);
            }
        })
    });
    g.finish();
}

/// The int8 encoder before session 26: one xorshift64 generator stepped per value.
fn encode_int8_serial(row: &[f32], bytes: &mut [u8], dither: Option<u64>) {
    let top = row.iter().fold(0f32, |a, x| a.max(x.abs()));
    let scale = top / 127.0;
    bytes[..4].copy_from_slice(&scale.to_le_bytes());
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let mut h = dither.map(|d| d.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    for (x, b) in row.iter().zip(&mut bytes[4..]) {
        let u = match &mut h {
            None => 0.5,
            Some(h) => {
                *h ^= *h << 13;
                *h ^= *h >> 7;
                *h ^= *h << 17;
                (*h >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
            }
        };
        *b = (x * inv + u).floor().clamp(-127.0, 127.0) as i8 as u8;
    }
}

fn alias_draws(c: &mut Criterion) {
    let w: Vec<f64> = (1..=1_000_000)
        .map(|i| (f64::from(i)).powf(-0.75))
        .collect();
    let t = AliasTable::new(w.clone()).expect("weights");
    let mut rng = rng_for(2, 0, 0);
    let mut g = c.benchmark_group("alias");
    g.throughput(Throughput::Elements(1024));
    g.bench_function("draw_1M_entries", |b| {
        b.iter(|| (0..1024).map(|_| t.sample(&mut rng)).sum::<usize>())
    });
    g.finish();
}

criterion_group!(
    benches,
    skipgram,
    skipgram_in_place,
    skipgram_segments,
    line_in_place,
    walks_and_rows,
    rows_codec,
    alias_draws
);
criterion_main!(benches);

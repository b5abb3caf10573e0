//! Criterion benchmarks of the hot kernels, with throughput in elements so that results read as
//! pairs/s, rows/s or draws/s. Roofline: a skip-gram pair with K negatives at d = 128 does
//! ~(1 + K) * 3 * 2 * d flops on (2 + K) rows of d * 4 bytes. Run: `cargo bench --bench kernels`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::RngExt;

use graphscale::config::Dtype;
use graphscale::model::sgns;
use graphscale::sample::alias::AliasTable;
use graphscale::sample::rng_for;
use graphscale::store::{decode_row, encode_row};

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
            b.iter(|| sgns::sgd_in_place(&centers, &targets, &[], dim, &pairs, &negs, k, 1e-4))
        });
    }
    g.finish();
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
    g.finish();
}

fn alias_draws(c: &mut Criterion) {
    let w: Vec<f64> = (1..=1_000_000)
        .map(|i| (f64::from(i)).powf(-0.75))
        .collect();
    let t = AliasTable::new(&w).expect("weights");
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
    rows_codec,
    alias_draws
);
criterion_main!(benches);

//! Scale-out keeps the model: BlogCatalog (a real graph with hubs: degrees 1 to 3,992) trained
//! by DeepWalk at 1 rank and at 8 ranks under real `mpirun`, as 8 simulated nodes
//! (`--ranks-per-node 1`) and as 4 nodes of 2 ranks, must reach the same Micro-F1 and loss.
//! Before copies of a row were combined by its owner (`train::cache`), 8 nodes gave 28.9 and
//! 4 x 2 gave 22.6 against 38.2 (issue 32), and their loss per term was 2.8x and 4x the 1-rank run's.
//! The walk models' default step then shrank with the hub's share and the nodes (8 nodes:
//! 7,168 pairs per step).
mod common;
use common::*;
use std::path::PathBuf;

fn blogcatalog() -> (PathBuf, PathBuf) {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/blogcatalog");
    assert!(
        d.join("edges.tsv").exists(),
        "{} is missing: the scale-out test needs BlogCatalog (CI has ../shared/data)",
        d.display()
    );
    (d.join("edges.tsv"), d.join("labels.tsv"))
}

fn loss_per_term(ms: &[serde_json::Value]) -> f64 {
    let loss: f64 = ms.iter().map(|m| m["loss_sum"].as_f64().unwrap()).sum();
    loss / sum(ms, "loss_terms") as f64
}

#[test]
fn eight_ranks_as_nodes_keep_the_one_rank_quality_on_a_graph_with_hubs() {
    let (edges, labels) = blogcatalog();
    let t = tmp();
    let g = p(t.path(), "bc.h5");
    let o = run(120, &["convert", s(&edges), "-o", s(&g)]);
    assert_eq!(o.code, 0, "{}", o.all());
    let train = |name: &str, threads: &str| -> Vec<String> {
        let (e, m) = (
            p(t.path(), &format!("{name}.h5")),
            p(t.path(), &format!("{name}.jsonl")),
        );
        [
            "--graph",
            s(&g),
            "--dim",
            "64",
            "--walks-per-node",
            "10",
            "--walk-length",
            "80",
            "--window",
            "10",
            "--seed",
            "3",
            "--threads",
            threads,
            "--comm-timeout",
            "120",
            "-o",
            s(&e),
            "--metrics",
            s(&m),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect()
    };
    let a = train("one", "2");
    let o = run(300, &a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(o.code, 0, "{}", o.all());
    let f1_one = micro_f1(&p(t.path(), "one.h5"), &labels);
    let loss_one = loss_per_term(&metrics(&p(t.path(), "one.jsonl")));
    for (name, rpn) in [("nodes8", "1"), ("nodes4x2", "2")] {
        let mut a = train(name, "1");
        a.extend(["--ranks-per-node".to_string(), rpn.to_string()]);
        let o = mpirun(8, 600, &a.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(o.code, 0, "{name}: {}", o.all());
        // The step follows the hub's copies: 7 ranks on other nodes hold them at 8 nodes, 6
        // at 4 nodes of 2 ranks (config::default_walk_batch).
        let step = if rpn == "1" { "7168" } else { "8192" };
        assert!(
            o.all()
                .contains(&format!("--batch-size {step} pairs per step")),
            "{name}: {}",
            o.all()
        );
        let ms = metrics(&p(t.path(), &format!("{name}.jsonl")));
        assert_eq!(ms.len(), 8);
        // The remote path ran: rows moved, and copies that synchronised together and saturated were damped.
        assert!(
            sum(&ms, "push_bytes_sent") > 0 && sum(&ms, "cache_deltas_damped") > 0,
            "{name}"
        );
        let f1 = micro_f1(&p(t.path(), &format!("{name}.h5")), &labels);
        let loss = loss_per_term(&ms);
        eprintln!("{name}: Micro-F1 {f1:.4} (1 rank {f1_one:.4}), loss per term {loss:.3} ({loss_one:.3})");
        // Measured (d 64): 1 rank 0.439, 8 nodes 0.452, 4 x 2 0.443 (every 128th group's loss,
        // before the kernel picked its sample by a hash, read 0.453, 0.500 and 0.487); summed
        // copies gave 1.28 and 1.80 (d 128).
        assert!(
            loss < 1.2 * loss_one,
            "{name}: loss per term {loss:.3} against {loss_one:.3} at 1 rank"
        );
        // Single runs spread by about 0.5 point; summed copies lost 6 to 15.
        assert!(
            f1 > f1_one - 0.025,
            "{name}: Micro-F1 {f1:.4} against {f1_one:.4} at 1 rank"
        );
    }
}

#[test]
fn a_cache_clock_past_the_bound_is_refused_on_every_rank() {
    let t = tmp();
    let g = rmat(t.path(), 10, 8);
    let e = p(t.path(), "e.h5");
    let o = mpirun(
        4,
        60,
        &[
            "--graph",
            s(&g),
            "--ranks-per-node",
            "1",
            "--threads",
            "1",
            "--cache-refresh",
            "9",
            "--comm-timeout",
            "30",
            "-o",
            s(&e),
        ],
    );
    assert_ne!(o.code, 0, "{}", o.all());
    assert!(
        o.all().contains("--cache-refresh 9 with 4 ranks"),
        "{}",
        o.all()
    );
    assert!(o.all().contains("at most 8"), "{}", o.all());
    assert!(!e.exists(), "no embeddings from a refused run");
    // At the bound it trains.
    let o = mpirun(
        4,
        120,
        &[
            "--graph",
            s(&g),
            "--ranks-per-node",
            "1",
            "--threads",
            "1",
            "--cache-refresh",
            "8",
            "--walks-per-node",
            "1",
            "--walk-length",
            "10",
            "--dim",
            "16",
            "--comm-timeout",
            "60",
            "-o",
            s(&e),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
}

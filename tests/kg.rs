//! Knowledge-graph embeddings end to end: convert triples, train each model (in process, and
//! under mpirun with simulated nodes), rank with `eval kg`; and the bad inputs of the
//! knowledge-graph path, refused with the file and line on every rank.

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// A knowledge graph a symmetric model can complete: 150 partner pairs under relation `mate`
/// (both directions in training for 70% of the pairs, one direction for the rest, whose
/// reverse is the test or validation set) and 300 random `noise` triples.
fn partner_kg(d: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (mut train, mut valid, mut test) = (String::new(), String::new(), String::new());
    let mut x = 12345u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..150u64 {
        let (a, b) = (2 * i, 2 * i + 1);
        train.push_str(&format!("e{a}\tmate\te{b}\n"));
        match i % 10 {
            0 | 1 => test.push_str(&format!("e{b}\tmate\te{a}\n")),
            2 => valid.push_str(&format!("e{b}\tmate\te{a}\n")),
            _ => train.push_str(&format!("e{b}\tmate\te{a}\n")),
        }
    }
    for _ in 0..300 {
        let (a, b) = (next() % 300, next() % 300);
        train.push_str(&format!("e{a}\tnoise\te{b}\n"));
    }
    convert_kg(d, &train, &valid, &test)
}

/// A knowledge graph a translation or rotation model can complete: 100 triangles
/// (a, s, b), (b, u, c) and (a, r, c); r = s + u is the composition, held out for 20% of the
/// triangles (the test set) and 10% (validation).
fn triangle_kg(d: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (mut train, mut valid, mut test) = (String::new(), String::new(), String::new());
    for i in 0..100u64 {
        let (a, b, c) = (3 * i, 3 * i + 1, 3 * i + 2);
        train.push_str(&format!("e{a}\ts\te{b}\ne{b}\tu\te{c}\n"));
        let r = format!("e{a}\tr\te{c}\n");
        match i % 10 {
            0 | 1 => test.push_str(&r),
            2 => valid.push_str(&r),
            _ => train.push_str(&r),
        }
    }
    convert_kg(d, &train, &valid, &test)
}

/// Write and convert train/valid/test text (valid and test with the training ids). Returns
/// (train, valid, test) h5.
fn convert_kg(d: &Path, train: &str, valid: &str, test: &str) -> (PathBuf, PathBuf, PathBuf) {
    let names = [("train", train), ("valid", valid), ("test", test)];
    for (n, text) in &names {
        std::fs::write(p(d, &format!("{n}.txt")), text).unwrap();
    }
    let th = p(d, "train.h5");
    let o = run(
        30,
        &[
            "convert",
            "--triples",
            s(&p(d, "train.txt")),
            "--names-from",
            &format!("{},{}", s(&p(d, "valid.txt")), s(&p(d, "test.txt"))),
            "-o",
            s(&th),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(o.stdout.contains("300 entities"), "{}", o.stdout);
    for n in ["valid", "test"] {
        let o = run(
            30,
            &[
                "convert",
                "--triples",
                s(&p(d, &format!("{n}.txt"))),
                "--vocab-from",
                s(&th),
                "-o",
                s(&p(d, &format!("{n}.h5"))),
            ],
        );
        assert_eq!(o.code, 0, "{}", o.all());
    }
    (th, p(d, "valid.h5"), p(d, "test.h5"))
}

/// The training flags the small planted graphs use: `model` for `epochs` epochs at d 32, 128
/// triples per step, 64 negatives shared by chunks of 16.
fn kg_args<'a>(train: &'a Path, model: &'a str, epochs: &'a str) -> Vec<&'a str> {
    vec![
        "--graph",
        s(train),
        "--model",
        model,
        "--dim",
        "32",
        "--epochs",
        epochs,
        "--batch-size",
        "128",
        "--negatives",
        "64",
        "--shared-negatives",
        "16",
    ]
}

/// Every rank its own simulated node, one thread each, with metrics and output.
fn simulated_nodes<'a>(metrics: &'a Path, emb: &'a Path) -> [&'a str; 10] {
    [
        "--threads",
        "1",
        "--ranks-per-node",
        "1",
        "--comm-timeout",
        "60",
        "--metrics",
        s(metrics),
        "-o",
        s(emb),
    ]
}

fn eval_kg(emb: &Path, test: &Path, filter: &[&Path]) -> serde_json::Value {
    let f: Vec<&str> = filter.iter().map(|x| s(x)).collect();
    let o = run(
        120,
        &[
            "eval",
            "kg",
            "--embeddings",
            s(emb),
            "--test",
            s(test),
            "--filter",
            &f.join(","),
            "--json",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    serde_json::from_str(o.stdout.trim()).unwrap()
}

#[test]
fn every_model_completes_a_planted_knowledge_graph() {
    let d = tmp();
    let partners = partner_kg(d.path());
    let dd = p(d.path(), "triangles");
    std::fs::create_dir_all(&dd).unwrap();
    let triangles = triangle_kg(&dd);
    // Random ranking gives MRR about 0.02 here (300 entities). Symmetric relations suit
    // DistMult and ComplEx, compositions TransE and RotatE (TransE cannot model symmetry).
    for (model, epochs, want) in [
        ("distmult", "60", 0.6),
        ("complex", "60", 0.6),
        ("transe", "100", 0.3),
        ("rotate", "100", 0.3),
    ] {
        let (train, valid, test) = if matches!(model, "distmult" | "complex") {
            &partners
        } else {
            &triangles
        };
        let emb = p(d.path(), &format!("{model}.h5"));
        let mut args = kg_args(train, model, epochs);
        args.extend_from_slice(&["--threads", "2", "-o", s(&emb)]);
        let o = run(120, &args);
        assert_eq!(o.code, 0, "{model}: {}", o.all());
        let m = eval_kg(&emb, test, &[train, valid]);
        let mrr = m["mrr"].as_f64().unwrap();
        assert!(
            mrr > want,
            "{model}: filtered MRR {mrr} (want > {want}): {m}"
        );
        for k in ["mr", "hits@1", "hits@3", "hits@10"] {
            assert!(m[k].as_f64().is_some(), "{model}: no {k} in {m}");
        }
        assert_eq!(
            m["triples"],
            if matches!(model, "distmult" | "complex") {
                30
            } else {
                20
            }
        );
    }
}

#[test]
fn distmult_trains_across_simulated_nodes_to_the_same_quality() {
    let d = tmp();
    let (train, valid, test) = partner_kg(d.path());
    let emb = p(d.path(), "dm4.h5");
    let metrics = p(d.path(), "m.jsonl");
    let o = mpirun(
        4,
        180,
        &[
            &kg_args(&train, "distmult", "60")[..],
            &simulated_nodes(&metrics, &emb),
            &["--valid", s(&valid), "--valid-every", "30"],
        ]
        .concat(),
    );
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(o.stderr.contains("epoch 30: valid MRR"), "{}", o.stderr);
    let m = eval_kg(&emb, &test, &[&train, &valid]);
    let mrr = m["mrr"].as_f64().unwrap();
    assert!(mrr > 0.6, "4 simulated nodes: filtered MRR {mrr}: {m}");
    // The ranking distributed over 3 ranks (each scoring its stripe of entities) is the
    // single process's, exactly.
    let filter = format!("{},{}", s(&train), s(&valid));
    let o = mpirun(
        3,
        120,
        &[
            "eval",
            "kg",
            "--embeddings",
            s(&emb),
            "--test",
            s(&test),
            "--filter",
            &filter,
            "--json",
            "--comm-timeout",
            "60",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    let dist: serde_json::Value = serde_json::from_str(o.stdout.trim()).unwrap();
    assert_eq!(dist, m, "3 ranks against 1 process");
    // Every rank trained its share of the triples and pushed gradients of remote entities.
    let ms = common::metrics(&metrics);
    assert_eq!(ms.len(), 4);
    let pairs: u64 = ms.iter().map(|m| m["pairs"].as_u64().unwrap()).sum();
    // 150 pairs one way, 105 of them also the other way, 300 noise triples.
    let triples = 150 + 105 + 300;
    assert_eq!(pairs, 60 * triples, "every triple once per epoch");
    assert!(ms
        .iter()
        .all(|m| m["push_bytes_sent"].as_u64().unwrap() > 0));
    // Validation after epochs 30 and 60, the same on every rank, and far better at the end
    // than chance (300 entities: about 0.02).
    let v0 = &ms[0]["valid"];
    assert_eq!(v0.as_array().unwrap().len(), 2, "{v0}");
    assert_eq!(v0[1][0].as_f64(), Some(60.0));
    assert!(v0[1][1].as_f64().unwrap() > 0.3, "{v0}");
    assert!(ms.iter().all(|m| &m["valid"] == v0));
}

#[test]
fn shard_negatives_keep_negative_rows_at_home_and_bf16_halves_the_push() {
    // `--negatives-from shard`: a rank draws its negatives from its own entities, so its
    // remote rows are its positives' heads and tails alone (at most two per triple), against
    // many more when negatives come from every entity. `--wire-dtype bf16` pushes the same
    // gradient rows in half the bytes. Each run still completes the graph.
    let d = tmp();
    let (train, valid, test) = partner_kg(d.path());
    let mut got = Vec::new();
    for (name, from, wire) in [
        ("shard", "shard", "f32"),
        ("bf16", "shard", "bf16"),
        ("all", "all", "f32"),
    ] {
        let emb = p(d.path(), &format!("{name}.h5"));
        let metrics = p(d.path(), &format!("{name}.jsonl"));
        let o = mpirun(
            2,
            180,
            &[
                &kg_args(&train, "distmult", "60")[..],
                &simulated_nodes(&metrics, &emb),
                &["--negatives-from", from, "--wire-dtype", wire],
            ]
            .concat(),
        );
        assert_eq!(o.code, 0, "{name}: {}", o.all());
        let ms = common::metrics(&metrics);
        let sum = |k: &str| -> u64 { ms.iter().map(|m| m[k].as_u64().unwrap()).sum() };
        got.push((sum("remote_rows"), sum("pairs"), sum("push_bytes_sent")));
        let m = eval_kg(&emb, &test, &[&train, &valid]);
        let mrr = m["mrr"].as_f64().unwrap();
        assert!(mrr > 0.6, "{name}: filtered MRR {mrr}: {m}");
    }
    let [(shard, pairs, push), (bf_rows, _, bf_push), (all, _, _)] = got[..] else {
        unreachable!()
    };
    assert!(
        shard <= 2 * pairs,
        "shard: {shard} remote rows for {pairs} triples"
    );
    assert!(
        2 * all > 3 * shard,
        "remote rows: {all} from every entity against {shard} from the shard"
    );
    // The same rows (the draws do not depend on values), each a 4-byte header and d 32 values.
    assert_eq!(bf_rows, shard);
    assert_eq!(
        bf_push * (4 + 4 * 32),
        push * (4 + 2 * 32),
        "{bf_push} against {push}"
    );
}

/// The command failed and its error names every one of `wants`.
fn refused(o: Out, wants: &[&str]) {
    assert_ne!(o.code, 0, "{}", o.all());
    for w in wants {
        assert!(o.stderr.contains(w), "no '{w}' in: {}", o.stderr);
    }
}

#[test]
fn bad_knowledge_graph_input_is_named_and_refused() {
    let d = tmp();
    let (train, _valid, test) = partner_kg(d.path());
    let x = p(d.path(), "x.h5");
    // Two columns: the file and line.
    let two = p(d.path(), "two.txt");
    std::fs::write(&two, "a\tr\tb\nc\td\n").unwrap();
    let convert = |args: &[&str]| {
        run(
            30,
            &[&["convert", "--triples"], args, &["-o", s(&x)]].concat(),
        )
    };
    refused(convert(&[s(&two)]), &["two.txt:2", "found 2 fields"]);
    // A test entity or relation absent from training.
    let unk = p(d.path(), "unk.txt");
    std::fs::write(&unk, "e1\tmate\te0\ne1\tmate\tnobody\n").unwrap();
    refused(
        convert(&[s(&unk), "--vocab-from", s(&train)]),
        &["unk.txt:2", "entity 'nobody'"],
    );
    // A relation id beyond the table.
    let bad_rel = p(d.path(), "badrel.h5");
    {
        let mut w = graphscale::graph::h5::EdgeWriter::create_triples(&bad_rel).unwrap();
        w.push_triple(0, 0, 1).unwrap();
        w.push_triple(1, 7, 2).unwrap();
        let names: Vec<String> = (0..3).map(|i| format!("e{i}")).collect();
        w.finish_triples(&names, &["r0".to_string(), "r1".to_string()])
            .unwrap();
    }
    // Every rank ends, non-zero, before training.
    let train_on = |graph: &Path, model: &str| {
        let args = ["--graph", s(graph), "--model", model, "--dim", "8"];
        mpirun(
            2,
            60,
            &[&args[..], &["--comm-timeout", "30", "-o", s(&x)]].concat(),
        )
    };
    refused(
        train_on(&bad_rel, "distmult"),
        &["badrel.h5", "relation id 7 >= num_relations 2"],
    );
    // A knowledge-graph model given a plain graph, and a walk model given triples.
    let (plain, _) = sbm(d.path(), 100, 2);
    refused(
        train_on(&plain, "complex"),
        &["no dataset 'rel'", "convert --triples"],
    );
    refused(
        train_on(&train, "deepwalk"),
        &["knowledge graph", "--model distmult"],
    );
    // Knowledge-graph flags on a walk model; hogwild on a knowledge-graph model.
    refused(
        run(
            30,
            &[
                "--graph",
                s(&plain),
                "--model",
                "deepwalk",
                "--loss",
                "softmax",
            ],
        ),
        &["--loss applies to the knowledge-graph models"],
    );
    refused(
        run(
            30,
            &[
                "--graph",
                s(&train),
                "--model",
                "rotate",
                "--update",
                "hogwild",
            ],
        ),
        &["drop --update hogwild"],
    );
    // Ranking embeddings of a walk model.
    let walk_emb = p(d.path(), "walk.h5");
    let o = run(
        60,
        &[
            "--graph",
            s(&plain),
            "--walks-per-node",
            "1",
            "--walk-length",
            "10",
            "--dim",
            "8",
            "-o",
            s(&walk_emb),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    refused(
        run(
            30,
            &[
                "eval",
                "kg",
                "--embeddings",
                s(&walk_emb),
                "--test",
                s(&test),
            ],
        ),
        &["not a knowledge-graph model"],
    );
}

/// `--patience`: a learning rate too small to move the rows leaves the validation MRR flat, so
/// training stops after the patience's validations, on every rank at the same epoch; without
/// `--valid` the flag is refused.
#[test]
fn patience_stops_training_when_validation_stalls() {
    let d = tmp();
    let (train, valid, _) = partner_kg(d.path());
    let (emb, metrics) = (p(d.path(), "dm.h5"), p(d.path(), "m.jsonl"));
    let mut a = vec![
        "--graph",
        s(&train),
        "--model",
        "distmult",
        "--dim",
        "16",
        "--epochs",
        "50",
        "--lr",
        "1e-9",
        "--threads",
        "1",
        "--comm-timeout",
        "60",
        "--metrics",
        s(&metrics),
        "-o",
        s(&emb),
    ];
    let o = run(60, &[&a[..], &["--patience", "2"]].concat());
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("give --valid"), "{}", o.stderr);
    a.extend_from_slice(&[
        "--valid",
        s(&valid),
        "--valid-every",
        "1",
        "--patience",
        "2",
    ]);
    let o = mpirun(2, 120, &a);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(o.stderr.contains("stopping early"), "{}", o.stderr);
    let ms = common::metrics(&metrics);
    for m in &ms {
        // The first validation sets the best; two more without a rise stop it after epoch 3.
        assert_eq!(m["stopped_at_epoch"].as_u64(), Some(3), "{m}");
        assert_eq!(m["valid"].as_array().unwrap().len(), 3, "{m}");
    }
    assert!(emb.exists(), "the rows of the last epoch are written");
}

/// Checkpoints of a knowledge-graph run hold the entity rows and the relations with their
/// optimizer state: a run killed mid-epoch resumes at another rank count to full quality, and
/// resuming the finished run trains nothing and scores exactly as its output did. (Its triples
/// weigh by `--triple-weights subsampling`, counted at each rank count.)
#[test]
fn a_killed_knowledge_graph_run_resumes_with_its_relations() {
    let d = tmp();
    let (train, valid, test) = partner_kg(d.path());
    let (emb, ck, metrics) = (
        p(d.path(), "dm.h5"),
        p(d.path(), "ck"),
        p(d.path(), "m.jsonl"),
    );
    let mut args = kg_args(&train, "distmult", "60");
    // Triple weights counted over the ranks' shares at 2 ranks and again at 3.
    args.extend_from_slice(&[
        "--triple-weights",
        "subsampling",
        "--threads",
        "1",
        "--comm-timeout",
        "60",
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "20",
        "--metrics",
        s(&metrics),
        "-o",
        s(&emb),
    ]);
    // About 5 steps per epoch: the kill at step 153 follows checkpoints every 20 steps.
    let killed = [&args[..], &["--inject-fault", "rank=1,step=153,kind=kill"]].concat();
    let o = mpirun(2, 120, &killed);
    assert_ne!(o.code, 0, "a killed run must fail: {}", o.all());
    assert_ne!(o.code, 124, "the job hung: {}", o.all());
    assert!(ck.join("LATEST").exists(), "nothing committed: {}", o.all());

    let resumed = [&args[..], &["--resume", s(&ck)]].concat();
    let o = mpirun(3, 120, &resumed);
    assert_eq!(o.code, 0, "{}", o.all());
    let tail = o
        .stderr
        .split("(2 ranks then, 3 now; step ")
        .nth(1)
        .unwrap_or_else(|| panic!("no resume line: {}", o.stderr));
    let step: u64 = tail[..tail.find(')').unwrap()].parse().unwrap();
    assert!(
        step.is_multiple_of(20) && (40..=140).contains(&step),
        "step {step}"
    );
    let m = eval_kg(&emb, &test, &[&train, &valid]);
    let mrr = m["mrr"].as_f64().unwrap();
    assert!(mrr > 0.6, "resumed at 3 ranks: filtered MRR {mrr}: {m}");
    // Only the epochs after the checkpoint were trained: 5 steps and 555 triples an epoch.
    let ms = common::metrics(&metrics);
    let pairs: u64 = ms.iter().map(|m| m["pairs"].as_u64().unwrap()).sum();
    assert_eq!(
        pairs,
        (60 - step / 5) * 555,
        "triples trained after step {step}"
    );

    // The finished run's last checkpoint: nothing left to train, the same rows and relations.
    std::fs::remove_file(&emb).unwrap();
    let o = mpirun(2, 120, &resumed);
    assert_eq!(o.code, 0, "{}", o.all());
    let again = eval_kg(&emb, &test, &[&train, &valid]);
    assert_eq!(
        again, m,
        "the finished run's checkpoint scores as its output"
    );
    let ms = common::metrics(&metrics);
    assert!(ms.iter().all(|m| m["pairs"].as_u64() == Some(0)), "{ms:?}");
}

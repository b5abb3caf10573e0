//! `graphscale report`: tables and plots of several runs, and clear errors for metrics files it
//! cannot read (older format, several runs in one file, a truncated file).

mod common;

use common::*;

#[test]
fn report_tables_and_plots_of_runs() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 600, 3);
    let emb = p(d.path(), "emb.h5");
    let mut files = Vec::new();
    for (ranks, strategy) in [("1", "sharded"), ("2", "sharded"), ("2", "replicated")] {
        let m = p(d.path(), &format!("{strategy}_{ranks}.jsonl"));
        let mut a = walk_args(s(&g), s(&emb), s(&m));
        a.extend_from_slice(&["--ranks", ranks, "--strategy", strategy]);
        let o = run(120, &a);
        assert_eq!(o.code, 0, "{}", o.all());
        files.push(m);
    }
    let out = p(d.path(), "report");
    let mut a = vec!["report", "-o", s(&out)];
    a.extend(files.iter().map(|f| s(f)));
    let o = run(120, &a);
    assert_eq!(o.code, 0, "{}", o.all());
    for f in ["runs.csv", "ranks.csv", "timeline.csv"] {
        assert!(out.join(f).exists(), "{f}");
    }
    for plot in [
        "speedup",
        "efficiency",
        "phases",
        "bytes_per_pair",
        "memory",
        "balance",
        "throughput",
    ] {
        let svg = std::fs::read_to_string(out.join(format!("{plot}.svg"))).expect(plot);
        assert!(svg.contains("<svg") && svg.len() > 2000, "{plot}");
        if std::path::Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() {
            let png = std::fs::read(out.join(format!("{plot}.png"))).expect(plot);
            assert_eq!(&png[1..4], b"PNG", "{plot}");
        }
    }
    let csv = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 3, "{csv}");
    let head: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = |name: &str| head.iter().position(|h| *h == name).expect(name);
    // The 1-rank run is the base: speed-up 1; the others are measured against it.
    let base = rows.iter().find(|r| r[col("ranks")] == "1").unwrap();
    assert_eq!(base[col("speedup")], "1.0000", "{csv}");
    for r in &rows {
        let (pps, sp): (f64, f64) = (
            r[col("pairs_per_second")].parse().unwrap(),
            r[col("speedup")].parse().unwrap(),
        );
        let base_pps: f64 = base[col("pairs_per_second")].parse().unwrap();
        assert!((sp - pps / base_pps).abs() < 1e-3, "{csv}");
    }
    // Two ranks: every byte is counted, and the replicated run moves more per pair.
    let bpp = |strategy: &str| -> f64 {
        rows.iter()
            .find(|r| r[col("strategy")].starts_with(strategy) && r[col("ranks")] == "2")
            .unwrap()[col("bytes_per_pair")]
        .parse()
        .unwrap()
    };
    assert!(
        bpp("replicated") > bpp("sharded") && bpp("sharded") > 0.0,
        "{csv}"
    );
    let timeline = std::fs::read_to_string(out.join("timeline.csv")).unwrap();
    assert!(timeline.lines().count() > 5, "{timeline}");
}

#[test]
fn report_refuses_metrics_it_cannot_read() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 300, 3);
    let emb = p(d.path(), "emb.h5");
    let (one, two) = (p(d.path(), "one.jsonl"), p(d.path(), "two.jsonl"));
    for (m, ranks) in [(&one, "1"), (&two, "2")] {
        let mut a = walk_args(s(&g), s(&emb), s(m));
        a.extend_from_slice(&["--ranks", ranks]);
        assert_eq!(run(120, &a).code, 0);
    }
    let text = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
    let mixed = p(d.path(), "mixed.jsonl");
    std::fs::write(&mixed, text(&one) + &text(&two)).unwrap();
    let old = p(d.path(), "old.jsonl");
    let stripped: String = text(&one)
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("strategy");
            v.to_string() + "\n"
        })
        .collect();
    std::fs::write(&old, stripped).unwrap();
    let short = p(d.path(), "short.jsonl");
    std::fs::write(&short, text(&two).lines().next().unwrap()).unwrap();
    let cases = [
        (&mixed, "records of two runs in one file"),
        (&old, "written by an older graphscale"),
        (&short, "1 records for a run of 2 ranks"),
    ];
    for (f, named) in cases {
        let o = run(60, &["report", "-o", s(&p(d.path(), "r")), s(f)]);
        assert_eq!(o.code, 1, "{}", o.all());
        assert!(
            o.stderr.contains(named) && o.stderr.contains(s(f)),
            "{}",
            o.stderr
        );
    }
    let o = run(60, &["report", "-o", s(&p(d.path(), "r"))]);
    assert_eq!(o.code, 2, "{}", o.all());
}

#[test]
fn plan_prints_both_strategies_refuses_what_does_not_fit_and_calibrates() {
    let big = [
        "plan",
        "--nodes",
        "1e9",
        "--edges",
        "9.2e10",
        "--dim",
        "128",
        "--dtype",
        "f16",
        "--optimizer",
        "momentum",
        "--ranks",
        "80",
        "--ranks-per-node",
        "8",
    ];
    let mut a = big.to_vec();
    a.extend_from_slice(&["--mem-per-node", "700G"]);
    let o = run(30, &a);
    assert_eq!(o.code, 0, "{}", o.all());
    for s in [
        "sharded",
        "replicated-sparse",
        "replicated-dense",
        "per node",
        "s/epoch",
    ] {
        assert!(o.stdout.contains(s), "{s}: {}", o.stdout);
    }
    // Every rank would hold all 1e9 rows and their momentum: far over 700G per node.
    assert!(
        o.stdout.contains("replicated-sparse: needs")
            && o.stdout.contains("more than --mem-per-node"),
        "{}",
        o.stdout
    );
    let mut a = big.to_vec();
    a.extend_from_slice(&["--mem-per-node", "100G"]);
    let o = run(30, &a);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("the plan does not fit")
            && o.stderr.contains("more than --mem-per-node 100.0 GiB"),
        "{}",
        o.stderr
    );
    let o = run(
        30,
        &["plan", "--nodes", "0", "--edges", "10", "--ranks", "2"],
    );
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("--nodes must be a positive number"),
        "{}",
        o.stderr
    );

    // Calibrated from a measured 2-rank run: the rates are that run's.
    let d = tmp();
    let (g, _) = sbm(d.path(), 600, 3);
    let (emb, m) = (p(d.path(), "emb.h5"), p(d.path(), "m.jsonl"));
    let mut a = walk_args(s(&g), s(&emb), s(&m));
    a.extend_from_slice(&["--ranks", "2"]);
    assert_eq!(run(120, &a).code, 0);
    let o = run(
        30,
        &[
            "plan",
            "--nodes",
            "600",
            "--edges",
            "3000",
            "--dim",
            "32",
            "--ranks",
            "2",
            "--calibrate",
            s(&m),
            "--json",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert!(
        v["rates"]["source"]
            .as_str()
            .unwrap()
            .contains("calibrated"),
        "{v}"
    );
    let ppt = v["rates"]["pairs_per_token"].as_f64().unwrap();
    assert!(ppt > 1.0 && ppt < 21.0, "{v}");
    assert_eq!(v["plans"].as_array().unwrap().len(), 3);
}

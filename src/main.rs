//! The `graphscale` binary: parse, start SPMD, dispatch, map errors to exit codes.
//! Exit codes: 0 success, 1 failure (every rank agrees), 2 usage error, 3 communication timeout.

use std::time::Duration;

use clap::Parser;

use graphscale::cli::{
    Cli, Command, ConvertCmd, EvalCmd, ExportCmd, GenerateCmd, InfoCmd, PlanCmd, ReportCmd,
    SelftestCmd, SplitCmd, TrainCmd,
};
use graphscale::comm::{local, mpi::MpiComm, Comm};
use graphscale::config::{Model, RawTrain, TrainConfig};
use graphscale::error::{Error, Result};
use graphscale::graph::{csr, generate, h5, text};
use graphscale::outfile::{self, Out};
use graphscale::spmd::{agree, install_panic_hook};
use graphscale::stats::summary_table;
use graphscale::{export, train};

/// Rank from the launcher's environment, known before MPI starts (to print usage errors once).
fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
}

fn main() {
    // Inputs are read by many ranks at once and often live on parallel file systems where
    // flock() is slow or unsupported; graphscale never writes a file another rank reads
    // concurrently, so HDF5's advisory locking only gets in the way.
    if std::env::var_os("HDF5_USE_FILE_LOCKING").is_none() {
        std::env::set_var("HDF5_USE_FILE_LOCKING", "FALSE");
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayVersion => {
            if launcher_rank().unwrap_or(0) == 0 {
                print_version();
            }
            std::process::exit(0);
        }
        Err(e) => {
            let rank = launcher_rank().unwrap_or(0);
            if rank == 0 || !e.use_stderr() {
                let _ = e.print();
            } else {
                // Let rank 0's message out before this rank's exit makes the launcher end the
                // job (and with it rank 0, perhaps before its stderr was forwarded).
                std::thread::sleep(Duration::from_secs(2));
            }
            std::process::exit(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();

    let code = match cli.command {
        Some(Command::Convert(c)) => serial(|| convert(&c)),
        Some(Command::Generate(g)) => serial(|| generate_cmd(&g)),
        Some(Command::Export(x)) => serial(|| export_cmd(&x)),
        Some(Command::Eval(EvalCmd::Linkpred {
            ref embeddings,
            ref test,
            score: graphscale::eval::linkpred::Score::Dot,
            corrupt,
            seed,
            json,
            ref mpi,
        })) => spmd(mpi, |c| {
            // The dot score runs on every rank of the job (one without mpirun).
            let r = graphscale::eval::linkpred::link_prediction_distributed(
                c, embeddings, test, corrupt, seed,
            )?;
            if c.rank() == 0 {
                print_linkpred(&r, graphscale::eval::linkpred::Score::Dot, json);
            }
            Ok(())
        }),
        Some(Command::Eval(EvalCmd::Kg {
            ref embeddings,
            ref test,
            ref filter,
            json,
            ref mpi,
        })) => spmd(mpi, |c| {
            // Ranks score their stripes of the entities (one process without mpirun).
            let t = std::time::Instant::now();
            let m = graphscale::eval::kg::evaluate(c, embeddings, test, filter)?;
            if c.rank() == 0 {
                print_kg(&m, json, t.elapsed().as_secs_f64());
            }
            Ok(())
        }),
        Some(Command::Eval(EvalCmd::Gnn {
            ref model,
            ref graph,
            json,
            ref mpi,
        })) => spmd(mpi, |c| {
            let r = graphscale::train::sage::evaluate(c, model, graph)?;
            if c.rank() == 0 {
                print_gnn(&r, json);
            }
            Ok(())
        }),
        Some(Command::Eval(e)) => serial(|| eval_cmd(&e)),
        Some(Command::Split(ref x)) => serial(|| split_cmd(x)),
        Some(Command::Reorder(ref x)) => serial(|| reorder_cmd(x)),
        Some(Command::Report(ref x)) => serial(|| report_cmd(x)),
        Some(Command::Plan(ref x)) => serial(|| plan_cmd(x)),
        Some(Command::Info(ref i)) => spmd(&i.mpi, |c| info(c, i)),
        Some(Command::Selftest(ref s)) => spmd(&s.mpi, |c| selftest(c, s)),
        Some(Command::Train(ref t)) if t.raw.graph.is_some() || t.config.is_some() => {
            spmd(&t.mpi, |c| train_cmd(c, t))
        }
        Some(Command::Train(_)) | None => {
            let t = match &cli.command {
                Some(Command::Train(t)) => t,
                _ => &cli.train,
            };
            if t.raw.graph.is_none() && t.config.is_none() {
                if launcher_rank().unwrap_or(0) == 0 {
                    use clap::CommandFactory;
                    eprintln!(
                        "graphscale: error: nothing to do: give --graph (an HDF5 edge file; see `graphscale convert`) or a subcommand\n\n{}\n\nFor more information, try '--help'.",
                        Cli::command().render_usage()
                    );
                } else {
                    // As for clap's usage errors: rank 0's message first.
                    std::thread::sleep(Duration::from_secs(2));
                }
                2
            } else {
                spmd(&cli.train.mpi, |c| train_cmd(c, &cli.train))
            }
        }
    };
    std::process::exit(code);
}

/// `--version`: release, commit, and the MPI and HDF5 libraries this binary runs with.
fn print_version() {
    let (h1, h2, h3) = hdf5::library_version();
    // MPI_Get_library_version is one of the calls allowed before MPI_Init.
    let mpi = mpi::environment::library_version()
        .map(|s| s.lines().next().unwrap_or("").trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let (v, sv) = mpi::environment::version();
    // One write, its error ignored: `graphscale --version | grep -q MPICH` closes the pipe
    // after the line it wanted, which must not make the command panic.
    let text = format!(
        "graphscale {}\nMPI: {mpi} (MPI {v}.{sv})\nHDF5: {h1}.{h2}.{h3}\n",
        graphscale::cli::LONG_VERSION
    );
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
}

/// A one-process command. Under a launcher only rank 0 runs it (the others would write the same
/// files or print the same lines): `serial` is called with the command unevaluated.
fn serial(f: impl FnOnce() -> Result<()>) -> i32 {
    if launcher_rank().is_some_and(|r| r != 0) {
        return 0;
    }
    match f() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("graphscale: error: {e}");
            1
        }
    }
}

/// Run `f` on every rank: under mpirun with MPI, else on `--ranks` threads. Every rank returns
/// the same agreed result; rank 0 reports it.
fn spmd(g: &graphscale::cli::Mpi, f: impl Fn(&Comm) -> Result<()> + Sync) -> i32 {
    let timeout = Duration::from_secs_f64(g.comm_timeout.max(1.0));
    let under_mpi = launcher_rank().is_some();
    let finish = |comm: &Comm, r: Result<()>| -> i32 {
        let r = agree(comm, r);
        match r {
            Ok(()) => 0,
            Err(e @ Error::Stopped(_)) => {
                if comm.rank() == 0 {
                    eprintln!("graphscale: {e}");
                }
                4
            }
            Err(e) => {
                if comm.rank() == 0 {
                    eprintln!("graphscale: error: {e}");
                }
                1
            }
        }
    };
    if under_mpi {
        let Some(comm) = MpiComm::init(timeout, g.ranks_per_node()) else {
            eprintln!("graphscale: MPI was already initialised");
            return 1;
        };
        let windows = comm.windows_work();
        let comm = Comm::Mpi(comm);
        install_panic_hook(comm.rank(), true);
        let r = if windows {
            f(&comm)
        } else {
            Err(Error::config(
                "MPI_Win_allocate fails on this MPI, and graphscale keeps its rows in RMA windows: \
                 Open MPI's `--mca osc rdma` needs an RDMA network (over TCP use `--mca osc ucx,sm`; \
                 on InfiniBand `--mca pml ucx --mca osc ucx,sm`); `ompi_info | grep osc` lists \
                 the components this Open MPI has",
            ))
        };
        finish(&comm, r)
    } else {
        install_panic_hook(0, false);
        let n = g.ranks.max(1);
        let per_node = g.ranks_per_node().unwrap_or(n);
        let codes = local::run_nodes(n, per_node, timeout, |comm| {
            let r = f(&comm);
            finish(&comm, r)
        });
        codes.into_iter().max().unwrap_or(0)
    }
}

fn convert(c: &ConvertCmd) -> Result<()> {
    let t = std::time::Instant::now();
    if let Some(input) = &c.triples {
        if c.directed || c.string_ids {
            return Err(Error::config(
                "--triples: triples are always directed with string ids; drop --directed and --string-ids",
            ));
        }
        let mut inputs = vec![("--triples", input.as_path())];
        inputs.extend(c.vocab_from.as_deref().map(|v| ("--vocab-from", v)));
        inputs.extend(c.names_from.iter().map(|n| ("--names-from", n.as_path())));
        let r = outfile::write_output(&c.output, &inputs, |tmp| {
            graphscale::graph::triples::convert(input, tmp, c.vocab_from.as_deref(), &c.names_from)
        })?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "converted {}: {} entities, {} relations, {} triples in {:.2} s -> {}",
            input.display(),
            r.entities,
            r.relations,
            r.triples,
            secs,
            c.output.display()
        );
        return Ok(());
    }
    let input = c
        .input
        .as_ref()
        .expect("clap requires input without --triples");
    let node_inputs = graphscale::graph::nodedata::Inputs {
        features: c.features.as_deref(),
        dtype: c.dtype,
        labels: c.labels.as_deref(),
        split: c.split.as_deref(),
        train_fraction: c.train_fraction,
        seed: c.seed,
    };
    let mut inputs = vec![("the input", input.as_path())];
    inputs.extend(c.features.as_deref().map(|p| ("--features", p)));
    inputs.extend(c.labels.as_deref().map(|p| ("--labels", p)));
    inputs.extend(c.split.as_deref().map(|p| ("--split", p)));
    let mut added = None;
    let r = outfile::write_output(&c.output, &inputs, |tmp| {
        let r = text::convert(input, tmp, c.directed, c.string_ids, c.keep_isolated)?;
        added = Some(graphscale::graph::nodedata::add(tmp, &node_inputs)?);
        Ok(r)
    })?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "converted {}: {} nodes, {} edges{} in {:.2} s ({:.0} edges/s) -> {}",
        input.display(),
        r.num_nodes,
        r.num_edges,
        if r.weighted { " (weighted)" } else { "" },
        secs,
        r.num_edges as f64 / secs.max(1e-9),
        c.output.display()
    );
    if r.isolated > 0 {
        println!(
            "note: {} of the {} rows have no edge (integer ids never used); they keep their random initial vectors",
            r.isolated, r.num_nodes
        );
    }
    if let Some(a) = added {
        if let Some(f) = a.features {
            println!(
                "features: {} columns, {} nonzeros on {} nodes ({:?})",
                f.columns, f.nonzeros, f.nodes, c.dtype
            );
        }
        if c.labels.is_some() {
            println!(
                "labels: {} classes on {} nodes{}{}",
                a.num_classes,
                a.labelled,
                if a.multilabel { " (multi-label)" } else { "" },
                a.split.map_or(String::new(), |[t, v, s]| format!(
                    "; split {t} train, {v} valid, {s} test"
                ))
            );
        }
    }
    Ok(())
}

fn generate_cmd(g: &GenerateCmd) -> Result<()> {
    match g {
        GenerateCmd::Sbm {
            nodes,
            blocks,
            avg_degree,
            mix,
            output,
            labels,
            seed,
            features,
            signal,
            train_fraction,
            dtype,
        } => {
            let mut outs = vec![Out {
                flag: "-o",
                path: output,
            }];
            outs.extend(labels.as_deref().map(|l| Out {
                flag: "--labels",
                path: l,
            }));
            outfile::check(&outs, &[])?;
            let lab = outfile::write_with(output, |tmp| {
                let lab = generate::sbm(tmp, *nodes, *blocks, *avg_degree, *mix, *seed)?;
                if let Some(f) = features {
                    let c = generate::Contextual {
                        features: *f,
                        signal: *signal,
                        train: *train_fraction,
                        dtype: *dtype,
                    };
                    generate::add_contextual(tmp, &lab, c, *seed)?;
                }
                Ok(lab)
            })?;
            if let Some(l) = labels {
                outfile::write_with(l, |tmp| generate::write_labels(tmp, &lab))?;
            }
            println!(
                "generated sbm: {nodes} nodes, {blocks} blocks{} -> {}",
                features.map_or(String::new(), |f| format!(
                    ", {f} features per node (signal {signal}), the blocks as labels, split {train_fraction} / {train_fraction} / rest"
                )),
                output.display()
            );
        }
        GenerateCmd::Rmat {
            scale,
            edge_factor,
            output,
            seed,
        } => {
            let m = outfile::write_output(output, &[], |tmp| {
                generate::rmat(tmp, *scale, *edge_factor, *seed)
            })?;
            println!(
                "generated rmat: {} nodes, {m} edges -> {}",
                1u64 << scale,
                output.display()
            );
        }
        GenerateCmd::Shape {
            shape,
            nodes,
            output,
        } => {
            if *nodes < 3 {
                return Err(Error::config("--nodes must be at least 3 for a shape"));
            }
            let edges = generate::shape_edges(*shape, *nodes);
            outfile::write_output(output, &[], |tmp| {
                h5::write_edges(tmp, &edges, *nodes, false, false)
            })?;
            println!(
                "generated {shape:?}: {nodes} nodes, {} edges -> {}",
                edges.len(),
                output.display()
            );
        }
    }
    Ok(())
}

fn reorder_cmd(x: &graphscale::cli::ReorderCmd) -> Result<()> {
    let r = outfile::write_output(&x.output, &[("--graph", &x.graph)], |tmp| {
        graphscale::graph::reorder::reorder(&x.graph, tmp, x.parts, x.rounds, x.seed, x.by)
    })?;
    if x.json {
        println!("{}", serde_json::to_string(&r).expect("json"));
    } else {
        println!(
            "reordered {} -> {} by {}: {} nodes, {} edges, {} clusters in {:.1} s; edges between the {} ranks: \
             {:.1}% before (striped), {:.1}% before (block), {:.1}% after ({p}), largest rank's degree \
             sum {:.3}x the mean; train it with --partition {p}",
            x.graph.display(),
            x.output.display(),
            format!("{:?}", r.by).to_lowercase(),
            r.nodes,
            r.edges,
            r.clusters,
            r.seconds,
            r.parts,
            100.0 * r.cut_striped_before,
            100.0 * r.cut_block_before,
            100.0 * r.cut_block_after,
            r.volume_balance,
            p = r.by.partition(),
        );
    }
    Ok(())
}

fn split_cmd(x: &SplitCmd) -> Result<()> {
    outfile::check(
        &[
            Out {
                flag: "-o",
                path: &x.output,
            },
            Out {
                flag: "--test",
                path: &x.test,
            },
        ],
        &[("--graph", &x.graph)],
    )?;
    // Both outputs through partial files: the training graph is published only with its test set.
    let s = outfile::write_with(&x.output, |train| {
        outfile::write_with(&x.test, |test| {
            graphscale::eval::linkpred::split(&x.graph, x.test_fraction, x.seed, train, test)
        })
    })?;
    println!(
        "split {}: {} edges -> {} training ({}), {} held out + {} non-edges ({})",
        x.graph.display(),
        s.edges,
        s.train_edges,
        x.output.display(),
        s.test_edges,
        s.test_edges,
        x.test.display()
    );
    Ok(())
}

fn print_linkpred(
    r: &graphscale::eval::linkpred::LinkResult,
    score: graphscale::eval::linkpred::Score,
    json: bool,
) {
    if json {
        println!("{}", serde_json::to_string(r).expect("json"));
    } else {
        println!(
            "link prediction ({score:?}): {} held-out edges, {} non-edges\nROC-AUC {:.4}  MRR {:.4}  Hits@1 {:.4}  Hits@3 {:.4}  Hits@10 {:.4}",
            r.positives, r.negatives, r.auc, r.mrr, r.hits1, r.hits3, r.hits10
        );
    }
}

fn print_gnn(r: &[(String, graphscale::train::sage::SplitScores)], json: bool) {
    if json {
        let map: serde_json::Map<String, serde_json::Value> = r
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    serde_json::to_value(v).expect("scores serialize"),
                )
            })
            .collect();
        println!("{}", serde_json::Value::Object(map));
    } else {
        println!("split      nodes  accuracy  micro-F1  macro-F1");
        for (k, v) in r {
            println!(
                "{k:<6} {:>9}  {:>8.4}  {:>8.4}  {:>8.4}",
                v.nodes, v.accuracy, v.micro_f1, v.macro_f1
            );
        }
    }
}

fn print_kg(m: &graphscale::eval::kg::KgMetrics, json: bool, secs: f64) {
    if json {
        println!("{}", serde_json::to_string(m).expect("metrics serialize"));
    } else {
        println!(
            "{} on {} test triples (filtered, both sides): MRR {:.4}  MR {:.1}  Hits@1 {:.4}  Hits@3 {:.4}  Hits@10 {:.4}  ({secs:.1} s)",
            m.model, m.triples, m.mrr, m.mr, m.hits1, m.hits3, m.hits10
        );
    }
}

fn eval_cmd(e: &EvalCmd) -> Result<()> {
    if let EvalCmd::Linkpred {
        embeddings,
        test,
        score,
        corrupt,
        seed,
        json,
        ..
    } = e
    {
        let (rows, dim, data) = graphscale::embeddings::read_embeddings(embeddings)?;
        let t = graphscale::eval::linkpred::read_test(test, rows)?;
        let r =
            graphscale::eval::linkpred::link_prediction(&data, dim, &t, *score, *corrupt, *seed);
        print_linkpred(&r, *score, *json);
        return Ok(());
    }
    let EvalCmd::Nodeclf {
        embeddings,
        labels,
        train_fractions,
        repeats,
        seed,
        splits,
        json,
    } = e
    else {
        unreachable!("link prediction returned above; kg runs on every rank (main)");
    };
    if *repeats == 0 {
        return Err(Error::config("--repeats must be at least 1"));
    }
    if let Some(f) = train_fractions.iter().find(|f| !(**f > 0.0 && **f < 1.0)) {
        return Err(Error::config(format!(
            "--train-fractions: {f} is not in (0, 1)"
        )));
    }
    let (rows, dim, data) = graphscale::embeddings::read_embeddings(embeddings)?;
    let names = graphscale::embeddings::read_node_names(embeddings)?;
    let labels = graphscale::eval::read_labels(labels, rows, names.as_deref())?;
    let splits = splits
        .as_deref()
        .map(|p| graphscale::eval::read_splits(p, &labels))
        .transpose()?;
    let res = graphscale::eval::node_classification(
        &data,
        dim,
        &labels,
        train_fractions,
        *repeats,
        *seed,
        splits.as_deref(),
    )?;
    if *json {
        let map: serde_json::Map<String, serde_json::Value> = res
            .iter()
            .map(|(f, r)| {
                (
                    format!("{f}"),
                    serde_json::to_value(r).expect("f1 serializes"),
                )
            })
            .collect();
        println!("{}", serde_json::json!({ "results": map }));
    } else {
        println!(
            "node classification: {rows} nodes, {} labels, {repeats} repeats",
            labels.num_labels
        );
        println!("train   Micro-F1          Macro-F1");
        for (f, r) in &res {
            println!(
                "{:>4.0}%   {:5.2} +- {:4.2}    {:5.2} +- {:4.2}",
                f * 100.0,
                100.0 * r.micro_f1,
                100.0 * r.micro_f1_std,
                100.0 * r.macro_f1,
                100.0 * r.macro_f1_std
            );
        }
    }
    Ok(())
}

fn export_cmd(x: &ExportCmd) -> Result<()> {
    let inputs = [("--embeddings", x.embeddings.as_path())];
    let (rows, dim) = outfile::write_output(&x.output, &inputs, |tmp| {
        let (rows, dim, data) = graphscale::embeddings::read_embeddings(&x.embeddings)?;
        let names = graphscale::embeddings::read_node_names(&x.embeddings)?;
        match x.format.as_str() {
            "npy" => export::npy(tmp, rows, dim, &data)?,
            _ => export::word2vec(tmp, rows, dim, &data, names.as_deref())?,
        }
        Ok((rows, dim))
    })?;
    println!("exported {rows} x {dim} -> {}", x.output.display());
    Ok(())
}

fn info(comm: &Comm, i: &InfoCmd) -> Result<()> {
    let scheme = agree(comm, i.partition.parse().map_err(Error::config))?;
    let t = std::time::Instant::now();
    let g = csr::load(comm, &i.graph, scheme, csr::LOAD_CHUNK_EDGES, |_| Ok(false))?;
    let secs = t.elapsed().as_secs_f64();
    let s = csr::stats(comm, &g);
    let rss = comm.max_u64(graphscale::stats::peak_rss_bytes());
    if comm.rank() == 0 {
        if i.json {
            let mut v = serde_json::to_value(&s).expect("stats serialize");
            v["load_seconds"] = serde_json::json!(secs);
            v["peak_rss_bytes_max_rank"] = serde_json::json!(rss);
            println!(
                "{}",
                serde_json::to_string_pretty(&v).expect("stats serialize")
            );
        } else {
            println!("graph            {}", i.graph.display());
            println!("nodes            {}", s.num_nodes);
            println!(
                "edges (file)     {}{}",
                s.file_edges,
                if s.directed {
                    " directed"
                } else {
                    " undirected"
                }
            );
            println!(
                "adjacency        {} entries{}",
                s.adjacency_entries,
                if s.weighted { ", weighted" } else { "" }
            );
            println!(
                "degree           min {} / mean {:.2} / max {}; {} isolated",
                s.min_degree, s.mean_degree, s.max_degree, s.isolated_nodes
            );
            println!(
                "ranks            {} ({:?} partition, fingerprint {})",
                s.ranks, scheme, s.partition_fingerprint
            );
            println!(
                "balance          nodes max/mean {:.3}; adjacency max/mean {:.3}",
                s.max_rank_nodes as f64 / s.mean_rank_nodes.max(1e-9),
                s.max_rank_entries as f64 / s.mean_rank_entries.max(1e-9)
            );
            println!(
                "load             {:.2} s ({:.0} edges/s)",
                secs,
                s.file_edges as f64 / secs.max(1e-9)
            );
            println!(
                "peak RSS         {} (largest rank)",
                graphscale::stats::human_bytes(rss)
            );
        }
    }
    Ok(())
}

fn train_cmd(comm: &Comm, t: &TrainCmd) -> Result<()> {
    let raw = match &t.config {
        Some(p) => RawTrain::from_toml(p).map(|f| f.overridden_by(t.raw.clone())),
        None => Ok(t.raw.clone()),
    };
    let cfg = agree(comm, raw.and_then(TrainConfig::from_raw))?;
    // Every output must be writable, and none an input, before hours of training go into it.
    let writable = if comm.rank() == 0 {
        let mut outs = Vec::new();
        outs.extend(cfg.output.as_deref().map(|o| Out {
            flag: "-o",
            path: o,
        }));
        outs.extend(cfg.metrics.as_deref().map(|m| Out {
            flag: "--metrics",
            path: m,
        }));
        let mut inputs = vec![("--graph", cfg.graph.as_path())];
        inputs.extend(cfg.kg.valid.as_deref().map(|v| ("--valid", v)));
        inputs.extend(t.config.as_deref().map(|c| ("--config", c)));
        outfile::check(&outs, &inputs)
            .map_err(|e| match (e, cfg.output_is_default) {
                (Error::Config(m), true) if m.starts_with("-o ") => Error::config(format!(
                    "{m} (-o defaults to a file next to the graph, as no -o was given)"
                )),
                (e, _) => e,
            })
            .and_then(|()| {
                // A mistyped --resume, or a --checkpoint-dir of another run, before the load.
                graphscale::checkpoint::check_dirs(
                    cfg.resume.as_deref(),
                    cfg.resume_required,
                    cfg.checkpoint_dir.as_deref(),
                )
            })
    } else {
        Ok(())
    };
    agree(comm, writable)?;
    if comm.rank() == 0 {
        let later = if cfg.lr_is_default && cfg.lr_follows_budget() {
            " (lr and lr_hold: set from the pairs per node once the graph is read)"
        } else {
            ""
        };
        eprintln!("graphscale: effective config {}{later}", cfg.to_json());
        if let (Some(o), true) = (&cfg.output, cfg.output_is_default) {
            eprintln!(
                "graphscale: no -o given: the embeddings will be written to {}",
                o.display()
            );
        }
    }
    let out = train::run(comm, &cfg)?;
    if comm.rank() == 0 {
        eprint!("{}", summary_table(&out.metrics));
        if let Some(o) = &cfg.output {
            eprintln!("graphscale: wrote {}", o.display());
        }
    }
    Ok(())
}

/// The default step of the planned job: `train`'s rule for the walk models across nodes
/// (the hub's share of the walks: its degree over the sum of degrees), else 16384.
fn plan_batch(x: &PlanCmd) -> f64 {
    use graphscale::config::{default_walk_batch, BATCH};
    // One rank per node unless --ranks-per-node says otherwise. Every rank keeps its own
    // copies: a row's copies are on the ranks of the other nodes. As `train` counts them, for
    // the rows of the smallest node (the last, which holds the remainder of the ranks).
    let (ranks, rpn) = (x.ranks as u64, x.ranks_per_node.unwrap_or(1).max(1));
    let nodes = ranks.div_ceil(rpn);
    let copies = (nodes - 1) * rpn;
    let walks = matches!(x.model, Model::Deepwalk | Model::Node2vec);
    match x.max_degree {
        Some(hub) if walks && copies > 0 => {
            let degrees = x.edges * if x.directed { 1.0 } else { 2.0 };
            default_walk_batch(x.ranks, copies, hub / degrees) as f64
        }
        _ => BATCH as f64,
    }
}

fn plan_cmd(x: &PlanCmd) -> Result<()> {
    use graphscale::plan::{self, Job, Rates};
    if x.model.is_kg() || x.model == Model::Sage {
        // Their steps (the KG models' chunks of triples against shared negatives, owner-side
        // Adagrad and replicated relations; GraphSAGE's dense layers over sampled blocks) are
        // not in the model: a walk plan under their name would lie.
        return Err(Error::config(format!(
            "plan models the walk models and LINE, not --model {}: size such a run with a short `train --max-memory` start (it prints the estimate per rank) or docs/tuning.md",
            format!("{:?}", x.model).to_lowercase()
        )));
    }
    let size = |flag: &str, v: &str| {
        graphscale::config::parse_bytes(v)
            .map(|b| b as f64)
            .map_err(|_| Error::config(format!("{flag} '{v}' is not a positive size like 700G")))
    };
    let job = Job {
        nodes: x.nodes,
        edges: x.edges,
        directed: x.directed,
        weighted: x.weighted,
        dim: x.dim,
        dtype_bytes: x.dtype.size(),
        optimizer: x.optimizer,
        model: x.model,
        order: x.order,
        walks_per_node: x.walks_per_node,
        walk_length: x.walk_length,
        window: x.window,
        line_samples: x.line_samples,
        batch_size: x.batch_size.unwrap_or_else(|| plan_batch(x)),
        ranks: x.ranks,
        ranks_per_node: x.ranks_per_node.map_or(1, |n| n as usize),
        threads: x.threads,
        cores_per_node: x.cores_per_node.unwrap_or_else(|| {
            (x.ranks_per_node.map_or(1, |n| n as usize).min(x.ranks) * (x.threads + 1)) as f64
        }),
        mem_per_node: x
            .mem_per_node
            .as_deref()
            .map(|m| size("--mem-per-node", m))
            .transpose()?,
        wire_bytes: x.wire_dtype.size(),
        latency: x.latency,
        bandwidth: size("--bandwidth", &x.bandwidth)?,
        // MPI_Get_library_version may be called before MPI_Init (plan runs without MPI).
        process: plan::process_bytes(&mpi::environment::library_version().unwrap_or_default()),
    };
    let rates = if x.calibrate.is_empty() {
        Rates::defaults()
    } else {
        Rates::calibrate(&x.calibrate)?
    };
    let (pairs, plans) = plan::plan(&job, &rates)?;
    if x.json {
        let v = serde_json::json!({"pairs_per_epoch": pairs, "rates": rates, "plans": plans});
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    } else {
        print!("{}", plan::render(&job, &rates, pairs, &plans));
        let walks = matches!(x.model, Model::Deepwalk | Model::Node2vec);
        let machines = job.ranks.div_ceil(job.ranks_per_node);
        if walks && machines > 1 && x.batch_size.is_none() && x.max_degree.is_none() {
            println!(
                "note: planned at 16384 pairs per step; across nodes the walk models' default step follows the graph's largest degree (train prints the step it takes): give --max-degree (graphscale info prints it) to plan that step"
            );
        }
    }
    let sharded = &plans[0];
    if !sharded.fits {
        let m = job.mem_per_node.unwrap_or(0.0);
        return Err(Error::config(format!(
            "the plan does not fit: the sharded strategy needs {} per node, {} more than --mem-per-node {}; use more nodes (about {}x), --dtype f16, or a smaller --dim",
            graphscale::stats::human_bytes(sharded.per_node as u64),
            graphscale::stats::human_bytes((sharded.per_node - m) as u64),
            graphscale::stats::human_bytes(m as u64),
            (sharded.per_node / m).ceil()
        )));
    }
    Ok(())
}

fn report_cmd(x: &ReportCmd) -> Result<()> {
    let runs = graphscale::report::load(&x.metrics)?;
    let written = graphscale::report::write(&runs, &x.output)?;
    for s in graphscale::report::summarize(&runs) {
        println!(
            "{:<32} {:>12.0} pairs/s  speed-up {:>5.2}  efficiency {:>5.2}  {:>7.1} B/pair",
            s.label, s.pairs_per_second, s.speedup, s.efficiency, s.bytes_per_pair
        );
    }
    println!("wrote {} files to {}", written.len(), x.output.display());
    Ok(())
}

/// Transport checks run by the tests under real mpirun.
fn selftest(comm: &Comm, s: &SelftestCmd) -> Result<()> {
    match s.mode.as_str() {
        "hang" => {
            if comm.rank() == s.fail_rank {
                eprintln!(
                    "graphscale: selftest: rank {} stops responding",
                    comm.rank()
                );
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
            comm.barrier();
            Ok(())
        }
        "panic" => {
            comm.barrier();
            if comm.rank() == s.fail_rank {
                panic!("selftest: injected panic");
            }
            comm.barrier();
            Ok(())
        }
        _ => {
            let checked = graphscale::selftest::selftest_rma(comm, s.rows, s.rounds);
            let total = comm.sum_u64(checked?);
            if comm.rank() == 0 {
                println!(
                    "rma selftest: {total} fetched rows verified on {} ranks",
                    comm.size()
                );
            }
            Ok(())
        }
    }
}

//! `graphscale report`: tables and plots of one or many runs' metrics files (one run per file,
//! one JSON line per rank, as `--metrics` writes them). For scaling studies: speed-up and
//! parallel efficiency against nodes (or ranks), the per-phase time of every run stacked (the
//! communication-against-compute figure), bytes moved per trained pair, memory per rank, load
//! balance across ranks, and throughput over time. CSV for every table; every plot as SVG and,
//! where a TrueType font is found, PNG.
//!
//! Runs form series by (model, strategy). Speed-up is pairs/s over the base's, where the base is
//! the model's fastest run on the fewest nodes (then ranks) of any strategy: absolute speed-up,
//! so a slow single-node run does not flatter its series. Efficiency is the speed-up over the
//! growth in nodes: throughput-based, so that it reads the same for strong scaling (fixed work)
//! and weak scaling (work growing with the nodes).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};
use crate::stats::RankMetrics;

/// One run: its file and its ranks' records, rank order.
pub struct Run {
    pub file: PathBuf,
    pub ranks: Vec<RankMetrics>,
}

/// A run's figures, as in `runs.csv`.
#[derive(Clone, Debug)]
pub struct Summary {
    pub label: String,
    pub series: String,
    pub file: String,
    pub model: String,
    pub strategy: String,
    pub ranks: usize,
    pub nodes: u64,
    pub pairs: u64,
    /// The slowest rank's training seconds.
    pub seconds: f64,
    pub pairs_per_second: f64,
    pub speedup: f64,
    pub efficiency: f64,
    pub bytes_per_pair: f64,
    pub bytes_moved: u64,
    pub peak_rss_max: u64,
    pub memory_estimate_max: u64,
    /// Max over mean of the ranks' pairs and of their training seconds.
    pub pairs_balance: f64,
    /// Mean over ranks of each of `PHASES`.
    pub phases: [f64; 7],
}

/// The phases stacked per run (training only: load and output are not part of a step).
pub const PHASES: [&str; 7] = [
    "sample", "fetch", "compute", "push", "apply", "wait", "idle",
];

/// Read metrics files: every line a rank's record of one run, each rank once.
pub fn load(paths: &[PathBuf]) -> Result<Vec<Run>> {
    let mut runs = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let bad = |line: usize, what: String| {
            Error::config(format!("{}, line {line}: {what}", path.display()))
        };
        let mut ranks: Vec<RankMetrics> = Vec::new();
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| bad(i + 1, format!("not a JSON metrics record ({e})")))?;
            for key in ["strategy", "ranks", "nodes", "timeline"] {
                if v.get(key).is_none() {
                    return Err(bad(
                        i + 1,
                        format!("a metrics record without `{key}`, written by an older graphscale: run the job again with this version's --metrics"),
                    ));
                }
            }
            let m: RankMetrics = serde_json::from_value(v)
                .map_err(|e| bad(i + 1, format!("not a graphscale metrics record ({e})")))?;
            if let Some(first) = ranks.first() {
                if (m.ranks, &m.strategy, &m.model, m.nodes)
                    != (first.ranks, &first.strategy, &first.model, first.nodes)
                {
                    return Err(bad(
                        i + 1,
                        format!(
                            "records of two runs in one file ({} ranks {} {} against {} ranks {} {} on line 1): give each run its own --metrics file",
                            m.ranks, m.strategy, m.model, first.ranks, first.strategy, first.model
                        ),
                    ));
                }
            }
            ranks.push(m);
        }
        let Some(first) = ranks.first() else {
            return Err(Error::config(format!(
                "{}: no metrics records",
                path.display()
            )));
        };
        let want = first.ranks;
        ranks.sort_by_key(|m| m.rank);
        let complete = ranks.len() == want && ranks.iter().enumerate().all(|(i, m)| m.rank == i);
        if !complete {
            return Err(Error::config(format!(
                "{}: {} records for a run of {want} ranks (each rank once expected): records of several runs, or a truncated file",
                path.display(),
                ranks.len()
            )));
        }
        runs.push(Run {
            file: path.clone(),
            ranks,
        });
    }
    if runs.is_empty() {
        return Err(Error::config(
            "graphscale report needs at least one metrics file",
        ));
    }
    Ok(runs)
}

/// Per-run figures, with speed-up and efficiency against each series' base.
pub fn summarize(runs: &[Run]) -> Vec<Summary> {
    let mut out: Vec<Summary> = runs
        .iter()
        .map(|r| {
            let m0 = &r.ranks[0];
            let n = r.ranks.len() as f64;
            let pairs: u64 = r.ranks.iter().map(|m| m.pairs).sum();
            let seconds = r.ranks.iter().map(|m| m.train_seconds).fold(0.0, f64::max);
            let moved: u64 = r
                .ranks
                .iter()
                .map(|m| m.comm_bytes_sent + m.one_sided_bytes)
                .sum();
            let max_pairs = r.ranks.iter().map(|m| m.pairs).max().unwrap_or(0) as f64;
            let mut phases = [0f64; 7];
            for m in &r.ranks {
                let s = &m.seconds;
                let v = [
                    s.sample, s.fetch, s.compute, s.push, s.apply, s.wait, s.idle,
                ];
                for (p, x) in phases.iter_mut().zip(v) {
                    *p += x / n;
                }
            }
            let series = format!("{} {}", m0.model, m0.strategy);
            Summary {
                label: format!("{} {}n {}r", m0.strategy, m0.nodes, m0.ranks),
                series,
                file: r.file.display().to_string(),
                model: m0.model.clone(),
                strategy: m0.strategy.clone(),
                ranks: m0.ranks,
                nodes: m0.nodes,
                pairs,
                seconds,
                pairs_per_second: pairs as f64 / seconds.max(1e-9),
                speedup: 1.0,
                efficiency: 1.0,
                bytes_per_pair: moved as f64 / pairs.max(1) as f64,
                bytes_moved: moved,
                peak_rss_max: r.ranks.iter().map(|m| m.peak_rss_bytes).max().unwrap_or(0),
                memory_estimate_max: r
                    .ranks
                    .iter()
                    .map(|m| m.memory_estimate_bytes)
                    .max()
                    .unwrap_or(0),
                pairs_balance: max_pairs / (pairs as f64 / n).max(1e-9),
                phases,
            }
        })
        .collect();
    // The base of a model's runs: its fastest run at the smallest scale, whatever its
    // strategy (absolute speed-up: a slow single-node baseline does not inflate its series).
    let mut base: BTreeMap<String, (u64, usize, f64)> = BTreeMap::new();
    for s in &out {
        let e = base
            .entry(s.model.clone())
            .or_insert((s.nodes, s.ranks, s.pairs_per_second));
        if (s.nodes, s.ranks) < (e.0, e.1) {
            *e = (s.nodes, s.ranks, s.pairs_per_second);
        } else if (s.nodes, s.ranks) == (e.0, e.1) {
            e.2 = e.2.max(s.pairs_per_second);
        }
    }
    let by_nodes = nodes_vary(&out);
    for s in &mut out {
        let (bn, br, bp) = base[&s.model];
        s.speedup = s.pairs_per_second / bp.max(1e-9);
        let grew = if by_nodes {
            s.nodes as f64 / bn.max(1) as f64
        } else {
            s.ranks as f64 / br.max(1) as f64
        };
        s.efficiency = s.speedup / grew;
    }
    out.sort_by(|a, b| (&a.series, a.nodes, a.ranks).cmp(&(&b.series, b.nodes, b.ranks)));
    out
}

/// Scale runs by nodes when their node counts differ, else by ranks.
fn nodes_vary(s: &[Summary]) -> bool {
    s.iter().any(|x| x.nodes != s[0].nodes)
}

/// What the runs' `pairs` count, plural and singular: skip-gram pairs (walks, LINE), triples
/// (knowledge graphs) or, mixed, examples.
fn unit(s: &[Summary]) -> (&'static str, &'static str) {
    let kg = |r: &Summary| {
        <crate::config::Model as clap::ValueEnum>::from_str(&r.model, true).is_ok_and(|m| m.is_kg())
    };
    if !s.is_empty() && s.iter().all(kg) {
        ("triples", "triple")
    } else if s.iter().any(kg) {
        ("examples", "example")
    } else {
        ("pairs", "pair")
    }
}

/// The bar charts' category labels: the runs' own when they fit under their bars, otherwise
/// their numbers (1, 2, ...), with `true` to say a key is needed.
fn axis_labels(labels: &[String]) -> (Vec<String>, bool) {
    // The plot's width less the y label area and margins, shared by the bars; about 7 px
    // per character at the axis font.
    let slot = f64::from(SIZE.0 - 100) / labels.len().max(1) as f64;
    let widest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    if widest as f64 * 7.5 <= slot * 0.9 {
        (labels.to_vec(), false)
    } else {
        ((1..=labels.len()).map(|i| i.to_string()).collect(), true)
    }
}

/// Write the tables and plots into `dir`; returns the files written.
pub fn write(runs: &[Run], dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let sums = summarize(runs);
    let mut written = Vec::new();
    let mut put = |name: &str, text: String| -> Result<()> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| Error::io(&p, e))?;
        written.push(p);
        Ok(())
    };
    put("runs.csv", runs_csv(&sums))?;
    put("ranks.csv", ranks_csv(runs))?;
    put("timeline.csv", timeline_csv(runs))?;
    let font = load_font();
    if font.is_none() {
        log::warn!(
            "graphscale report: no TrueType font found (install fonts-dejavu-core, or set GRAPHSCALE_FONT to a .ttf): SVG plots only"
        );
    }
    for plot in PLOTS {
        let svg = dir.join(format!("{}.svg", plot.name()));
        {
            let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
            plot.draw(&root, &sums, runs)
                .map_err(|e| plot_err(&svg, e))?;
            root.present().map_err(|e| plot_err(&svg, e))?;
        }
        written.push(svg);
        if font.is_some() {
            let png = dir.join(format!("{}.png", plot.name()));
            {
                let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
                plot.draw(&root, &sums, runs)
                    .map_err(|e| plot_err(&png, e))?;
                root.present().map_err(|e| plot_err(&png, e))?;
            }
            written.push(png);
        }
    }
    Ok(written)
}

fn plot_err(path: &Path, e: impl std::fmt::Debug) -> Error {
    Error::config(format!("{}: drawing failed: {e:?}", path.display()))
}

const SIZE: (u32, u32) = (900, 560);

/// The plots, each drawn on any backend.
#[derive(Clone, Copy)]
enum Plot {
    Speedup,
    Efficiency,
    BytesPerPair,
    Memory,
    Phases,
    Balance,
    Throughput,
}

const PLOTS: [Plot; 7] = [
    Plot::Speedup,
    Plot::Efficiency,
    Plot::BytesPerPair,
    Plot::Memory,
    Plot::Phases,
    Plot::Balance,
    Plot::Throughput,
];

impl Plot {
    fn name(self) -> &'static str {
        match self {
            Plot::Speedup => "speedup",
            Plot::Efficiency => "efficiency",
            Plot::BytesPerPair => "bytes_per_pair",
            Plot::Memory => "memory",
            Plot::Phases => "phases",
            Plot::Balance => "balance",
            Plot::Throughput => "throughput",
        }
    }

    fn draw<DB: DrawingBackend>(
        self,
        a: &DrawingArea<DB, Shift>,
        s: &[Summary],
        runs: &[Run],
    ) -> Drawn {
        match self {
            Plot::Speedup => lines(
                a,
                s,
                &format!("speed-up ({}/s over the fastest smallest run)", unit(s).0),
                |x| x.speedup,
                true,
            ),
            Plot::Efficiency => lines(
                a,
                s,
                "parallel efficiency (speed-up / growth)",
                |x| x.efficiency,
                false,
            ),
            Plot::BytesPerPair => lines(
                a,
                s,
                &format!("bytes moved per trained {}", unit(s).1),
                |x| x.bytes_per_pair,
                false,
            ),
            Plot::Memory => lines(
                a,
                s,
                "peak RSS per rank (MiB, largest rank)",
                |x| x.peak_rss_max as f64 / 1048576.0,
                false,
            ),
            Plot::Phases => phases(a, s),
            Plot::Balance => balance(a, s, runs),
            Plot::Throughput => throughput(a, s, runs),
        }
    }
}

type Drawn = std::result::Result<(), String>;

fn e(x: impl std::fmt::Debug) -> String {
    format!("{x:?}")
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// One line per series against nodes (or ranks).
fn lines<DB: DrawingBackend>(
    a: &DrawingArea<DB, Shift>,
    s: &[Summary],
    what: &str,
    y: fn(&Summary) -> f64,
    ideal: bool,
) -> Drawn {
    a.fill(&WHITE).map_err(e)?;
    let by_nodes = nodes_vary(s);
    let x = |r: &Summary| {
        if by_nodes {
            r.nodes as f64
        } else {
            r.ranks as f64
        }
    };
    let xmax = s.iter().map(x).fold(1.0, f64::max) * 1.1;
    let ymax = s
        .iter()
        .map(y)
        .fold(if ideal { xmax } else { 0.0 }, f64::max)
        .max(1e-9)
        * 1.15;
    let mut c = ChartBuilder::on(a)
        .caption(what, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax)
        .map_err(e)?;
    c.configure_mesh()
        .x_desc(if by_nodes { "nodes" } else { "ranks" })
        .y_desc(what)
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(e)?;
    let mut series: Vec<&str> = s.iter().map(|r| r.series.as_str()).collect();
    series.dedup();
    for (i, name) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = s
            .iter()
            .filter(|r| r.series == *name)
            .map(|r| (x(r), y(r)))
            .collect();
        c.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(e)?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(e)?;
    }
    if ideal {
        let base = s.iter().map(x).fold(f64::INFINITY, f64::min);
        c.draw_series(LineSeries::new(
            [(base, 1.0), (xmax / 1.1, xmax / 1.1 / base)],
            BLACK.mix(0.4).stroke_width(1),
        ))
        .map_err(e)?
        .label("ideal")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

/// Bars of categories (one per run) on an index axis labelled by `labels`.
fn bar_chart<'a, DB: DrawingBackend>(
    a: &'a DrawingArea<DB, Shift>,
    what: &str,
    labels: &'a [String],
    ymax: f64,
    ydesc: &str,
) -> std::result::Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>, String>
{
    a.fill(&WHITE).map_err(e)?;
    let n = labels.len() as f64;
    let (labels, _) = axis_labels(labels);
    let mut c = ChartBuilder::on(a)
        .caption(what, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(70)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..n - 0.5, 0f64..ymax.max(1e-9) * 1.15)
        .map_err(e)?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(labels.len().max(2))
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc(ydesc)
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(e)?;
    Ok(c)
}

/// An axis tick: `8M`, `1.5k`, `0.25`, never `8000000.0`.
fn tick(v: f64) -> String {
    let a = v.abs();
    let (x, unit) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let t = format!("{x:.2}");
    let t = t.trim_end_matches('0').trim_end_matches('.');
    format!("{}{unit}", if t == "-0" { "0" } else { t })
}

/// Per run, the mean seconds per rank of every phase: the main thread's phases stacked (they
/// follow one another), the pool's `compute` and `idle` (the pool without a batch) stacked in a
/// bar of their own beside them (they overlap the main thread's: stacked together, a run would
/// seem to take longer than it did).
fn phases<DB: DrawingBackend>(a: &DrawingArea<DB, Shift>, s: &[Summary]) -> Drawn {
    let labels: Vec<String> = s.iter().map(|r| r.label.clone()).collect();
    let on_pool = |q: usize| matches!(PHASES[q], "compute" | "idle");
    // The phases of the same bar as `p` below it.
    let below = |r: &Summary, p: usize| -> f64 {
        (0..p)
            .filter(|&q| on_pool(q) == on_pool(p))
            .map(|q| r.phases[q])
            .sum()
    };
    let main = |r: &Summary| -> f64 {
        (0..PHASES.len())
            .filter(|&q| !on_pool(q))
            .map(|q| r.phases[q])
            .sum()
    };
    let pool = |r: &Summary| -> f64 {
        (0..PHASES.len())
            .filter(|&q| on_pool(q))
            .map(|q| r.phases[q])
            .sum()
    };
    let (_, keyed) = axis_labels(&labels);
    // The legend's rows (phases, and the runs' key when the axis numbers them) get a band
    // above the bars.
    let rows = PHASES.len() + if keyed { s.len() } else { 0 };
    let ymax =
        s.iter().map(|r| main(r).max(pool(r))).fold(0.0, f64::max) * (1.0 + 0.06 * rows as f64);
    let mut c = bar_chart(
        a,
        "seconds per phase, mean over ranks: main thread, and beside it the pool (compute, idle)",
        &labels,
        ymax,
        "seconds",
    )?;
    for (p, name) in PHASES.iter().enumerate() {
        let color = COLORS[p % COLORS.len()];
        let bars = s.iter().enumerate().map(|(i, r)| {
            let (x, lo) = (i as f64, below(r, p));
            let (left, right) = if on_pool(p) {
                (x + 0.1, x + 0.35)
            } else {
                (x - 0.35, x + 0.05)
            };
            Rectangle::new([(left, lo), (right, lo + r.phases[p])], color.filled())
        });
        c.draw_series(bars)
            .map_err(e)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    if keyed {
        for (i, l) in labels.iter().enumerate() {
            c.draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
                .map_err(e)?
                .label(format!("{}: {l}", i + 1))
                .legend(|(x, y)| EmptyElement::at((x, y)));
        }
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

/// Per run, every rank's pairs/s: the spread is the load imbalance.
fn balance<DB: DrawingBackend>(a: &DrawingArea<DB, Shift>, s: &[Summary], runs: &[Run]) -> Drawn {
    let labels: Vec<String> = s.iter().map(|r| r.label.clone()).collect();
    let rate = |m: &RankMetrics| m.pairs as f64 / m.train_seconds.max(1e-9);
    let of = |sum: &Summary| {
        runs.iter()
            .find(|r| r.file.display().to_string() == sum.file)
    };
    let (_, keyed) = axis_labels(&labels);
    let ymax = runs
        .iter()
        .flat_map(|r| r.ranks.iter().map(rate))
        .fold(0.0, f64::max)
        * if keyed {
            1.0 + 0.06 * s.len() as f64
        } else {
            1.0
        };
    let u = unit(s).0;
    let mut c = bar_chart(
        a,
        &format!("{u}/s of every rank (load balance)"),
        &labels,
        ymax,
        &format!("{u}/s per rank"),
    )?;
    for (i, sum) in s.iter().enumerate() {
        let Some(run) = of(sum) else { continue };
        let color = COLORS[i % COLORS.len()];
        let n = run.ranks.len().max(1) as f64;
        let dots = c
            .draw_series(run.ranks.iter().enumerate().map(|(k, m)| {
                let x = i as f64 - 0.3 + 0.6 * (k as f64 + 0.5) / n;
                Circle::new((x, rate(m)), 4, color.filled())
            }))
            .map_err(e)?;
        if keyed {
            dots.label(format!("{}: {}", i + 1, sum.label))
                .legend(move |(x, y)| Circle::new((x + 6, y), 4, color.filled()));
        }
    }
    if keyed {
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(e)?;
    }
    Ok(())
}

/// Pairs/s over time of every run (all ranks' samples in common intervals).
fn throughput<DB: DrawingBackend>(
    a: &DrawingArea<DB, Shift>,
    s: &[Summary],
    runs: &[Run],
) -> Drawn {
    a.fill(&WHITE).map_err(e)?;
    let curves: Vec<(String, Vec<(f64, f64)>)> = s
        .iter()
        .filter_map(|sum| {
            let run = runs
                .iter()
                .find(|r| r.file.display().to_string() == sum.file)?;
            Some((sum.label.clone(), rate_curve(run)))
        })
        .collect();
    let n = curves.len();
    let tmax = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let ymax = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|p| p.1))
        .fold(1.0, f64::max);
    let mut c = ChartBuilder::on(a)
        .caption(
            format!("throughput over time (all ranks, {u}/s)", u = unit(s).0),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        // A band above the highest curve for the legend, which then covers no line.
        .build_cartesian_2d(0f64..tmax * 1.05, 0f64..ymax * (1.2 + 0.08 * n as f64))
        .map_err(e)?;
    c.configure_mesh()
        .x_desc("seconds")
        .y_desc(format!("{}/s", unit(s).0))
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(e)?;
    for (i, (label, pts)) in curves.into_iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        c.draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(e)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

/// A run's pairs/s between consecutive timeline samples, summed over ranks: each rank's pairs
/// at the ends of common intervals (the run's longest sampling interval) by interpolation.
pub fn rate_curve(run: &Run) -> Vec<(f64, f64)> {
    let end = run
        .ranks
        .iter()
        .filter_map(|m| m.timeline.last().map(|l| l[0]))
        .fold(0.0, f64::max);
    let at = |tl: &[[f64; 3]], t: f64| -> f64 {
        match tl.iter().position(|s| s[0] >= t) {
            None => tl.last().map_or(0.0, |s| s[1]),
            Some(0) => {
                tl[0][1]
                    * if tl[0][0] > 0.0 {
                        (t / tl[0][0]).min(1.0)
                    } else {
                        1.0
                    }
            }
            Some(i) => {
                let (a, b) = (tl[i - 1], tl[i]);
                a[1] + (b[1] - a[1]) * (t - a[0]) / (b[0] - a[0]).max(1e-9)
            }
        }
    };
    let steps = 40usize
        .min(
            run.ranks
                .iter()
                .map(|m| m.timeline.len())
                .max()
                .unwrap_or(0),
        )
        .max(1);
    let dt = end / steps as f64;
    (1..=steps)
        .map(|k| {
            let (t0, t1) = ((k - 1) as f64 * dt, k as f64 * dt);
            let done: f64 = run
                .ranks
                .iter()
                .map(|m| at(&m.timeline, t1) - at(&m.timeline, t0))
                .sum();
            ((t0 + t1) / 2.0, done / dt.max(1e-9))
        })
        .collect()
}

fn runs_csv(s: &[Summary]) -> String {
    let mut o = String::from(
        "label,series,model,strategy,nodes,ranks,pairs,seconds,pairs_per_second,speedup,efficiency,bytes_moved,bytes_per_pair,peak_rss_max,memory_estimate_max,pairs_balance",
    );
    for p in PHASES {
        let _ = write!(o, ",{p}_seconds");
    }
    o.push_str(",file\n");
    for r in s {
        let _ = write!(
            o,
            "{},{},{},{},{},{},{},{:.3},{:.0},{:.4},{:.4},{},{:.2},{},{},{:.4}",
            r.label,
            r.series,
            r.model,
            r.strategy,
            r.nodes,
            r.ranks,
            r.pairs,
            r.seconds,
            r.pairs_per_second,
            r.speedup,
            r.efficiency,
            r.bytes_moved,
            r.bytes_per_pair,
            r.peak_rss_max,
            r.memory_estimate_max,
            r.pairs_balance
        );
        for p in r.phases {
            let _ = write!(o, ",{p:.3}");
        }
        let _ = writeln!(o, ",{}", r.file);
    }
    o
}

fn ranks_csv(runs: &[Run]) -> String {
    let mut o = String::from(
        "file,strategy,nodes,ranks,rank,pairs,train_seconds,pairs_per_second,comm_bytes_sent,one_sided_bytes,peak_rss_bytes,memory_estimate_bytes\n",
    );
    for r in runs {
        for m in &r.ranks {
            let _ = writeln!(
                o,
                "{},{},{},{},{},{},{:.3},{:.0},{},{},{},{}",
                r.file.display(),
                m.strategy,
                m.nodes,
                m.ranks,
                m.rank,
                m.pairs,
                m.train_seconds,
                m.pairs_per_second(),
                m.comm_bytes_sent,
                m.one_sided_bytes,
                m.peak_rss_bytes,
                m.memory_estimate_bytes
            );
        }
    }
    o
}

fn timeline_csv(runs: &[Run]) -> String {
    let mut o = String::from("file,rank,seconds,pairs,bytes_moved\n");
    for r in runs {
        for m in &r.ranks {
            for s in &m.timeline {
                let _ = writeln!(
                    o,
                    "{},{},{:.3},{},{}",
                    r.file.display(),
                    m.rank,
                    s[0],
                    s[1],
                    s[2]
                );
            }
        }
    }
    o
}

/// A TrueType font for bitmap text: `GRAPHSCALE_FONT`, else DejaVu Sans where Debian and
/// most distributions put it. Registered once as "sans-serif".
fn load_font() -> Option<()> {
    static DONE: std::sync::OnceLock<Option<()>> = std::sync::OnceLock::new();
    *DONE.get_or_init(|| {
        let candidates = std::env::var("GRAPHSCALE_FONT").ok().into_iter().chain(
            [
                "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                "/usr/share/fonts/dejavu/DejaVuSans.ttf",
                "/usr/share/fonts/TTF/DejaVuSans.ttf",
            ]
            .map(String::from),
        );
        for path in candidates {
            if let Ok(bytes) = std::fs::read(&path) {
                // Registered fonts live as long as the process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Some(());
                }
            }
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(model: &str, label: &str) -> Summary {
        Summary {
            label: label.into(),
            series: model.into(),
            file: String::new(),
            model: model.into(),
            strategy: "hogwild".into(),
            ranks: 1,
            nodes: 1,
            pairs: 1,
            seconds: 1.0,
            pairs_per_second: 1.0,
            speedup: 1.0,
            efficiency: 1.0,
            bytes_per_pair: 0.0,
            bytes_moved: 0,
            peak_rss_max: 0,
            memory_estimate_max: 0,
            pairs_balance: 1.0,
            phases: [0.0; 7],
        }
    }

    #[test]
    fn knowledge_graph_runs_count_triples() {
        assert_eq!(unit(&[run("deepwalk", "a"), run("line", "b")]).0, "pairs");
        assert_eq!(
            unit(&[run("complex", "a"), run("distmult", "b")]),
            ("triples", "triple")
        );
        assert_eq!(
            unit(&[run("complex", "a"), run("node2vec", "b")]).0,
            "examples"
        );
    }

    #[test]
    fn bar_labels_are_numbered_when_they_would_overlap() {
        let few: Vec<String> = ["1 rank", "2 ranks"].map(String::from).to_vec();
        assert_eq!(axis_labels(&few), (few.clone(), false));
        let many: Vec<String> = (1..=8)
            .map(|n| format!("hogwild {n}n {}r", 2 * n))
            .collect();
        let (shown, keyed) = axis_labels(&many);
        assert!(keyed);
        assert_eq!(shown[0], "1");
        assert_eq!(shown[7], "8");
    }

    #[test]
    fn ticks_are_short() {
        assert_eq!(super::tick(8_000_000.0), "8M");
        assert_eq!(super::tick(1_500_000.0), "1.5M");
        assert_eq!(super::tick(25_000.0), "25k");
        assert_eq!(super::tick(0.25), "0.25");
        assert_eq!(super::tick(0.0), "0");
        assert_eq!(super::tick(120.0), "120");
    }
}

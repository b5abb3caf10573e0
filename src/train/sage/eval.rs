//! `graphscale eval gnn`: a trained GraphSAGE model read back and scored on every split of a
//! labelled graph, layer by layer over every node, sharded over the ranks as training is.

use std::path::Path;

use super::*;

/// One split's scores in `eval gnn` (single-label: micro-F1 is the accuracy).
#[derive(Clone, Debug, serde::Serialize)]
pub struct SplitScores {
    pub nodes: u64,
    pub accuracy: f64,
    pub micro_f1: f64,
    pub macro_f1: f64,
}

/// What `eval gnn` needs of a trained model besides its weights.
struct Trained {
    norm: FeatureNorm,
    input: SageInput,
    /// The learnable rows' width (`--input learned|both`; 0 without).
    learned_dim: usize,
}

/// `train --model sage`'s output read back: the model, the feature scaling and the input rows
/// it trained with.
fn read_model(path: &Path) -> Result<(Sage, Trained)> {
    let f = crate::graph::h5::open_h5(path)?;
    let err = |what: &'static str| move |e| Error::hdf5(path, what, e);
    let text = |name: &str| -> Option<String> {
        f.attr(name)
            .and_then(|a| a.read_scalar::<hdf5::types::VarLenUnicode>())
            .ok()
            .map(|v| v.as_str().to_string())
    };
    if text("model").as_deref() != Some("sage") {
        return Err(Error::bad_input(
            path,
            "not a GraphSAGE model: give the output of `graphscale train --model sage`",
        ));
    }
    let params = f
        .dataset("weights")
        .and_then(|d| d.read_raw::<f32>())
        .map_err(err("read weights"))?;
    let dims: Vec<usize> = f
        .attr("dims")
        .and_then(|a| a.read_raw::<u64>())
        .map_err(err("read attribute dims"))?
        .into_iter()
        .map(|d| d as usize)
        .collect();
    let config = text("config").and_then(|c| serde_json::from_str::<serde_json::Value>(&c).ok());
    let norm = config
        .as_ref()
        .and_then(|v| serde_json::from_value(v["feature_norm"].clone()).ok())
        .unwrap_or(FeatureNorm::Auto);
    let aggregator = config
        .as_ref()
        .and_then(|v| serde_json::from_value(v["aggregator"].clone()).ok())
        .unwrap_or(Aggregator::Mean);
    let input = config
        .as_ref()
        .and_then(|v| serde_json::from_value(v["input"].clone()).ok())
        .unwrap_or(SageInput::Features);
    let objective = config
        .as_ref()
        .and_then(|v| serde_json::from_value(v["objective"].clone()).ok());
    if objective == Some(SageObjective::Unsupervised) {
        return Err(Error::bad_input(
            path,
            "an unsupervised GraphSAGE model has no classes to score: its `embeddings` are the nodes' output rows; evaluate them with `graphscale eval nodeclf --embeddings` or `eval linkpred`",
        ));
    }
    let learned_dim = if input.learned() {
        f.dataset("input_rows")
            .map(|d| d.shape().get(1).copied().unwrap_or(0))
            .map_err(err(
                "open input_rows (the learnable input rows of --input learned|both)",
            ))?
    } else {
        0
    };
    let want = Sage::param_count(&dims, aggregator);
    let sage = Sage {
        dims,
        params,
        aggregator,
    };
    if sage.dims.len() < 2 || sage.params.len() != want {
        return Err(Error::bad_input(
            path,
            format!(
                "weights hold {} values, the widths {:?} need {want} (damaged file?)",
                sage.params.len(),
                sage.dims
            ),
        ));
    }
    Ok((
        sage,
        Trained {
            norm,
            input,
            learned_dim,
        },
    ))
}

/// Collective: `graphscale eval gnn`: the model in `model` over the nodes of `graph` with every
/// neighbour (layer-wise, sharded over the ranks as training is), scored against the graph's
/// labels on each split that has nodes.
pub fn evaluate(comm: &Comm, model: &Path, graph: &Path) -> Result<Vec<(String, SplitScores)>> {
    let (sage, t) = agree(comm, read_model(model))?;
    let at = Placement {
        graph: graph.to_path_buf(),
        strategy: Strategy::Sharded,
        partition: crate::graph::partition::Scheme::Striped,
        cache_rows: None,
        features: t.input.features(),
        node_memory: true,
        hidden_cols: sage.dims[1..sage.dims.len() - 1].iter().sum(),
    };
    let (mut src, _) = source(comm, &at, t.norm)?;
    let l = agree(comm, Labelled::load(graph))?;
    let k = *sage.dims.last().expect("layers");
    if src.cols() + t.learned_dim != sage.dims[0] || l.classes.max(2) != k {
        return Err(Error::bad_input(
            model,
            format!(
                "the model takes {} input values ({} learned) to {k} classes; {} has {} features and {} classes: give the graph it was trained on",
                sage.dims[0],
                t.learned_dim,
                graph.display(),
                src.cols(),
                l.classes.max(2)
            ),
        ));
    }
    let learned = match t.learned_dim {
        0 => None,
        dim => {
            let nodes = l.split.len() as u64;
            let mut lr = Learned::new(comm, src.partitioner(), nodes, dim, (0, 0.0));
            lr.load(model)?;
            Some(lr)
        }
    };
    let scored = Scored::new(
        comm,
        &sage,
        src.as_mut(),
        &mut Work::default(),
        learned.as_ref(),
    );
    let mut out = Vec::new();
    for (name, code) in [("train", TRAIN), ("valid", VALID), ("test", TEST)] {
        let c = l.counts(&scored.nodes, &scored.scores, code);
        let c = comm.all_reduce_u64(&c, ReduceOp::Sum);
        let all = c[3 * k + 1];
        if all == 0 {
            continue;
        }
        let f1s: Vec<f64> = (0..k)
            .filter(|&j| c[j] + c[k + j] + c[2 * k + j] > 0)
            .map(|j| 2.0 * c[j] as f64 / (2 * c[j] + c[k + j] + c[2 * k + j]) as f64)
            .collect();
        out.push((
            name.to_string(),
            SplitScores {
                nodes: all,
                accuracy: c[3 * k] as f64 / all as f64,
                micro_f1: micro_f1(&c, k),
                macro_f1: f1s.iter().sum::<f64>() / f1s.len().max(1) as f64,
            },
        ));
    }
    Ok(out)
}

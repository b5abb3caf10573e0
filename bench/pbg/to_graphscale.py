# A PyTorch-BigGraph checkpoint as graphscale knowledge-graph output (embeddings, relations,
# attributes model and gamma), entity and relation ids matched by name; entities PBG never saw
# (valid/test only) get zero rows. Usage: to_graphscale.py GS_TRAIN_H5 OUT_H5 MODEL VERSION
# CHECKPOINT_DIR ENTITY_DIR TRAIN_TSV
import h5py, json, sys, numpy as np
gs_train, out, model, version, ck, data, pbg_train = sys.argv[1:8]
g = h5py.File(gs_train, "r")
ents = [x.decode() if isinstance(x, bytes) else x for x in g["node_names"][:]]
rels = [x.decode() if isinstance(x, bytes) else x for x in g["relation_names"][:]]
names = json.load(open(f"{data}/entity_names_all_0.json"))
emb = h5py.File(f"{ck}/embeddings_all_0.v{version}.h5", "r")["embeddings"][:]
at = {n: i for i, n in enumerate(names)}
E = np.zeros((len(ents), emb.shape[1]), dtype=np.float32)
missing = 0
for i, n in enumerate(ents):
    if n in at:
        E[i] = emb[at[n]]
    else:
        missing += 1
pbg_rels = sorted({l.split("\t")[1] for l in open(pbg_train)})
m = h5py.File(f"{ck}/model.v{version}.h5", "r")
op = lambda r, name: m[f"model/relations/{pbg_rels.index(r)}/operator/rhs/{name}"][:]
if model == "complex":
    # PBG scores Re(h . conj(r o t)) with its operator on the tail: graphscale's ComplEx
    # Re(h r conj(t)) with the relation conjugated, halves [re | im] as graphscale's.
    R = np.stack([np.concatenate([op(r, "real"), -op(r, "imag")]) for r in rels]).astype(np.float32)
else:
    R = np.stack([op(r, "diagonal") for r in rels]).astype(np.float32)
with h5py.File(out, "w") as f:
    f["embeddings"] = E
    f["relations"] = R
    f.attrs["model"] = model
    f.attrs["gamma"] = np.float32(6.0)
print(f"{len(ents)} entities ({missing} without a PBG embedding: zero rows), {len(rels)} relations -> {out}")

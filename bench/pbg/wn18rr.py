# PyTorch-BigGraph config for DistMult or ComplEx on WN18RR, matched to graphscale's run: d 200,
# PBG_EPOCHS epochs (default 30), softmax over 256 uniform negatives (PBG adds its 50 in-batch
# negatives), Adagrad, 2 workers, one relation operator per relation (no dynamic relations: one
# relation vector, as graphscale's models have): diagonal (DistMult) or complex_diagonal
# (ComplEx). Used by bench/pbg/run.sh; PBG_TRAIN, PBG_MODEL, PBG_LR, PBG_EPOCHS and PBG_OUT come
# from the environment.
import os

OPERATOR = {"distmult": "diagonal", "complex": "complex_diagonal"}[os.environ.get("PBG_MODEL", "distmult")]

NAMES = sorted({l.split("\t")[1] for l in open(os.environ["PBG_TRAIN"])})


def get_torchbiggraph_config():
    out = os.environ["PBG_OUT"]
    return dict(
        entity_path=f"{out}/data",
        edge_paths=[f"{out}/data/train_p"],
        checkpoint_path=f"{out}/model",
        entities={"all": {"num_partitions": 1}},
        relations=[{"name": n, "lhs": "all", "rhs": "all", "operator": OPERATOR} for n in NAMES],
        dynamic_relations=False,
        dimension=200,
        global_emb=False,
        comparator="dot",
        num_epochs=int(os.environ.get("PBG_EPOCHS", "30")),
        num_uniform_negs=256,
        batch_size=1000,
        loss_fn="softmax",
        lr=float(os.environ.get("PBG_LR", "0.5")),
        eval_fraction=0,
        workers=2,
    )

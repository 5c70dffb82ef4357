""".venv/bin/python scripts/select_defaults.py [--quick] [--models lr,fm,wdl,deepfm] [--seeds 0]

How des.train's defaults were chosen: for each model, a few candidate settings (below) are trained
on the shipped sample's training split with early stopping on its validation split (up to
``--epochs`` passes, ``--early-stop`` validations without improvement, per-epoch validation), and
the candidate with the best mean validation AUC wins. Only validation rows decide: the test split
is neither read nor reported here (``scripts/bench_deepctr.py`` reports test metrics of the
defaults next to DeepCTR and scikit-learn).

Expect (2-core machine, seed 0; the validation split has only ~1.6k rows, so differences below
~0.002 are noise): W&D and DeepFM pick Adam lr 0.003 with ``catchup=1`` (validation AUC ~0.763 /
~0.768), FM Adam lr 0.001 (~0.771); LR (run with ``--models lr --epochs 20``) FTRL alpha 1 (~0.779),
best after ~13 epochs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import benchlib

#: model -> candidate name -> des.train flags (the first candidate of each model is the old default)
CANDIDATES: dict[str, dict[str, dict[str, str]]] = {
    "deepfm": {
        "adam 1e-3 lazy (old default)": {"embedding_optimizer": "adam:lr=0.001"},
        "adam 1e-3 catchup": {"embedding_optimizer": "adam:lr=0.001,catchup=1"},
        "adam 3e-3 lazy": {"embedding_optimizer": "adam:lr=0.003"},
        "adam 3e-3 catchup": {"embedding_optimizer": "adam:lr=0.003,catchup=1"},
    },
    "lr": {
        "ftrl 0.5 (old default)": {"linear_optimizer": "ftrl:alpha=0.5,beta=1.0"},
        "ftrl 0.1": {"linear_optimizer": "ftrl:alpha=0.1,beta=1.0"},
        "ftrl 1": {"linear_optimizer": "ftrl:alpha=1.0,beta=1.0"},
        "ftrl 2": {"linear_optimizer": "ftrl:alpha=2.0,beta=1.0"},
        "adagrad 0.05": {"linear_optimizer": "adagrad:lr=0.05"},
        "adagrad 0.2": {"linear_optimizer": "adagrad:lr=0.2"},
        "ftrl 1, l2 0.01": {"linear_optimizer": "ftrl:alpha=1.0,beta=1.0,l2=0.01"},
        "ftrl 1, l2 0.1": {"linear_optimizer": "ftrl:alpha=1.0,beta=1.0,l2=0.1"},
    },
}
CANDIDATES["wdl"] = CANDIDATES["fm"] = CANDIDATES["deepfm"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lr,fm,wdl,deepfm")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--epochs", type=int, default=10, help="at most this many passes")
    parser.add_argument("--early-stop", type=int, default=1, help="validations without improvement")
    parser.add_argument("--data", default=str(benchlib.SAMPLE))
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.epochs = "lr,deepfm", 2
    seeds = [int(s) for s in args.seeds.split(",")]
    bench = benchlib.Bench(__file__, args)
    rows = []
    for model in args.models.split(","):
        for name, flags in CANDIDATES[model].items():
            aucs, epochs = [], []
            for seed in seeds:
                tag = f"{model}-{len(rows)}-s{seed}"
                s = bench.train(1, tag, model=model, seed=seed, data=args.data, epochs=args.epochs,
                                early_stop=args.early_stop, **flags)
                if s is not None:
                    aucs.append(s["validation_auc"])
                    records = [json.loads(x) for x in (bench.jobs / tag / "metrics.jsonl").read_text().splitlines()]
                    epochs.append(next(r["epoch"] + 1 for r in records if r["step"] == s["best_step"]))
            mean, std = benchlib.mean_std(aucs)
            rows.append({"model": model, "candidate": name, "flags": " ".join(f"--{k.replace('_', '-')} {v}"
                                                                             for k, v in flags.items()),
                         "validation_auc": mean, "std": std, "best_epochs": ",".join(map(str, epochs))})
    for model in args.models.split(","):
        best = max((r for r in rows if r["model"] == model), key=lambda r: r["validation_auc"])
        best["chosen"] = "yes"
    columns = [("model", "model", ""), ("candidate", "candidate", ""), ("flags", "flags", ""),
               ("validation_auc", "validation AUC (mean)", ".4f"), ("std", "std", ".4f"),
               ("best_epochs", "best epoch per seed", ""), ("chosen", "chosen", "")]
    notes = [f"Shipped sample, split 90/5/5 (split seed 0), seeds {args.seeds}, up to {args.epochs} epochs, "
             f"--early-stop {args.early_stop} on the validation AUC (per epoch), 1 rank (N ranks train the same). "
             "Chosen on validation only; the test split is not used."]
    bench.finish(rows, [("Defaults chosen on validation", columns, rows)], notes, None)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())

""".venv/bin/python scripts/select_defaults.py [--quick] [--models lr,fm,wdl,deepfm] [--seeds 0,1,2] [--candidates 'a;b']

How des.train's defaults were chosen: for each model, a few candidate settings (below; the first of
each model is the previous default) are trained on the shipped sample's training split with early
stopping on its validation split (up to ``--epochs`` passes, ``--early-stop`` validations without
improvement, per-epoch validation), and the candidate with the best mean validation AUC over
``--seeds`` wins. Only validation rows decide: the test split is neither read nor reported here
(``scripts/bench_deepctr.py`` reports test metrics of the defaults next to DeepCTR and
scikit-learn). ``--candidates`` runs only the candidates whose name contains one of the given
';'-separated strings.

Candidates with ``--min-count 2 --unadmitted shared`` (one trained row per field for ids seen once
and unknown ids) are eligible like any other: ``des.export`` serves unknown and unadmitted ids the
field's shared row, as ``des.evaluate`` does.

Expect (2-core machine, seeds 0,1,2, ``--epochs 20 --early-stop 2`` as des.train's default
command; ~3 min per DeepFM candidate, ~2 min per LR or FM candidate; the validation split has only
~1.6k rows, so differences below ~0.002 are noise): DeepFM and W&D pick Adam 1e-3 ``catchup=1``,
batch 256, N(0, 1e-4) with ``--min-count 2 --unadmitted shared`` (validation AUC 0.7854 / 0.7850,
vs 0.7820 / 0.7822 with a row per id; earlier runs: batch 1024 -> 512 -> 256 -> 128 ~0.769 ->
~0.774 -> ~0.778 -> ~0.780). LR picks AdaGrad lr 0.1, batch 256, ``--min-count 2 --unadmitted
shared`` with ``--l2-embedding 0.01`` (0.7807; every shared-row candidate 0.7797 to 0.7807, every
per-id one 0.7795 to 0.7799; FTRL l2 1 or 3 worse, ~0.776 / ~0.766), best after ~10 epochs. FM:
a tie (0.7712 to 0.7737), the best lazy Adam 1e-3, batch 256, N(0, 1e-4), a row per id (the shared
row 0.7733, batch 1024 N(0, 0.01) 0.7720).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import benchlib

#: every id its own row from its first occurrence (ids seen fewer than N times share one trained row
#: per field: ``{"min_count": str(N), "unadmitted": "shared"}``)
_PER_ID = {"min_count": "1", "unadmitted": "init"}
_INIT = {"0.01": "0.01", "1e-4": "0.0001"}
_OPTIMIZERS = {"adam 1e-3 lazy": "adam:lr=0.001", "adam 1e-3 catchup": "adam:lr=0.001,catchup=1",
               "adam 3e-3 catchup": "adam:lr=0.003,catchup=1", "ftrl 1": "ftrl:alpha=1.0,beta=1.0",
               "ftrl 0.5": "ftrl:alpha=0.5,beta=1.0", "ftrl 1, l2 1": "ftrl:alpha=1.0,beta=1.0,l2=1.0",
               "ftrl 1, l2 3": "ftrl:alpha=1.0,beta=1.0,l2=3.0", "adagrad 0.05": "adagrad:lr=0.05",
               "adagrad 0.1": "adagrad:lr=0.1", "adagrad 0.2": "adagrad:lr=0.2"}


def _candidates(*settings: tuple) -> dict[str, dict[str, str]]:
    """``(optimizer, batch, init or None, shared[, l2])`` -> name -> des.train flags (``shared``:
    False, or True / N for ``--min-count 2`` / ``N --unadmitted shared``). Every candidate
    names all the flags that any candidate of the model varies, so a row means the same whatever
    the defaults are; the optimizer is the embeddings' (init given) or the order-1 weights' (LR,
    init None); ``l2`` is ``--l2-embedding`` (l2 on the looked-up rows)."""
    out = {}
    with_l2 = any(len(s) > 4 for s in settings)
    for optimizer, batch, init, shared, *l2 in settings:
        flag = "linear_optimizer" if init is None else "embedding_optimizer"
        count = 2 if shared is True else int(shared)
        name = (f"{optimizer}, batch {batch}" + (f", init {init}" if init else "")
                + (f", min-count {count} shared" if shared else "") + (f", l2 {l2[0]}" if l2 else ""))
        admission = {"min_count": str(count), "unadmitted": "shared"} if shared else _PER_ID
        out[name] = {flag: _OPTIMIZERS[optimizer], "batch_size": str(batch),
                     **({"init_scale": _INIT[init]} if init else {}), **admission,
                     **({"l2_embedding": l2[0] if l2 else "0"} if with_l2 else {})}
    return out


#: model -> candidate name -> des.train flags (the first of each model is the previous default)
CANDIDATES: dict[str, dict[str, dict[str, str]]] = {
    "deepfm": _candidates(
        ("adam 1e-3 catchup", 256, "1e-4", False), ("adam 3e-3 catchup", 1024, "0.01", False),
        ("adam 3e-3 catchup", 1024, "1e-4", False), ("adam 1e-3 catchup", 512, "0.01", False),
        ("adam 3e-3 catchup", 512, "0.01", False), ("adam 1e-3 catchup", 512, "1e-4", False),
        ("adam 1e-3 catchup", 256, "0.01", False), ("adam 3e-3 catchup", 256, "0.01", False),
        ("adam 1e-3 catchup", 128, "0.01", False), ("adam 1e-3 catchup", 256, "1e-4", True)),
    "fm": _candidates(
        ("adam 1e-3 lazy", 256, "1e-4", False), ("adam 1e-3 lazy", 1024, "0.01", False),
        ("adam 1e-3 lazy", 512, "0.01", False), ("adam 1e-3 lazy", 256, "0.01", False),
        ("adam 1e-3 lazy", 1024, "1e-4", False), ("adam 1e-3 catchup", 256, "1e-4", False),
        ("adam 1e-3 lazy", 256, "1e-4", True), ("adam 1e-3 catchup", 256, "1e-4", True),
        ("adam 1e-3 lazy", 1024, "0.01", True)),
    "lr": _candidates(
        ("adagrad 0.1", 256, None, False), ("ftrl 1", 1024, None, False), ("ftrl 1, l2 1", 1024, None, False),
        ("ftrl 1, l2 3", 1024, None, False), ("ftrl 0.5", 256, None, False), ("adagrad 0.05", 256, None, False),
        ("adagrad 0.1", 128, None, False), ("adagrad 0.1", 256, None, False, "0.001"),
        ("adagrad 0.1", 256, None, True), ("adagrad 0.05", 256, None, True), ("adagrad 0.1", 128, None, True),
        ("adagrad 0.1", 256, None, True, "0.001"), ("adagrad 0.1", 256, None, True, "0.01"),
        ("ftrl 0.5", 256, None, True), ("adagrad 0.1", 256, None, 3), ("adagrad 0.1", 256, None, True, "0.03"),
        ("adagrad 0.2", 256, None, True)),
}
CANDIDATES["wdl"] = {name: flags for name, flags in CANDIDATES["deepfm"].items() if "batch 128" not in name}


def mark_chosen(rows: list[dict]) -> None:
    """Per model, the row with the best mean validation AUC gets ``chosen = "yes"``."""
    for model in dict.fromkeys(r["model"] for r in rows):
        max((r for r in rows if r["model"] == model), key=lambda r: r["validation_auc"])["chosen"] = "yes"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lr,fm,wdl,deepfm")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--epochs", type=int, default=20, help="at most this many passes (des.train's default)")
    parser.add_argument("--early-stop", type=int, default=2, help="validations without improvement (des.train's "
                        "auto)")
    parser.add_argument("--candidates", default="", help="only the candidates whose name contains one of these "
                        "';'-separated strings (e.g. 'batch 256;batch 128'; default: all)")
    parser.add_argument("--data", default=str(benchlib.SAMPLE))
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.epochs = "lr,deepfm", 2
    seeds = [int(s) for s in args.seeds.split(",")]
    bench = benchlib.Bench(__file__, args)
    rows = []
    for model in args.models.split(","):
        wanted = [w for w in args.candidates.split(";") if w]
        for name, flags in CANDIDATES[model].items():
            if wanted and not any(w in name for w in wanted):
                continue
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
    mark_chosen(rows)
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

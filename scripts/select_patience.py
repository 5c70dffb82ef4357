""".venv/bin/python scripts/select_patience.py [--quick] [--seeds 0,1,2] [--epochs 20] [--patience 1,2,3,4,6,8] [--data criteo,avazu,movielens]

How the default patience of early stopping (``--early-stop auto``) is chosen: DeepFM with its
default options is trained for ``--epochs`` passes with per-epoch validation and no early stopping,
on each data set and seed; every candidate patience p is then replayed on the recorded validation
AUCs (training stops after p validations in a row without improvement and keeps the best
checkpoint, as ``des.train`` does), giving the validation AUC of the model each patience would
keep and the epochs it would train. The patience with the best mean over data sets (each data
set's mean over seeds; ties: the smaller p, which trains less) wins. Only validation rows decide;
the test split is not read here.

Data: ``criteo`` (the shipped sample), ``avazu`` (the shipped Avazu sample, ``--schema avazu``),
``movielens`` (MovieLens 100K joined by ``examples/movielens.py`` from ``../shared``, label
``rating >= 4``; skipped when ``../shared`` is absent).

Expect (a 2-core machine, a few minutes per data set and seed): DeepCTR-style models keep improving
for several epochs on small data; a patience of 2 stops some runs on a one-epoch plateau.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import benchlib

SHARED_MOVIELENS = benchlib.REPO.parent / "shared" / "data" / "movielens-100k" / "raw"
DATA_FLAGS = {
    "criteo": {},
    "avazu": {"schema": "avazu", "data": str(benchlib.REPO / "datasets" / "avazu_sample.csv.gz")},
    "movielens": {"schema": str(benchlib.REPO / "examples" / "movielens.toml")},
}


def replay(aucs: Sequence[float], patience: int) -> tuple[float, int]:
    """The validation AUC of the checkpoint early stopping with ``patience`` keeps (the best so far
    when it stops, or at the end) and how many validations it ran."""
    best, since = -1.0, 0
    for i, auc in enumerate(aucs):
        if auc > best:
            best, since = auc, 0
        else:
            since += 1
            if since >= patience:
                return best, i + 1
    return best, len(aucs)


def choose(curves: Mapping[str, Sequence[Sequence[float]]], candidates: Sequence[int]) -> tuple[int, list[dict]]:
    """Per candidate: the mean over data sets of each data set's mean over seeds; the best wins."""
    rows = []
    for p in candidates:
        row: dict = {"patience": p}
        for name, runs in curves.items():
            kept = [replay(aucs, p) for aucs in runs]
            row[f"{name} AUC"] = sum(k[0] for k in kept) / len(kept)
            row[f"{name} epochs"] = sum(k[1] for k in kept) / len(kept)
        row["mean AUC"] = sum(row[f"{name} AUC"] for name in curves) / len(curves)
        rows.append(row)
    best = max(rows, key=lambda r: (round(r["mean AUC"], 12), -r["patience"]))
    return int(best["patience"]), rows


def movielens_csv(bench: benchlib.Bench) -> str | None:
    if not SHARED_MOVIELENS.is_dir():
        bench.log(f"movielens: {SHARED_MOVIELENS} is absent, skipped")
        return None
    out = bench.folder / "movielens.csv"
    if not out.exists():
        bench.run_command([str(benchlib.PYTHON), str(benchlib.REPO / "examples" / "movielens.py"), "--source",
                           str(SHARED_MOVIELENS), "--output", str(out)], label="movielens.csv")
    return str(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--patience", default="1,2,3,4,6,8")
    parser.add_argument("--data", default="criteo,avazu,movielens")
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    candidates = benchlib.positive_ints(args.patience, "patience")
    epochs = 2 if args.quick else args.epochs
    bench = benchlib.Bench("select_patience", args)
    curves: dict[str, list[list[float]]] = {}
    for name in [d for d in args.data.split(",") if d]:
        flags = dict(DATA_FLAGS[name])
        if name == "movielens":
            path = movielens_csv(bench)
            if path is None:
                continue
            flags["data"] = path
        for seed in (seeds[:1] if args.quick else seeds):
            tag = f"{name}-s{seed}"
            summary = bench.train(1, tag, model="deepfm", seed=seed, epochs=epochs, early_stop=0, **flags)
            if summary is None:
                continue
            lines = (bench.jobs / tag / "metrics.jsonl").read_text().splitlines()
            aucs = [float(r["auc"]) for r in map(json.loads, lines) if r.get("auc") is not None]
            curves.setdefault(name, []).append(aucs)
    if not curves:
        raise SystemExit("no run finished")
    chosen, rows = choose(curves, candidates)
    columns = [("patience", "patience", "d")]
    for name in curves:
        columns += [(f"{name} AUC", f"{name}: validation AUC kept", ".4f"),
                    (f"{name} epochs", f"{name}: epochs trained", ".1f")]
    columns.append(("mean AUC", "mean over data sets", ".4f"))
    notes = [f"DeepFM, default options, {epochs} epochs with per-epoch validation and no early stopping, seeds "
             f"{','.join(map(str, seeds))}; each patience replayed on the recorded validation AUCs. Chosen: "
             f"patience {chosen} (the best mean over data sets; ties: the smaller)."]
    bench.finish(rows, [("early stopping's patience on validation", columns, rows)], notes, extra={"chosen": chosen,
                 "curves": curves})
    return 0


if __name__ == "__main__":
    sys.exit(main())

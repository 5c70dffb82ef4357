""".venv/bin/python scripts/bench_fuxictr.py [--quick] [--data STORE] [--seeds 0,1,2] [--epochs 10] [--venv DIR] [--skip-install]

FinalMLP as FuxiCTR builds it (FuxiCTR 2.3.10, PyTorch on CPU) trained on des's train / validation
/ test rows of the shipped Criteo sample (90/5/5, split seed 0; or ``--data STORE``), to sit next
to des's ``finalmlp`` on the same rows. Test AUC and logloss of the epoch with the best validation
AUC (up to ``--epochs``), per seed and mean ± std.

FuxiCTR's wheel ships its blocks (``fuxictr.pytorch.layers.MLP_Block``) but not its model zoo,
where ``FinalMLP`` lives; the child builds FinalMLP from ``MLP_Block`` exactly as the model zoo's
``FinalMLP.py`` does (two ``MLP_Block`` streams over the flattened embeddings; ``FeatureSelection``
without context: a zero ``[1, k]`` context through an ``MLP_Block`` with a sigmoid output, times 2;
``InteractionAggregation``: ``w_x(x) + w_y(y)`` and the per-head ``x_hᵀ W_h y_h``, as one einsum), with
FuxiCTR's ``BaseModel.reset_parameters`` (Glorot-normal Linear weights, zero biases, Glorot-normal
``w_xy``), its embedding init N(0, 1e-4), one Adam (lr 1e-3) on every parameter and no
regularizer (the model zoo's template); subnormals flushed to zero, as TensorFlow runs. The network is des's ``finalmlp`` default (k = 8,
``--hidden`` 400-400-400, stream 2 800, gate 64, one head); batch 256 as des's default.

The parent (this script in des's ``.venv``) reads the store with des's reader
(``bench_torchrec.export_arrays``: ids re-indexed 0..V-1 per field over all rows) into the run
folder's ``data.npz``; the child runs in a venv of its own (``--venv``, default ``.venv-fuxictr``
next to ``.venv``, created once with ``torch==2.13.0+cpu`` (the local CPU wheel), FuxiCTR's
dependencies and ``fuxictr==2.3.10``), imports numpy, torch, fuxictr and scikit-learn, never des,
and prints one ``FUXICTR {json}`` line.

Expect (a 2-core machine, seeds 0,1,2, 10 epochs: a few minutes per seed): test AUC about
0.764 ± 0.005 at the first epoch for every seed (validation AUC falls after it), equal to des's
``finalmlp`` (0.763 ± 0.004) within the seeds' spread (docs/benchmarks.md, "FinalMLP").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import bench_torchrec  # imports no des at module level (the child runs where des is not installed)

FUXICTR_VENV = Path(__file__).resolve().parent.parent / ".venv-fuxictr"
RESULT_PREFIX = "FUXICTR "
INSTALL_STEPS = [
    ["-m", "pip", "install", "--quiet", bench_torchrec.TORCH, "numpy", "pandas", "pyyaml", "scikit-learn", "h5py",
     "tqdm", "pyarrow", "polars", "pydantic", "ray[data]>=2.52.0"],
    ["-m", "pip", "install", "--quiet", "--no-deps", "fuxictr==2.3.10"],
]
NETWORK = {"embedding_dim": 8, "hidden": [400, 400, 400], "mlp2_hidden": [800], "fs_hidden": [64], "num_heads": 1,
           "batch_size": 256, "lr": 0.001, "init_std": 1e-4}


def final_mlp(vocab_sizes: Sequence[int], net: dict):
    """FuxiCTR's FinalMLP (model zoo) on ``MLP_Block``, over one table per field."""
    import torch
    from torch import nn
    from fuxictr.pytorch.layers import MLP_Block

    fields, k = len(vocab_sizes), net["embedding_dim"]
    width = fields * k

    class FinalMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tables = nn.ModuleList(nn.Embedding(int(v), k) for v in vocab_sizes)
            self.mlp1 = MLP_Block(width, net["hidden"], "ReLU")
            self.mlp2 = MLP_Block(width, net["mlp2_hidden"], "ReLU")
            self.contexts = nn.ParameterList(nn.Parameter(torch.zeros(1, k)) for _ in range(2))
            self.gates = nn.ModuleList(MLP_Block(k, net["fs_hidden"], "ReLU", output_dim=width,
                                                 output_activation="Sigmoid") for _ in range(2))
            x_dim, y_dim, heads = net["hidden"][-1], net["mlp2_hidden"][-1], net["num_heads"]
            self.heads, self.hx, self.hy = heads, x_dim // heads, y_dim // heads
            self.w_x, self.w_y = nn.Linear(x_dim, 1), nn.Linear(y_dim, 1)
            self.w_xy = nn.Parameter(torch.empty(heads * self.hx * self.hy, 1))
            for m in self.modules():  # BaseModel.reset_parameters
                if isinstance(m, nn.Linear):
                    nn.init.xavier_normal_(m.weight)
                    nn.init.zeros_(m.bias)
            nn.init.xavier_normal_(self.w_xy)
            for table in self.tables:
                nn.init.normal_(table.weight, std=net["init_std"])

        def forward(self, ids):
            flat = torch.cat([table(ids[:, f]) for f, table in enumerate(self.tables)], dim=1)
            x, y = (mlp(flat * 2 * gate(ctx.repeat(flat.size(0), 1)))
                    for mlp, gate, ctx in zip((self.mlp1, self.mlp2), self.gates, self.contexts))
            head_x, head_y = x.view(-1, self.heads, self.hx), y.view(-1, self.heads, self.hy)
            # the model zoo's x_hᵀ W_h y_h, as one einsum: its broadcast matmul's backward holds a
            # [B, heads·hx·hy] gradient (80M floats a step at B=256 with one head of 400 x 800)
            xy = torch.einsum("bhi,hij,bhj->b", head_x, self.w_xy.view(self.heads, self.hx, self.hy), head_y)
            return self.w_x(x)[:, 0] + self.w_y(y)[:, 0] + xy

    return FinalMLP()


def train_child(data: str, seed: int, epochs: int, threads: int) -> dict:
    """One seed in the FuxiCTR venv: the best validation epoch's test metrics, every epoch's."""
    import numpy as np
    import torch
    import fuxictr
    from sklearn.metrics import log_loss, roc_auc_score

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # as TensorFlow runs (Adam's decaying moments of untouched rows go subnormal)
    arrays = np.load(data)
    ids, labels = torch.from_numpy(arrays["sparse_ids"].astype(np.int64)), arrays["labels"]
    model, rng = final_mlp(arrays["vocab_sizes"], NETWORK), np.random.default_rng(seed)
    optimizer, loss_fn = torch.optim.Adam(model.parameters(), lr=NETWORK["lr"]), torch.nn.BCEWithLogitsLoss()

    def predict(rows):
        model.eval()
        with torch.no_grad():
            return torch.sigmoid(model(ids[rows])).numpy().astype(np.float64)

    history, seconds, samples, batch = [], 0.0, 0, NETWORK["batch_size"]
    for epoch in range(epochs):
        model.train()
        order, start = rng.permutation(arrays["train"]), time.perf_counter()
        for i in range(0, len(order) - batch + 1, batch):
            rows = order[i:i + batch]
            optimizer.zero_grad()
            loss_fn(model(ids[rows]), torch.from_numpy(labels[rows])).backward()
            optimizer.step()
            samples += len(rows)
        seconds += time.perf_counter() - start
        metrics = {"epoch": epoch + 1}
        for split in ("validation", "test"):
            p = predict(arrays[split])
            metrics[f"{split}_auc"], metrics[f"{split}_logloss"] = (roc_auc_score(labels[arrays[split]], p),
                                                                    log_loss(labels[arrays[split]], p))
        history.append(metrics)
    best = max(history, key=lambda m: m["validation_auc"])
    return {"seed": seed, "best_epoch": best["epoch"], **{k: best[k] for k in best if k != "epoch"},
            "samples_per_second": samples / seconds, "history": history,
            "versions": {"fuxictr": fuxictr.__version__, "torch": torch.__version__}}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:  # the FuxiCTR venv: no des, no benchlib
        data, seed, epochs, threads = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
        print(RESULT_PREFIX + json.dumps(train_child(data, seed, epochs, threads)), flush=True)
        return 0
    import numpy as np

    import bench_deepctr
    import benchlib

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(benchlib.SAMPLE))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=10, help="epochs; the best on validation AUC is reported")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in the child")
    parser.add_argument("--venv", default=str(FUXICTR_VENV), help="the FuxiCTR venv (created if missing)")
    parser.add_argument("--skip-install", action="store_true", help="use --venv as it is")
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.epochs = "0", 1
    bench = benchlib.Bench(__file__, args)
    venv = Path(args.venv)
    benchlib.ensure_venv(bench, venv, INSTALL_STEPS, "import torch, fuxictr, sklearn; from fuxictr.pytorch.layers "
                         "import MLP_Block; print('PROBE torch', torch.__version__, 'fuxictr', fuxictr.__version__)",
                         args.skip_install)
    store = bench_deepctr.open_store(args.data)
    np.savez(bench.folder / "data.npz", **bench_torchrec.export_arrays(store, need_dense=False))
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        out = bench.run_command([str(venv / "bin" / "python"), str(Path(__file__).resolve()), "--child",
                                 str(bench.folder / "data.npz"), str(seed), str(args.epochs), str(args.threads)],
                                label=f"fuxictr seed {seed}").stdout
        lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
        if not lines:
            raise benchlib.BenchError(f"fuxictr seed {seed}: no {RESULT_PREFIX.strip()} line in the output")
        runs.append(json.loads(lines[-1][len(RESULT_PREFIX):]))
    versions = runs[0]["versions"] if runs else {}
    notes = [f"{args.data}, split 90/5/5 (split seed 0), seeds {args.seeds}, up to {args.epochs} epochs, the epoch "
             f"with the best validation AUC. FuxiCTR {versions.get('fuxictr', '?')}'s MLP_Block, torch "
             f"{versions.get('torch', '?')}, {args.threads} thread(s). Network: {NETWORK}. Ids re-indexed per field over "
             "all rows (no admission: every id its own row; des's default shares one row per field among ids seen once)."]
    bench.finish(runs, [("FuxiCTR's FinalMLP", bench_torchrec.COLUMNS, bench_torchrec.table_rows(runs))], notes, None)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""The package's shape: no import cycle in des/, strategies never import the runner or the CLIs,
the layers import no model, strategy or data, the configuration, the collectives, the metrics and the pipeline import no floor above them, and checkpoints
written before the strategy protocol (format des-checkpoint/1) still load."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from tests.conftest import REPO, run_here

PACKAGE = REPO / "des"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Module -> the des modules it imports anywhere (top level or inside functions)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from .x import y
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets |= {base} | {f"{base}.{a.name}" for a in node.names}
        # A module's own parent packages are always imported before it: not an edge of a cycle.
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = {t for t in targets if t in modules and t != name and t not in ancestors}
    return graph


def test_no_import_cycle_in_the_package() -> None:
    graph = imports()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_lower_floors_never_import_upward() -> None:
    graph = imports()
    upper = {"des.train", "des.runner", "des.startup", "des.run", "des.reporting", "des.building", "des.evaluate",
             "des.check", "des.export", "des.predictions", "des.option_docs"}
    for module, targets in graph.items():
        if module.startswith(("des.strategies", "des.models", "des.layers", "des.substitutions", "des.hashtable",
                              "des.collectives", "des.data")):
            assert not targets & upper, f"{module} imports {targets & upper}"
    # the collectives split batches by des.row_blocks, not by the data's reader; the configuration
    # lists the strategies by des.builtin_names, without importing them; the metrics take arrays
    # (a split's predictions, which read the store, are des.predictions); the pipeline drives any
    # strategy's step parts and imports nothing of des (its thread's initializer is passed in); the
    # layers are blocks of models' top networks: TensorFlow and ParamSpec, nothing of what trains them
    above = {"des.layers": ("des.models", "des.strategies", "des.data", "des.hashtable", "des.collectives"),
             "des.collectives": ("des.data",), "des.config": ("des.strategies",), "des.metrics": ("des.data",),
             "des.strategies.pipeline": ("des",)}
    for module, targets in graph.items():
        for floor, forbidden in above.items():
            if module == floor or module.startswith(floor + "."):
                wrong = sorted(t for t in targets if t.startswith(forbidden))
                assert not wrong, f"{module} imports {wrong}"


def test_a_checkpoint_of_the_previous_version_still_loads(tmp_path: Path) -> None:
    """tests/data/checkpoint-v1: DeepFM, 3 synthetic fields, trained 4 steps on 2 ranks by des before the
    strategy protocol; its des.evaluate predictions on the test split were recorded then. Loaded
    here on one rank (in this process): every field's files, written by either rank."""
    from des.data.synth import default_config, synthesize_store

    config = default_config(seed=0, vocab_scale=0.001)
    synthesize_store(tmp_path / "narrow", 400, type(config)(fields=config.fields[:3], seed=0), split=(0.8, 0.1, 0.1))
    out = tmp_path / "predictions.txt"
    run_here(["-m", "des.evaluate", "--checkpoint", str(REPO / "tests" / "data" / "checkpoint-v1"), "--data",
              str(tmp_path / "narrow"), "--split", "test", "--predictions", str(out)])
    expected = np.loadtxt(REPO / "tests" / "data" / "checkpoint-v1-predictions.txt")
    np.testing.assert_allclose(np.loadtxt(out), expected, rtol=4 * 2.0**-24, atol=1e-8)  # float32 as %.8f: a few ulps


def test_strategy_options_are_declared_once_on_their_class() -> None:
    """A strategy's own options are a typed ``Options`` on its class, each a ``des.train`` option of
    the same name and default (so a strategy built in a notebook runs as the command line's), and no
    strategy reads an option by its name."""
    import dataclasses

    from des.builtin_names import default_strategy_names
    from des.config import TrainConfig
    from des.strategies import get_strategy

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for name in default_strategy_names():
        for option in dataclasses.fields(get_strategy(name).Options):
            assert option.name in defaults and option.default == defaults[option.name], (name, option.name)
    for path in (PACKAGE / "strategies").glob("*.py"):
        text = path.read_text()
        assert "options.get(" not in text and "options[" not in text, path.name

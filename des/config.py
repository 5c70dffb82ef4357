"""The training configuration: one dataclass, filled from defaults < a TOML file < command-line flags.

Every field is a flag (``--batch-size``), a TOML key (``batch_size = 2048``) and an entry of the
run folder's ``config.json``; the help text lives next to the field, once. What ``auto`` means for
the optimizers, admission, l2 and early stopping is the model class's ``defaults``
(``des.models.ModelDefaults``), looked up when first resolved.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from des.builtin_names import MODELS, default_strategy_names
from des.errors import ArgumentParser, ConfigError, UsageError

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
SHIPPED_SAMPLE = PACKAGE_ROOT / "datasets" / "criteo_sample.txt.gz"


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class TrainConfig:
    """Hyper-parameter defaults are tuned for the shipped 32,852-row Criteo sample (docs/training.md)."""

    model: str = _opt("deepfm", f"model to train: {', '.join(MODELS)} or a registered user model")
    plugins: str = _opt("", "comma-separated modules or .py files to import first (user models/substitutions)")
    data: str = _opt(str(SHIPPED_SAMPLE), "raw Criteo TSV/.gz file or a prepared directory, split by --split")
    train_data: str = _opt("", "separate training input instead of --data/--split: one or more raw Criteo TSV/.gz "
                           "files, directories prepared by des.data prepare (all their rows) or globs (matches in "
                           "natural order: day_2 before day_10), read in order as one stream", nargs="+")
    validation_data: str = _opt("", "validation input with --train-data (the same forms); without it nothing is "
                                "validated and --early-stop auto is off", nargs="+")
    test_data: str = _opt("", "test input with --train-data (the same forms), evaluated at the end", nargs="+")
    schema: str = _opt("", "the data's schema: criteo, avazu, a BARS x1 dataset's (docs/bars.md) or a TOML file "
                       "(docs/data.md); empty: "
                       "criteo for raw files, a prepared directory's own")
    stream: str = _opt("", "continuous training instead of --data: a directory (its files matching --stream-glob) "
                       "or comma-separated files, read in name order, one pass, each file prepared when it comes, "
                       "tested by the current model (progressive validation), then trained on (docs/training.md, "
                       "\"Continuous training\")")
    stream_glob: str = _opt("*", "the files of a --stream directory (names starting with '.' or ending '.tmp' "
                            "are never read: a producer writes there first, then renames)")
    stream_shuffle: str = _opt("on", "a stream file's batches in a seeded order (default_rng([seed, file index])), "
                               "or off: in file order", choices=("on", "off"))
    follow: bool = _opt(False, "--stream directory: when its files are done, wait for new ones (every "
                        "--follow-interval seconds) until SIGTERM/SIGINT or --follow-timeout")
    follow_interval: float = _opt(10.0, "seconds between two listings of a followed --stream directory")
    follow_timeout: float = _opt(0.0, "end a followed stream after this many seconds without a new file (0: never)")
    progressive_every_rows: int = _opt(0, "progressive validation of a stream every R rows (whole batches, in "
                                       "training order) instead of per file (0)")
    cache_dir: str = _opt("", "where raw files are prepared (default ~/.cache/des)")
    split: str = _opt("0.9,0.05,0.05", "train,validation,test fractions of a raw file")
    split_seed: int = _opt(0, "seed of the train/validation/test split")
    bad_rows: str = _opt("fail", "malformed input rows: fail on the first, or skip and count", choices=("fail", "skip"))

    embedding_dim: int = _opt(8, "embedding size k")
    hidden: str = _opt("400,400,400", "DNN layer widths, the first is the substituted FC layer")
    activation: str = _opt("relu", "DNN activation (prelu: a learned slope per unit for negative inputs, starting at "
                           "0: DIN's)", choices=("relu", "tanh", "sigmoid", "prelu"))
    model_options: str = _opt("", "the model's own constructor options as name=value pairs separated by ';', a "
                              "list comma-separated (dcnv2: 'cross_layers=2;structure=stacked;cross=mix', dlrm: "
                              "'bottom=512,256'); a name the model does not take lists those it does")
    init_scale: float = _opt(1e-4, "std of the normal initializer of embeddings (DeepCTR's default; chosen on the "
                             "sample's validation split: scripts/select_defaults.py)")
    l2_embedding: float = _opt(-1.0, "l2 on looked-up embeddings and order-1 weights (per sample, batch mean); -1: "
                               "auto, 0.01 for lr, 0 for the other models (chosen on the shipped sample's "
                               "validation split: scripts/select_defaults.py)")
    l2_dense: float = _opt(0.0, "l2 on dense kernels (first FC layer and the top network)")

    batch_size: int = _opt(256, "global batch size (every rank processes the whole batch, its own fields; 256 was "
                           "chosen on the shipped sample's validation split, larger data trains faster with more)")
    epochs: int = _opt(20, "passes over the training split (at most: early stopping usually ends sooner)")
    max_steps: int = _opt(0, "stop after this many steps (0: no limit)")
    drop_last: bool = _opt(True, "drop the last partial batch of an epoch")
    seed: int = _opt(0, "seed of initialization and batch order")
    dtype: str = _opt("float32", "float type of parameters and compute", choices=("float32", "float64"))
    compute_dtype: str = _opt("auto", "dtype of the top network's compute: auto (= --dtype) or bfloat16 (float32 "
                              "master weights and optimizer state; needs --dtype float32 and --xla off; on a Xeon with "
                              "AMX 1.1-1.6x the samples/s of float32, docs/benchmarks.md)", choices=("auto", "bfloat16"))
    table_dtype: str = _opt("auto", "how table rows (values and optimizer slots) are stored: auto (= --dtype) or "
                            "bfloat16 (half the bytes, updates rounded stochastically; needs --dtype float32, "
                            "refuses adam catchup=1; docs/training.md)", choices=("auto", "float32", "float64", "bfloat16"))
    table_layout: str = _opt("counters", "table rows with an admission count and last-seen step (counters) or "
                             "without (compact: 16.6 instead of 41.7 B of key, index and metadata per id, lookups "
                             "slower; needs --min-count 1, no eviction, full checkpoints; docs/training.md)",
                             choices=("counters", "compact"))
    threads: int = _opt(0, "TF intra-op and numba threads per rank (0: cores // ranks on this machine)")
    pin_cores: str = _opt("off", "on: bind each rank's threads to --threads cores of its own (refused where ranks x "
                          "threads exceed the machine's cores; a launcher's binding is kept); on a shared 16-core host, 8 "
                          "ranks x 2 threads with 512 rows a rank ran 1.13x and 0.98x as fast bound, in two runs "
                          "(docs/benchmarks.md)", choices=("off", "on"))
    xla: str = _opt("off", "compile the training step's TF calls with XLA (one fused program per call, not a kernel "
                    "launch per op: pays where a rank's rows are few; not with --compute-dtype bfloat16)", choices=("on", "off"))
    pipeline: str = _opt("auto", "read and look up the next batch on a background thread while this step computes "
                         "(same results either way); auto: on when a rank has 2 or more threads (--threads), off "
                         "when ranks get one core each, where the extra thread slows the step down",
                         choices=("auto", "on", "off"))

    linear_optimizer: str = _opt("auto", "sparse order-1 weights (name:key=value,...); auto: adagrad lr 0.1 for lr, "
                                 "ftrl alpha 0.5 for fm, 0.05 for wdl/deepfm and user models (chosen on the shipped "
                                 "sample's validation split: scripts/select_defaults.py); ftrl rows hold z and n only, "
                                 "w computed when read (ftrl:...,store_w=1 stores it, as a --sparse-schedule does)")
    embedding_optimizer: str = _opt("auto", "sparse embeddings (name:key=value,...: sgd, adagrad, adam, ftrl, "
                                    "rowwise_adagrad, rowwise_adam; docs/training.md); auto: adam lr 0.001 for fm, "
                                    "adam lr 0.001 with catchup=1 (TensorFlow's dense Adam semantics) for wdl/deepfm "
                                    "and user models (chosen on the sample's validation split: "
                                    "scripts/select_defaults.py)")
    dense_optimizer: str = _opt("adam:lr=0.001", "dense weights (first FC slices and top network)")

    strategy: str = _opt("des", f"training strategy: {', '.join(default_strategy_names())} or one registered by "
                         "--plugins (docs/design.md)")
    upper: str = _opt("data-parallel", "des: the layers above the substituted ones run on B/N rows per rank "
                      "(reduce-scatter + all-gather) or replicated on the whole batch on every rank (the paper)",
                      choices=("data-parallel", "replicated"))
    plan: str = _opt("auto", "des, per substituted operator: its partial sums travel (partials, the paper) or its "
                     "pooled inputs per distinct id (exchange); auto: the planner's cost model picks the plan with the "
                     "fewest bytes from the first batches, and on a run of 1000 steps or more the fastest of that "
                     "plan and the pure ones measured on the first batches (cached per host: docs/design.md, "
                     "Planner); measure: measure them on any run; or OP=MODE,...")
    plan_switch: str = _opt("", "des: STEP:PLAN[;STEP:PLAN...]: from global step STEP on, train with --plan PLAN "
                            "(a resume within the job: exact); what a run that switched its plan prints, to repeat it "
                            "bit for bit. Empty: a plan chosen by measuring is reviewed on the run's first steps and "
                            "switched where another measures faster (docs/design.md, Planner)")
    exchange_by: str = _opt("auto", "an exchanged operator's inputs travel as the values of each row block's "
                            "distinct ids, pooled by the row owner (ids), or pooled by the field owner, one value per "
                            "row and field (rows: TorchRec's pooled all-to-all; its bytes fall as 1/N and do not grow "
                            "with the ids a row holds); auto: the fewer bytes on the first batches",
                            choices=("auto", "ids", "rows"))
    ps_servers: int = _opt(1, "with --strategy ps: how many ranks serve the tables (the rest are workers)")
    staleness: int = _opt(1, "with --strategy persia: the bound tau of Persia's hybrid training; a step reads "
                          "embeddings that miss at most the sparse updates of the previous tau steps (always that many: "
                          "deterministic), the dense network synchronous; 0: = alltoall")
    group_size: int = _opt(1, "with --strategy hierarchical: ranks per group (Hierarchical Training); each group "
                           "trains its own replica of the upper network on its rows, the tables and field slices are "
                           "one copy; must divide the ranks (= ranks: des)")
    group_sync: str = _opt("easgd", "with --strategy hierarchical: how the groups' replicas are reconciled every "
                           "--sync-every steps: elastic averaging (EASGD, against a center variable) or model averaging",
                           choices=("easgd", "average"))
    sync_every: int = _opt(4, "with --strategy hierarchical: steps between reconciliations of the groups' replicas")
    easgd_alpha: float = _opt(0.0, "with --group-sync easgd: the moving rate alpha (0: auto, 0.9 / groups, the EASGD "
                              "paper's beta = 0.9)")
    placement: str = _opt("balanced", "field placement over ranks: whole fields by distinct ids, the largest rank's "
                          "table memory near the mean (balanced), round robin as the paper (mod), or some fields split "
                          "by key over every rank (split)",
                          choices=("mod", "balanced", "split"))
    split_fields: str = _opt("auto", "with --placement split, the fields split by key: auto (the fewest largest that "
                             "balance table memory), all, or NAME,...")
    shared_tables: str = _opt("auto", "fields that use another field's table (its keys, rows and optimizer state, "
                              "on the same rank): FIELD:OWNER,... by names or numbers; auto: as the data's schema "
                              "declares (table = \"<column>\"); none: every field its own")
    min_count: int = _opt(0, "admission: occurrences before an id gets a trained row (0: auto, 2 with --unadmitted "
                          "shared, else 1)")
    ttl: int = _opt(0, "eviction: drop rows unseen for this many steps, at checkpoints or every --evict-every steps "
                    "(0: never)")
    max_rows_per_field: int = _opt(0, "eviction: a table holding more rows drops the least recently seen (ties: the "
                                   "smaller key first) down to this many, after --ttl, at checkpoints or every "
                                   "--evict-every steps; not with fields split by key (0: no budget)")
    ttl_files: int = _opt(0, "with --stream: after each file, evict the rows not seen in the last N files (and apply "
                          "--max-rows-per-field; 0: off)")
    evict_every: int = _opt(0, "evict (--ttl, --max-rows-per-field) every N steps, on every rank between steps (0: at "
                            "checkpoints)")
    unadmitted: str = _opt("auto", "what unknown/unadmitted ids contribute: their initial value, zeros, or one "
                           "trained out-of-vocabulary row per field that all of them share (FuxiCTR's treatment "
                           "of ids seen fewer than --min-count times); auto: shared for lr, wdl, deepfm and user "
                           "models, init for fm (chosen on the shipped sample's validation split: "
                           "scripts/select_defaults.py)", choices=("auto", "init", "zero", "shared"))
    table_capacity: int = _opt(0, "initial hash-table slots per field; 0: sized from the data (each field's "
                                  "distinct keys fit without growing); tables grow as needed")

    sparse_schedule: str = _opt("constant", "learning-rate schedule of the sparse optimizers (embeddings and order-1 "
                                "weights): constant, warmup:steps=W, linear:warmup=W,end=E, cosine:warmup=W,end=E "
                                "or plateau:factor=F,patience=P,min=M (des/schedules.py)")
    dense_schedule: str = _opt("constant", "learning-rate schedule of the dense optimizer (same specs)")

    eval_every: int = _opt(0, "validate every N steps (0: at the end of each epoch)")
    early_stop: int = _opt(-1, "stop after this many validations in a row without improvement of --monitor and "
                           "restore the best checkpoint for the summary, the test split and des.evaluate (0: off; "
                           "-1: auto, 6 when training by --epochs (no --max-steps) on data with validation rows (chosen on "
                           "validation over the Criteo sample, Avazu and MovieLens: scripts/select_patience.py), off "
                           "for lr: all --epochs, the last checkpoint (chosen by 3-fold cross-validation on the "
                           "shipped sample's training rows: scripts/select_defaults.py --cv 3))")
    monitor: str = _opt("auc", "validation metric of --early-stop and plateau schedules", choices=("auc", "logloss"))
    eval_batch_size: int = _opt(8192, "batch size for validation and test")
    checkpoint_every: int = _opt(0, "checkpoint every N steps (0: only at the end)")
    full_checkpoint_every: int = _opt(0, "every Nth checkpoint is full, those in between incremental: the rows looked "
                                      "up and the keys evicted since the previous checkpoint, the dense weights "
                                      "(a chain: a full checkpoint and its increments; 0: every checkpoint full)")
    keep_checkpoints: int = _opt(5, "keep this run's newest N step checkpoints, delete older ones (0: keep all; "
                                 "checkpoints/best/ is kept apart; with --full-checkpoint-every: the newest N full "
                                 "ones and their increments)")
    export_every: int = _opt(0, "every N steps and at the end, write the model as a SavedModel version of "
                             "--export-dir, from the checkpoint of that step (0: off)")
    export_every_files: int = _opt(0, "with --stream: after every N files, and at the end, write a SavedModel version "
                                   "of --export-dir as --export-every does (0: off)")
    export_dir: str = _opt("", "with --export-every, where the versions go: DIR/<step>/ in TF Serving's layout")
    keep_exports: int = _opt(5, "keep the newest N versions in --export-dir, delete older ones (0: keep all)")
    export_dtype: str = _opt("float32", "table rows in the exported versions: as trained (float32) or int8 with a "
                             "scale and offset per row and block, dequantized inside the SavedModel",
                             choices=("float32", "int8"))
    output: str = _opt("", "run folder (default runs/<model>-<timestamp>)")
    resume: str = _opt("", "checkpoint directory to continue from (inside --output: continue that run)")
    overwrite: bool = _opt(False, "replace the run already in --output (atomically, once this run succeeds); "
                           "without it or --resume a non-empty run folder is refused")
    progress: bool = _opt(True, "progress bar on rank 0")

    def model_defaults(self) -> Any:
        """What ``auto`` means for ``--model``: its class's ``defaults`` (a
        :class:`des.models.ModelDefaults`; a user model's once ``--plugins`` are loaded). Imports
        the models, and so TensorFlow: only the run's set-up and the tools that build a model ask."""
        from des.models import get_model

        return get_model(self.model).defaults

    def _or_model_default(self, name: str, auto):
        """The option ``name`` as given, or the model's default where it is ``auto``."""
        value = getattr(self, name)
        return getattr(self.model_defaults(), name) if value == auto else value

    def linear_optimizer_spec(self) -> str:
        """``--linear-optimizer`` resolved: auto is the model's."""
        return self._or_model_default("linear_optimizer", "auto")

    def embedding_optimizer_spec(self) -> str:
        """``--embedding-optimizer`` resolved: auto is the model's."""
        return self._or_model_default("embedding_optimizer", "auto")

    def l2_embedding_value(self) -> float:
        """``--l2-embedding`` resolved: auto (-1) is the model's (0.01 for lr, 0 for the others)."""
        return self._or_model_default("l2_embedding", -1)

    def unadmitted_mode(self) -> str:
        """``--unadmitted`` resolved: auto is the model's (``init`` for fm, ``shared`` for the others)."""
        return self._or_model_default("unadmitted", "auto")

    def min_count_value(self) -> int:
        """``--min-count`` resolved: auto (0) is 2 when ids not admitted share a row, else 1."""
        if self.min_count:
            return self.min_count
        return 2 if self.unadmitted_mode() == "shared" else 1

    def needs_counters(self) -> bool:
        """Whether table rows keep an admission count and a last-seen step: unless ``--table-layout
        compact``, which :meth:`validate` allows only where nothing reads them."""
        return self.table_layout != "compact"

    def counters_needed_by(self) -> str:
        """The options that read rows' counts or last-seen steps (admission, eviction, incremental
        checkpoints), as flags; empty when none does."""
        min_count = self.min_count_value()
        flags = [(f"--min-count {min_count}", min_count > 1), ("--ttl", self.ttl),
                 ("--max-rows-per-field", self.max_rows_per_field), ("--ttl-files", self.ttl_files),
                 ("--full-checkpoint-every", self.full_checkpoint_every > 1)]
        return ", ".join(flag for flag, on in flags if on)

    def hidden_units(self) -> list[int]:
        try:
            units = [int(x) for x in self.hidden.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"--hidden must be comma-separated integers, got {self.hidden!r}") from None
        if not units or min(units) < 1:
            raise ConfigError(f"--hidden needs at least one positive width, got {self.hidden!r}")
        return units

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise ConfigError(
                    f"--{_flag(f.name)}: {getattr(self, f.name)!r} is not one of {', '.join(choices)}"
                )
        positive = ("batch_size", "embedding_dim", "eval_batch_size")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"--{_flag(name)} must be at least 1, got {getattr(self, name)}")
        for name in ("epochs", "max_steps", "ttl", "max_rows_per_field", "evict_every", "eval_every",
                     "checkpoint_every", "full_checkpoint_every", "keep_checkpoints", "threads", "min_count",
                     "table_capacity", "follow_interval", "follow_timeout", "progressive_every_rows", "export_every", "export_every_files",
                     "keep_exports", "ttl_files"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{_flag(name)} must not be negative, got {getattr(self, name)}")
        if bool(self.export_every or self.export_every_files) != bool(self.export_dir.strip()):
            raise ConfigError("--export-every K (or --export-every-files K) and --export-dir DIR go together "
                              "(versioned exports: both, or neither)")
        if self.table_dtype not in ("auto", self.dtype) and not (self.table_dtype == "bfloat16" and self.dtype == "float32"):
            raise ConfigError(f"--table-dtype {self.table_dtype} needs --dtype float32 (16-bit rows) or the same "
                              f"dtype, got --dtype {self.dtype}")
        if self.table_layout == "compact" and self.counters_needed_by():
            raise ConfigError(f"--table-layout compact keeps no admission count or last-seen step per row, which "
                              f"{self.counters_needed_by()} read: use --table-layout counters")
        if self.compute_dtype == "bfloat16" and self.dtype != "float32":
            raise ConfigError(f"--compute-dtype bfloat16 needs --dtype float32 (its master weights), got {self.dtype}")
        if self.compute_dtype == "bfloat16" and self.xla == "on":
            raise ConfigError("--compute-dtype bfloat16 with --xla on: XLA's CPU backend runs bfloat16 matmuls without "
                              "oneDNN, 1.6-2.6x slower than --xla off on a Xeon with AMX (docs/benchmarks.md); use --xla off")
        if self.l2_embedding < 0 and self.l2_embedding != -1:
            raise ConfigError(f"--l2-embedding must be -1 (auto) or at least 0, got {self.l2_embedding}")
        if self.early_stop < -1:
            raise ConfigError(f"--early-stop must be -1 (auto), 0 (off) or a patience >= 1, got {self.early_stop}")
        if self.evict_every and not (self.ttl or self.max_rows_per_field):
            raise ConfigError("--evict-every needs --ttl or --max-rows-per-field (what to evict)")
        switches = []
        if self.plan_switch:
            from des.plan_review import parse_switches

            switches = parse_switches(self.plan_switch)
            if self.plan in ("auto", "measure"):
                raise ConfigError(f"--plan-switch needs the plan it starts from (--plan partials, exchange or OP=MODE,...), "
                                  f"not --plan {self.plan}: a switched run is repeated from its printed flags")
        chosen = self.plan in ("auto", "measure")  # the planner may exchange: --exchange-by applies
        if (self.strategy == "des" and not chosen and self.exchange_by != "auto"
                and not any("exchange" in plan for plan in [self.plan, *(switch.plan for switch in switches)])):
            raise ConfigError(f"--exchange-by {self.exchange_by} has nothing to move with --plan {self.plan} (no "
                              "operator's inputs are exchanged): leave it out, or exchange an operator (--plan exchange "
                              "or OP=exchange,...)")
        if self.epochs == 0 and self.max_steps == 0 and not self.stream:
            raise ConfigError("nothing to train: --epochs and --max-steps are both 0")
        self.hidden_units()
        self.split_fractions()
        self.schedules()
        if not self.plugins and self.strategy not in default_strategy_names():
            raise ConfigError(f"unknown strategy {self.strategy!r} (choose one of: {', '.join(default_strategy_names())}, "
                              "or load one with --plugins)")

    def check_inputs(self, given: set[str]) -> "TrainConfig":
        """``--train-data`` replaces ``--data``/``--split`` (``given``: the options set by the TOML file
        or a flag); the effective config then records no --data or --split."""
        separate = [name for name in ("validation_data", "test_data") if getattr(self, name)]
        if not self.train_data:
            if separate:
                raise ConfigError(f"--{_flag(separate[0])} needs --train-data (with --data, --split makes the "
                                  "validation and test rows)")
            return self
        clash = [name for name in ("data", "split", "split_seed") if name in given]
        if clash:
            raise ConfigError(f"--train-data and --{_flag(clash[0])} do not go together (--data/--split split one "
                              "input; --train-data, --validation-data and --test-data name each split's own)")
        if not self.validation_data:  # known before any input is read
            self.check_validation_rows(0)
        return dataclasses.replace(self, data="", split="")

    def check_stream(self, given: set[str]) -> "TrainConfig":
        """``--stream`` is its own training data, one pass in file order, tested file by file: the
        options of a split, of epochs and of a validation split do not apply to it (one line)."""
        stream_only = ("stream_glob", "stream_shuffle", "follow", "follow_interval", "follow_timeout",
                       "progressive_every_rows", "ttl_files", "export_every_files")
        if not self.stream:
            used = [name for name in stream_only if name in given]
            if used:
                raise ConfigError(f"--{_flag(used[0])} needs --stream")
            return self
        clash = [name for name in ("data", "split", "split_seed", "train_data", "validation_data", "test_data",
                                   "eval_every") if name in given]
        if clash:
            raise ConfigError(f"--stream and --{_flag(clash[0])} do not go together (a stream is its own training "
                              "data, each file tested before it is trained on: progressive validation)")
        if "epochs" in given and self.epochs != 1:
            raise ConfigError(f"--epochs {self.epochs} does not apply to --stream: a stream is one pass over its "
                              "files in order (--max-steps stops it sooner)")
        if self.early_stop > 0:
            raise ConfigError(f"--early-stop {self.early_stop} does not apply to --stream: it has no validation "
                              "split (each file is tested before it is trained on)")
        for group, schedule in self.schedules().items():
            if schedule.kind in ("linear", "cosine") and not self.max_steps:
                raise ConfigError(f"--{group}-schedule {schedule.kind} needs the run's length: with --stream give "
                                  "--max-steps")
        if self.follow_interval <= 0:
            raise ConfigError(f"--follow-interval must be positive, got {self.follow_interval}")
        return dataclasses.replace(self, data="", split="", epochs=1, early_stop=0)

    def validation_users(self) -> list[str]:
        """The options set that need validation rows: ``--early-stop P`` and plateau schedules."""
        return ([f"--early-stop {self.early_stop}"] if self.early_stop > 0 else []) + \
            [f"--{group}-schedule plateau" for group, s in self.schedules().items() if s.on_plateau]

    def check_validation_rows(self, rows: int) -> None:
        users = self.validation_users()
        if users and rows == 0:
            remedy = "give --validation-data" if self.train_data else "give --split a validation fraction"
            raise ConfigError(f"{users[0]} needs validation rows, and the data has none ({remedy})")

    def early_stop_patience(self, validation_rows: int) -> int:
        """``--early-stop`` resolved: auto (-1) is the model's patience (2; 0 for lr) for a run by
        --epochs with validation rows, else 0."""
        if self.early_stop >= 0:
            return self.early_stop
        return self.model_defaults().early_stop if validation_rows and not self.max_steps else 0

    def schedules(self) -> dict[str, Any]:
        """``{"sparse": Schedule, "dense": Schedule}`` (a one-line :class:`ConfigError` if malformed)."""
        from des.schedules import parse_schedule

        return {"sparse": parse_schedule(self.sparse_schedule, "sparse-schedule"),
                "dense": parse_schedule(self.dense_schedule, "dense-schedule")}

    def split_fractions(self) -> tuple[float, float, float] | None:
        """``--split`` as three fractions (``None``: empty, the data's own split)."""
        from des.data.split import check_fractions
        from des.errors import DesError

        if not self.split:
            return None
        try:
            return check_fractions(self.split)
        except DesError as exc:
            raise ConfigError(f"--split: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _flag(name: str) -> str:
    return name.replace("_", "-")


def build_parser(prog: str = "des.train") -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=prog,
        description="Train a CTR model with Distributed Equivalent Substitution "
        "(run under `mpirun -n N` for N ranks; plain `python -m des.train` is one rank).",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", help="TOML file with any of the options below (flags win)")
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        kwargs: dict[str, Any] = {"help": f.metadata["help"], "default": argparse.SUPPRESS}
        if f.type in ("bool", bool):
            kwargs["action"] = argparse.BooleanOptionalAction
        elif f.metadata.get("nargs"):  # several values, kept joined by commas (as a TOML list is)
            kwargs.update(nargs=f.metadata["nargs"], metavar="PATH")
        else:
            kwargs["type"] = {"int": int, "float": float, "str": str}[str(f.type)]
            kwargs["metavar"] = f.name.upper() if not f.metadata.get("choices") else None
            if f.metadata.get("choices"):
                kwargs["choices"] = f.metadata["choices"]
        kwargs["help"] += f" (default: {getattr(defaults, f.name)!r})"
        parser.add_argument(f"--{_flag(f.name)}", **{k: v for k, v in kwargs.items() if v is not None})
    return parser


def load_config(argv: list[str] | None = None, prog: str = "des.train") -> TrainConfig:
    """Defaults, then the TOML file given by ``--config``, then the flags. Every error here is a
    :class:`UsageError`: each rank reads the same input, so rank 0 alone reports it."""
    try:
        args = vars(build_parser(prog).parse_args(argv))
        values: dict[str, Any] = {}
        config_file = args.pop("config", None)
        if config_file:
            values.update(_read_toml(Path(config_file)))
        values.update({k: ",".join(v) if isinstance(v, list) else v for k, v in args.items()})
        config = TrainConfig(**values)
        config.validate()
        config = config.check_inputs(set(values)).check_stream(set(values))
    except UsageError:
        raise
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return config


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    known = {f.name: f for f in dataclasses.fields(TrainConfig)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"config file {path}: unknown option {key!r}")
        if isinstance(value, list):  # hidden = [400, 400] or split = [0.9, 0.05, 0.05]
            value = ",".join(str(v) for v in value)
        expected = {"int": int, "float": (int, float), "str": str, "bool": bool}[str(known[name].type)]
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise ConfigError(f"config file {path}: {key} = {value!r} has the wrong type")
        values[name] = float(value) if str(known[name].type) == "float" else value
    return values

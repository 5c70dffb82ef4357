"""The asynchronous parameter-server baseline (the DES paper's "PS" rows, DiFacto-style).

Ranks ``0 .. S-1`` are servers, the others workers (``--ps-servers S``). Servers own whole fields
(the same ``mod`` placement as DES, over the servers only): the tables and their optimizer slots.
Server 0 also owns every dense weight (the field-sliced first layer and the top network) with its
optimizer state.

A worker takes every W-th global batch of the same shuffled order DES uses (worker ``w`` gets
batches ``w, w+W, ...``), and for each:

1. pulls the rows of the batch's unique ids from their servers (inserting new ids), and the dense
   weights from server 0;
2. runs each substitution whole (all fields) and the top network on the whole batch (mean loss);
3. pushes the per-id gradient sums to the servers and the dense gradients to server 0, and goes on
   without waiting.

Servers apply every push as it arrives with the same optimizers as DES (dense weights are therefore
updated asynchronously: each push is applied to whatever the weights are by then, Hogwild-style, not
averaged). So a worker computes on weights that other workers have updated since, or not yet: the
staleness is real, and server 0 reports it (dense pushes applied between a worker's pull and its
own push). Evaluation runs at the end on worker 0, after all workers finished, without inserting.

Phase timers (training only). A worker's (``ms_per_phase`` of the summary, the first worker's, per
step of that worker), each phase either communication or local work:

* ``lookup``           local: unique ids per field, pooling of the pulled rows
* ``pull``             communication: the row and dense-weight requests, waiting for the servers
                       (their lookups included) and receiving the answers, copying in the weights
* ``forward_backward`` local: the whole model's forward and backward (one tf.function)
* ``sparse_backward``  local: the per-id sums of the row gradients
* ``push``             communication: sending the row gradients and the dense gradients

A server's (``server_ms_per_phase``, server 0's, per worker step over the whole job, warm-up
included; idle time not counted): ``serve_rows`` (table lookups and gathers of a pull, and the
reply), ``apply_rows`` (receiving a push and the sparse optimizer), ``serve_dense`` and
``apply_dense`` (server 0: dense weights out, a dense push in and the dense optimizer).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from des.errors import ConfigError
from des.placement import place_fields
from des.strategies.base import ShardState, Strategy, StrategyContext, StrategyOptions, untimed
from des.strategies.components import DenseParams, FieldShard, RowLayout
from des.strategies.forms import ModelSplitForm

PULL_ROWS, ROWS, PUSH_ROWS, PUSH_ROW_GRADS, PULL_DENSE, DENSE, PUSH_DENSE, DONE, FLUSH, FLUSHED = range(11, 21)


class ParameterServer(Strategy):
    """One rank of the parameter-server job: a server (tables; dense weights on server 0) or a
    worker (computes with pulled weights)."""

    name = "ps"
    description = "asynchronous parameter server (--ps-servers ranks serve, the others train)"
    synchronous = False
    exact_over_ranks = False  # with one server and one worker (the default on 2 ranks) it is des
    checkpoints = False
    phases = {"lookup": "lookup", "pull": "communication", "forward_backward": "top",
              "sparse_backward": "backward", "push": "communication"}
    #: what a server times (``server_ms_per_phase``)
    server_phases = ("serve_rows", "apply_rows", "serve_dense", "apply_dense")
    traffic_sites = ("ps_keys", "ps_rows", "ps_gradients", "ps_dense")

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        """``--ps-servers``: how many ranks serve the tables."""

        ps_servers: int = 1

    @classmethod
    def place(cls, num_fields: int, ranks: int, distinct: Sequence[int], config: Any,
              work: Sequence[float] | None = None) -> list[list[int]]:
        """Servers own fields (``mod`` over the servers), workers none."""
        if config.placement == "split":
            raise ConfigError("--placement split: the parameter server places whole fields on its servers (split "
                              "fields by key with --strategy des or alltoall)")
        servers = cls.Options.of(config).ps_servers
        if not 1 <= servers < ranks:
            raise ConfigError(f"--strategy ps needs 1 <= --ps-servers < ranks, got {servers} servers of {ranks} ranks")
        return place_fields(num_fields, servers) + [[] for _ in range(ranks - servers)]

    def __init__(self, context: StrategyContext) -> None:
        super().__init__(context)
        self.servers = sum(1 for fields in self.placement if fields)
        self.workers = self.comm.size - self.servers
        self.is_server = self.comm.rank < self.servers
        self.worker_index = self.comm.rank - self.servers
        if self.is_server:
            self.timer = type(self.timer)(self.server_phases)
        self.shard = FieldShard(self.placement[self.comm.rank], self.model.blocks(), context.optimizers,
                                seed=self.seed, dtype=self.dtype, tables=context.tables)
        self.all_fields = list(range(self.model.num_fields))
        # Server 0 owns the dense weights; a worker keeps the copy it last pulled.
        self.dense = DenseParams(self.model, self.all_fields, context.optimizers, seed=self.seed, dtype=self.dtype)
        self.layout = RowLayout(self.model.blocks(), self.model.num_fields, self.dtype)
        # the whole model on the worker's rows: the split form with every operator "exchanged"
        # (whole, on the pulled rows, field weights as inputs; no partials)
        self.form = ModelSplitForm(self.model, self.dense, self.dtype, context.compute_dtype,
                                   exchanged=range(len(self.model.substitutions())))
        self._read = [[b.name for b in self.model.blocks()].index(name) for name in self.form.exchange_blocks]
        # collective over all ranks, so made here: the workers' own communicator
        self.worker_comm = self.comm.split(0 if self.is_server else 1)
        self.pushes_applied = 0
        self.staleness: list[int] = []
        self._pull_version = 0

    @property
    def fields(self) -> list[int]:
        return self.shard.fields

    @property
    def role(self) -> str:
        return "serve" if self.is_server else "train"

    @property
    def evaluators(self) -> list[int]:
        return [self.servers]  # the first worker, once every worker is done

    @property
    def counts_samples(self) -> bool:
        return not self.is_server

    def reader_options(self) -> dict[str, Any]:
        return {"fields": self.all_fields, "shard": (0, 1)}

    def steps(self, start: int, stop: int) -> range:
        """Worker ``w`` takes batches ``w, w+W, ...`` of the shuffled order DES uses."""
        return range(start + self.worker_index, stop, self.workers)

    # ------------------------------------------------------------------------------ server side
    def _split_by_field(self, header: np.ndarray, keys: np.ndarray):
        start = 0
        for field, n in zip(self.fields, header):
            yield field, keys[start : start + int(n)], start
            start += int(n)

    def serve(self) -> None:
        """Answer pulls and apply pushes until every worker said it is done."""
        comm, done, pulls = self.comm, 0, 0
        while done < self.workers:
            pending = comm.poll()
            if pending is None:
                time.sleep(comm.poll_sleep_seconds)
                continue
            source, tag = pending
            if tag == PULL_ROWS:
                start_time = time.perf_counter()
                message = comm.recv(source, PULL_ROWS, np.int64, "ps_keys")
                insert, header, keys = bool(message[0]), message[1 : 1 + len(self.fields)], message[1 + len(self.fields):]
                values = np.empty((keys.size, self.layout.width), dtype=self.dtype)
                for field, field_keys, start in self._split_by_field(header, keys):
                    _, values[start : start + field_keys.size] = self.shard.rows(field, field_keys, insert=insert,
                                                                                 step=pulls)
                pulls += 1
                comm.send(values, source, ROWS, "ps_rows" if insert else "eval_ps_rows")
                if insert:  # training pulls only (evaluation pulls do not insert)
                    self.timer.seconds["serve_rows"] += time.perf_counter() - start_time
            elif tag == PUSH_ROWS:
                with self.timer("apply_rows"):
                    message = comm.recv(source, PUSH_ROWS, np.int64, "ps_gradients")
                    grads = comm.recv(source, PUSH_ROW_GRADS, self.dtype, "ps_gradients").reshape(-1, self.layout.width)
                    header, keys = message[: len(self.fields)], message[len(self.fields):]
                    for field, field_keys, start in self._split_by_field(header, keys):
                        rows = self.shard.tables[field].lookup(field_keys, insert=False)
                        self.shard.apply_row_gradients(field, rows, grads[start : start + field_keys.size], pulls)
            elif tag == PULL_DENSE:
                start_time = time.perf_counter()
                training = bool(comm.recv(source, PULL_DENSE, np.int64, "ps_dense")[0])
                comm.send(np.concatenate([[float(self.pushes_applied)], self.dense.flat()]).astype(self.dtype),
                          source, DENSE, "ps_dense" if training else "eval_ps_dense")
                if training:
                    self.timer.seconds["serve_dense"] += time.perf_counter() - start_time
            elif tag == PUSH_DENSE:
                with self.timer("apply_dense"):
                    message = comm.recv(source, PUSH_DENSE, self.dtype, "ps_dense")
                    self.staleness.append(self.pushes_applied - int(message[0]))
                    self.dense.apply_flat(message[1:])  # l2_dense is added here, once
                    self.pushes_applied += 1
                    self.step_count = self.pushes_applied  # server 0: batches trained by all workers
                self.timer.steps += 1  # server 0: one dense push per worker step
            elif tag == FLUSH:  # every earlier message of this worker has been handled (MPI keeps order)
                comm.recv(source, FLUSH, np.int64, "ps_control")
                comm.send(np.zeros(1, np.int64), source, FLUSHED, "ps_control")
            elif tag == DONE:
                comm.recv(source, DONE, np.int64, "ps_control")
                done += 1
            else:
                raise RuntimeError(f"parameter server got an unknown message tag {tag} from rank {source}")

    # ------------------------------------------------------------------------------ worker side
    def _pull(self, batch: Any, *, insert: bool) -> tuple[list[np.ndarray], dict]:
        comm = self.comm
        prefix = "" if insert else "eval_"  # evaluation traffic is not counted as training traffic
        phase = self.timer if insert else untimed
        with phase("lookup"):
            unique = {f: np.unique(batch.fields[f].keys, return_inverse=True) for f in self.all_fields}
        with phase("pull"):
            for server in range(self.servers):
                fields = self.placement[server]
                header = [unique[f][0].size for f in fields]
                message = np.concatenate([[int(insert)], header, *[unique[f][0] for f in fields]]).astype(np.int64)
                comm.send(message, server, PULL_ROWS, prefix + "ps_keys")
            comm.send(np.array([int(insert)], np.int64), 0, PULL_DENSE, prefix + "ps_dense")
        with phase("lookup"):
            pooled = self.layout.empty_pooled(batch.size)
        for server in range(self.servers):
            with phase("pull"):
                values = comm.recv(server, ROWS, self.dtype, prefix + "ps_rows").reshape(-1, self.layout.width)
            with phase("lookup"):
                offset = 0
                for field in self.placement[server]:
                    keys, inverse = unique[field]
                    self.layout.pool(batch.fields[field], field, values[offset : offset + keys.size], inverse, pooled)
                    offset += keys.size
        with phase("pull"):
            dense = comm.recv(0, DENSE, self.dtype, prefix + "ps_dense")
            self._pull_version = int(dense[0])
            self.dense.set_flat(dense[1:])
        return pooled, unique

    def _push(self, batch: Any, pooled_grads: list[np.ndarray], unique: dict, dense_grads: list[np.ndarray]) -> None:
        comm, timer = self.comm, self.timer
        for server in range(self.servers):
            with timer("sparse_backward"):
                fields = self.placement[server]
                keys_parts = [unique[f][0] for f in fields]
                grad_parts = [self.layout.sum_gradients(batch.fields[f], f, unique[f][1], unique[f][0].size,
                                                        pooled_grads) for f in fields]
                message = np.concatenate([[k.size for k in keys_parts], *keys_parts]).astype(np.int64)
                grads = np.concatenate(grad_parts) if grad_parts else np.zeros((0, self.layout.width), self.dtype)
            with timer("push"):
                comm.send(message, server, PUSH_ROWS, "ps_gradients")
                comm.send(grads, server, PUSH_ROW_GRADS, "ps_gradients")
        with timer("push"):
            flat = np.concatenate([[float(self._pull_version)], *[g.reshape(-1) for g in dense_grads]]).astype(
                self.dtype)
            comm.send(flat, 0, PUSH_DENSE, "ps_dense")

    def train_step(self, batch: Any) -> float:
        pooled, unique = self._pull(batch, insert=True)  # times lookup and pull
        with self.timer("forward_backward"):
            loss, _, read_grads, field_grads, _, top_grads = self.form.top_train(
                self._no_partials(batch), [pooled[k] for k in self._read], list(self.dense.field_params.values()), [],
                np.asarray(batch.labels, dtype=self.dtype), list(self.dense.top_params.values()), batch.size,
                self.form.dense_rows(batch))
            loss, field_grads, top_grads = float(loss), [g.numpy() for g in field_grads], [g.numpy() for g in top_grads]
            by_block = {k: g.numpy() for k, g in zip(self._read, read_grads)}
            # a block no operator reads gets a zero gradient
            pooled_grads = [by_block[k] if k in by_block else np.zeros_like(p) for k, p in enumerate(pooled)]
        self._push(batch, pooled_grads, unique, [*field_grads, *top_grads])  # times sparse_backward and push
        self.step_count += 1
        self.timer.steps += 1
        return loss

    def predict(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        pooled, _ = self._pull(batch, insert=False)
        probabilities = self.form.top_predict(self._no_partials(batch), [pooled[k] for k in self._read],
                                              list(self.dense.field_params.values()), [],
                                              list(self.dense.top_params.values()), self.form.dense_rows(batch))
        return probabilities.numpy(), np.asarray(batch.labels)

    def _no_partials(self, batch: Any) -> np.ndarray:
        return np.zeros((batch.size, 0), dtype=self.dtype)  # every operator runs whole: an empty buffer

    def end_training(self) -> None:
        """Return once every server has applied all of this worker's pushes, and every worker is
        there (nobody evaluates before all pushes are in)."""
        for server in range(self.servers):
            self.comm.send(np.zeros(1, np.int64), server, FLUSH, "ps_control")
        for server in range(self.servers):
            self.comm.recv(server, FLUSHED, np.int64, "ps_control")
        self.worker_comm.barrier("ps_control")

    def close(self) -> None:
        """Tell every server this worker is done."""
        for server in range(self.servers):
            self.comm.send(np.zeros(1, np.int64), server, DONE, "ps_control")
        super().close()

    def state(self) -> ShardState:
        """With one server and one worker, the server's tables and dense weights are the whole model
        once the worker has flushed, and both count the same steps: what ``des.check`` compares.
        (With more servers, server s > 0 keeps no dense weights.)"""
        if self.servers != 1 or self.workers != 1:
            raise ConfigError("the parameter server's state can only be saved with one server and one worker")
        return ShardState(self.model, self.dtype, self.seed, self.placement, self.step_count, self.shard.tables,
                          self.dense)

    def describe(self) -> str:
        return (f"{self.servers} server(s), {self.workers} asynchronous worker(s): ranks 0..{self.servers - 1} serve "
                f"the tables, worker w trains batches w, w+{self.workers}, ... without waiting")

    def summary(self) -> dict[str, Any]:
        """Staleness and the servers' busy time (collective)."""
        staleness = self.comm.bcast_json(
            {"mean": float(np.mean(self.staleness)) if self.staleness else 0.0,
             "max": int(np.max(self.staleness)) if self.staleness else 0}, "summary", root=0)
        server_phases = self.comm.bcast_json(self.timer.ms_per_step(), "summary", root=0)
        return {"ps_servers": self.servers, "staleness_mean": staleness["mean"], "staleness_max": staleness["max"],
                "server_ms_per_phase": server_phases}

    def memory(self) -> dict[str, int]:
        return {**self.shard.memory(), "dense_bytes": self.dense.nbytes}

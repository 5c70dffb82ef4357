"""The asynchronous parameter-server baseline (the DES paper's "PS" rows, DiFacto-style).

Ranks ``0 .. S-1`` are servers, the others workers (``--ps-servers S``). Servers own whole fields
(the same ``mod`` placement as DES, over the servers only): the tables and their optimizer slots.
Server 0 also owns every dense weight (the field-sliced first layer and the top network) with its
optimizer state.

A worker takes every W-th global batch of the same shuffled order DES uses (worker ``w`` gets
batches ``w, w+W, ...``), and for each:

1. pulls the rows of the batch's unique ids from their servers (inserting new ids), and the dense
   weights from server 0;
2. runs each substitution's ``reference`` and the top network on the whole batch (mean loss);
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
from typing import Any

import numpy as np

from des.collectives import Communicator
from des.errors import ConfigError
from des.models.base import Model
from des.options import Optimizers, TableOptions
from des.placement import place_fields
from des.strategies.alltoall import AllToAllEngine, _untimed

PULL_ROWS, ROWS, PUSH_ROWS, PUSH_ROW_GRADS, PULL_DENSE, DENSE, PUSH_DENSE, DONE, FLUSH, FLUSHED = range(11, 21)


def ps_placement(num_fields: int, ranks: int, servers: int) -> list[list[int]]:
    """Fields of every rank: servers own fields (``mod`` over the servers), workers none."""
    if not 1 <= servers < ranks:
        raise ConfigError(f"--strategy ps needs 1 <= --ps-servers < ranks, got {servers} servers of {ranks} ranks")
    return place_fields(num_fields, servers) + [[] for _ in range(ranks - servers)]


class PSEngine(AllToAllEngine):
    """One rank of the parameter-server job: a server (tables, dense weights on server 0) or a
    worker (computes with pulled weights). Reuses the all-to-all engine's reference model."""

    def __init__(self, *args: Any, servers: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.servers = servers
        self.workers = self.comm.size - servers
        self.is_server = self.comm.rank < servers
        self.worker_index = self.comm.rank - servers
        self.dense_names = list(self.field_params) + list(self.top_params)
        self.pushes_applied = 0
        self.staleness: list[int] = []
        self._pull_version = 0

    # ------------------------------------------------------------------------------ server side
    def _flat_dense(self) -> np.ndarray:
        return np.concatenate([v.reshape(-1) for v in (*self.field_params.values(), *self.top_params.values())])

    def _set_dense(self, flat: np.ndarray) -> None:
        offset = 0
        for value in (*self.field_params.values(), *self.top_params.values()):
            value[...] = flat[offset : offset + value.size].reshape(value.shape)
            offset += value.size

    def _apply_flat_dense(self, flat: np.ndarray) -> None:
        shapes = [v.shape for v in (*self.field_params.values(), *self.top_params.values())]
        offsets = np.cumsum([0] + [int(np.prod(shape)) for shape in shapes])
        self._apply_dense([flat[a:b].reshape(shape) for a, b, shape in zip(offsets[:-1], offsets[1:], shapes)])
        self.pushes_applied += 1

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
                values = np.empty((keys.size, self._row_width), dtype=self.dtype)
                for field, field_keys, start in self._split_by_field(header, keys):
                    table = self.tables[field]
                    rows = table.lookup(field_keys, insert=insert, step=pulls)
                    column = 0
                    for block in self.blocks:
                        values[start : start + field_keys.size, column : column + block.dim] = table.gather(
                            block.name, field_keys, rows)
                        column += block.dim
                pulls += 1
                comm.send(values, source, ROWS, "ps_rows" if insert else "eval_ps_rows")
                if insert:  # training pulls only (evaluation pulls do not insert)
                    self.timer.seconds["serve_rows"] += time.perf_counter() - start_time
            elif tag == PUSH_ROWS:
                with self.timer("apply_rows"):
                    message = comm.recv(source, PUSH_ROWS, np.int64, "ps_gradients")
                    grads = comm.recv(source, PUSH_ROW_GRADS, self.dtype, "ps_gradients").reshape(-1, self._row_width)
                    header, keys = message[: len(self.fields)], message[len(self.fields):]
                    for field, field_keys, start in self._split_by_field(header, keys):
                        table = self.tables[field]
                        rows = table.lookup(field_keys, insert=False)
                        column = 0
                        for block in self.blocks:
                            table.apply_gradients(block.name, rows, np.ascontiguousarray(
                                grads[start : start + field_keys.size, column : column + block.dim]), pulls)
                            column += block.dim
            elif tag == PULL_DENSE:
                start_time = time.perf_counter()
                training = bool(comm.recv(source, PULL_DENSE, np.int64, "ps_dense")[0])
                comm.send(np.concatenate([[float(self.pushes_applied)], self._flat_dense()]).astype(self.dtype),
                          source, DENSE, "ps_dense" if training else "eval_ps_dense")
                if training:
                    self.timer.seconds["serve_dense"] += time.perf_counter() - start_time
            elif tag == PUSH_DENSE:
                with self.timer("apply_dense"):
                    message = comm.recv(source, PUSH_DENSE, self.dtype, "ps_dense")
                    self.staleness.append(self.pushes_applied - int(message[0]))
                    self._apply_flat_dense(message[1:])
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
    def _server_fields(self, server: int) -> list[int]:
        return self.placement[server]

    def _pull(self, batch: Any, *, insert: bool) -> tuple[list[np.ndarray], dict]:
        comm = self.comm
        prefix = "" if insert else "eval_"  # evaluation traffic is not counted as training traffic
        phase = self.timer if insert else _untimed
        with phase("lookup"):
            unique = {f: np.unique(batch.fields[f].keys, return_inverse=True) for f in self.all_fields}
        with phase("pull"):
            for server in range(self.servers):
                fields = self._server_fields(server)
                header = [unique[f][0].size for f in fields]
                message = np.concatenate([[int(insert)], header, *[unique[f][0] for f in fields]]).astype(np.int64)
                comm.send(message, server, PULL_ROWS, prefix + "ps_keys")
            comm.send(np.array([int(insert)], np.int64), 0, PULL_DENSE, prefix + "ps_dense")
        with phase("lookup"):
            pooled = self._empty_pooled(batch.size)
        for server in range(self.servers):
            with phase("pull"):
                values = comm.recv(server, ROWS, self.dtype, prefix + "ps_rows").reshape(-1, self._row_width)
            with phase("lookup"):
                offset = 0
                for field in self._server_fields(server):
                    keys, inverse = unique[field]
                    self._pool_field(batch, field, values[offset : offset + keys.size], inverse, pooled)
                    offset += keys.size
        with phase("pull"):
            dense = comm.recv(0, DENSE, self.dtype, prefix + "ps_dense")
            self._pull_version = int(dense[0])
            self._set_dense(dense[1:])
        return pooled, unique

    def _push(self, batch: Any, pooled_grads: list[np.ndarray], unique: dict, dense_grads: list[np.ndarray]) -> None:
        comm, timer = self.comm, self.timer
        for server in range(self.servers):
            with timer("sparse_backward"):
                fields = self._server_fields(server)
                keys_parts = [unique[f][0] for f in fields]
                grad_parts = [self._sum_row_gradients(batch, f, unique[f][1], unique[f][0].size, pooled_grads)
                              for f in fields]
                header = [k.size for k in keys_parts]
                message = np.concatenate([header, *keys_parts]).astype(np.int64)
                grads = np.concatenate(grad_parts) if grad_parts else np.zeros((0, self._row_width), self.dtype)
            with timer("push"):
                comm.send(message, server, PUSH_ROWS, "ps_gradients")
                comm.send(grads, server, PUSH_ROW_GRADS, "ps_gradients")
        with timer("push"):
            flat = np.concatenate([[float(self._pull_version)], *[g.reshape(-1) for g in dense_grads]]).astype(
                self.dtype)
            comm.send(flat, 0, PUSH_DENSE, "ps_dense")

    def train_step(self, batch: Any) -> float:
        timer = self.timer
        pooled, unique = self._pull(batch, insert=True)  # times lookup and pull
        with timer("forward_backward"):
            loss, pooled_grads, dense = self._reference_step(pooled, batch, batch.size)
        # times sparse_backward and push; server 0 applies the dense push with _apply_dense, which adds
        # l2_dense there
        self._push(batch, pooled_grads, unique, dense)
        self.step_count += 1
        timer.steps += 1
        return loss

    def predict(self, batch: Any) -> np.ndarray:
        pooled, _ = self._pull(batch, insert=False)
        return self._reference_predict(pooled, list(self.field_params.values()),
                                       list(self.top_params.values())).numpy()

    def predict_with_labels(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        return self.predict(batch), np.asarray(batch.labels)

    def reader_options(self) -> dict[str, Any]:
        return {"fields": self.all_fields, "shard": (0, 1)}

    def flush(self) -> None:
        """Return once every server has applied all of this worker's pushes."""
        for server in range(self.servers):
            self.comm.send(np.zeros(1, np.int64), server, FLUSH, "ps_control")
        for server in range(self.servers):
            self.comm.recv(server, FLUSHED, np.int64, "ps_control")

    def finish(self) -> None:
        """Tell every server this worker is done."""
        for server in range(self.servers):
            self.comm.send(np.zeros(1, np.int64), server, DONE, "ps_control")


def run_parameter_server(config: Any, comm: Communicator, store: Any, model: Model, optimizers: Optimizers,
                         steps_per_epoch: int, total_steps: int, log: Any) -> dict[str, Any]:
    """Train with the asynchronous parameter server; returns the summary fields of this strategy."""
    from des.data.batch_reader import BatchReader
    from des.train import evaluate

    placement = ps_placement(model.num_fields, comm.size, config.ps_servers)
    engine = PSEngine(model, comm, placement, optimizers, servers=config.ps_servers, seed=config.seed,
                      dtype=np.dtype(config.dtype),
                      tables=TableOptions(config.table_capacity, config.min_count, config.unadmitted))
    workers = Communicator(comm.comm.Split(0 if engine.is_server else 1, comm.rank))
    log.say(f"  parameter server: ranks 0..{engine.servers - 1} serve, {engine.workers} worker(s) train "
            f"batches w, w+{engine.workers}, ... asynchronously")
    samples, all_samples, train_seconds, losses = 0, 0, 0.0, []
    results: dict[str, Any] = {}
    if engine.is_server:
        engine.serve()
    else:
        readers: dict[int, Any] = {}
        start = time.perf_counter()
        for step in range(engine.worker_index, total_steps, engine.workers):
            epoch, index = divmod(step, steps_per_epoch)
            if epoch not in readers:
                readers = {epoch: BatchReader(store, "train", batch_size=config.batch_size, seed=config.seed,
                                              epoch=epoch, drop_last=config.drop_last, **engine.reader_options())}
            batch = readers[epoch].batch(index)
            losses.append(engine.train_step(batch))
            all_samples += batch.size
            if len(losses) == 1:  # leave compilation and tracing out of the throughput, as des.train does
                engine.timer.reset()
                start = time.perf_counter()
            else:
                samples += batch.size
        engine.flush()
        train_seconds = time.perf_counter() - start
        workers.barrier("ps_control")  # every worker's pushes are applied before anyone evaluates
        if engine.worker_index == 0:
            validation = evaluate(engine, store, "validation", config.eval_batch_size)
            test = evaluate(engine, store, "test", config.eval_batch_size)
            results = {"validation": validation, "test": test}
        engine.finish()
    first_worker = engine.servers
    results = comm.bcast_json(results, "summary", root=first_worker)
    counts = comm.allgather(np.array([samples, engine.step_count, train_seconds,
                                      all_samples], dtype=np.float64), "summary")
    staleness = comm.bcast_json(
        {"mean": float(np.mean(engine.staleness)) if engine.staleness else 0.0,
         "max": int(np.max(engine.staleness)) if engine.staleness else 0}, "summary", root=0)
    timed_samples, total_steps_run, total_samples = int(counts[:, 0].sum()), int(counts[:, 1].sum()), int(counts[:, 3].sum())
    wall = float(counts[:, 2].max())
    phases = comm.bcast_json(engine.timer.ms_per_step(), "summary", root=first_worker)
    server_phases = comm.bcast_json(engine.timer.ms_per_step(), "summary", root=0)
    sent = comm.allgather(np.array([sum(st["bytes_sent"] for site, st in comm.stats_dict().items()
                                        if site.startswith(("ps_keys", "ps_rows", "ps_gradients", "ps_dense")))],
                                   dtype=np.float64), "summary")[:, 0]
    return {
        "steps": total_steps_run,
        "train_samples": total_samples,
        "samples_per_second": timed_samples / max(wall, 1e-9),
        "validation": results.get("validation"),
        "test": results.get("test"),
        # Per rank and per batch of B samples, like the synchronous strategies' figure.
        "bytes_per_step": float(sent.sum()) / max(total_steps_run, 1) / comm.size,
        "bytes_sent_per_rank": sent.tolist(),
        "staleness_mean": staleness["mean"],
        "staleness_max": staleness["max"],
        "ms_per_phase": phases,
        "server_ms_per_phase": server_phases,
    }

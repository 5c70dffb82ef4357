"""A model in TF, as the strategies run it. No state (the weights are a
:class:`~des.strategies.components.DenseParams`), no communication.

* :class:`ModelSplitForm` -- each substitution's ``local`` on a rank's fields, packed into one
  buffer; ``combine`` + the top network + the loss on the reduced buffer; the local backward. A
  substitution may instead be *exchanged*: it runs whole (``combine`` of ``local`` on every field,
  what ``reference`` computes) on the pooled inputs of every field, next to the top network (the
  planner's exchange; ps and alltoall: every substitution).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from des.errors import ConfigError
from des.strategies.components import DenseParams
from des.substitutions.base import closed_form_applies
from des.zero_copy import to_tensor

def compiled(fn: Any, jit: bool = False) -> "_Compiled":
    """How the forms' steps become TF graphs: no retrace per batch size, and no autograph (the model,
    substitution and form code is plain TF ops with Python control flow on Python values only; a
    branch on a tensor's value needs ``tf.cond``/``tf.where``): autograph's rewriting of every
    called function was two thirds of a model's trace time, seconds at every start-up. ``jit``:
    compiled by XLA (``--xla``): one fused program instead of an op per kernel launch, which pays
    where a rank's row block is small and the step is many small ops."""
    return _Compiled(tf.function(fn, reduce_retracing=True, autograph=False, jit_compile=True if jit else None))


class _Compiled:
    """A ``tf.function`` called through the concrete function of its arguments' signature (shapes,
    dtypes, Python values), looked up here: ``tf.function``'s own dispatch (binding, trace-type
    canonicalization of every nested argument) costs a noticeable share of a small step. The
    concrete function is then called on its flat tensor inputs (``_call_flat``), where they are
    exactly ``args``' array and tensor leaves (checked once per signature): its structured call binds
    every argument again, about 0.35 ms a call with a dozen inputs (2-core VM). Aligned numpy
    arguments go in without a copy (``des/zero_copy.py``)."""

    def __init__(self, function: Any) -> None:
        self.function = function
        self._concrete: dict[tuple, Any] = {}

    def __call__(self, *args: Any) -> Any:
        key = _signature(args)
        entry = self._concrete.get(key)
        if entry is None:
            concrete = self.function.get_concrete_function(*args)
            entry = self._concrete[key] = (concrete, _flat_call(concrete, args))
        concrete, flat = entry
        if flat is not None:
            return flat(_flat_tensors(args, []), concrete.captured_inputs)
        return concrete(*_tensors(args))


def _flat_tensors(value: Any, out: list) -> list:
    """The array and tensor leaves of ``value`` (nested lists and tuples) in order, as tensors."""
    if isinstance(value, (list, tuple)):
        for v in value:
            _flat_tensors(v, out)
    elif isinstance(value, (np.ndarray, tf.Tensor)):
        tensor = to_tensor(value)
        out.append(tensor if isinstance(tensor, tf.Tensor) else tf.convert_to_tensor(tensor))
    return out


def _flat_call(concrete: Any, args: Any) -> Any:
    """The concrete function's call on its flat tensor inputs, where ``args``' leaves are exactly
    its inputs (shapes and dtypes, in order); None to call it the structured way."""
    call = getattr(concrete, "_call_flat", None)
    leaves = _flat_tensors(args, [])
    inputs = concrete.inputs[: len(concrete.inputs) - len(concrete.captured_inputs)]
    if call is None or len(leaves) != len(inputs) or any(
            t.dtype != i.dtype or not i.shape.is_compatible_with(t.shape) for t, i in zip(leaves, inputs)):
        return None
    return call


def _tensors(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_tensors(v) for v in value)
    return to_tensor(value)


def _signature(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    if isinstance(value, (np.ndarray, tf.Tensor)):
        return (tuple(value.shape), value.dtype.name)
    return (type(value).__name__, value)  # a Python value is part of the trace


class ModelSplitForm:
    """The split form (DES): local partials into one buffer ``[B, P]``, the combine + top network
    on the reduced buffer, and the local backward.

    With a plan (``exchanged``: indices of the substitutions the planner exchanges) the
    exchanged operators are not split: their pooled inputs come to the row owner, which runs them
    whole (``combine(local)`` on every field) next to the ``combine`` of the partials operators.
    The buffer then holds the partials operators' columns only, and the exchanged blocks' pooled
    values and field weights are further inputs of the top step (whose gradients it returns).
    """

    def __init__(self, model: Any, dense: DenseParams, dtype: np.dtype, compute_dtype: str | None = None,
                 exchanged: Sequence[int] = (), shares: Sequence[int] = (), jit: bool = False) -> None:
        self.model = model
        self.jit = bool(jit)  # the training steps compiled by XLA (``compiled``)
        self.dense = dense
        self.tf_dtype = tf.as_dtype(dtype)
        # --compute-dtype bfloat16: the top network runs in bf16 on casts of the fp32 master weights
        # (their gradients come back in fp32 through the casts; the optimizers never see bf16)
        self.compute_dtype = tf.as_dtype(compute_dtype) if compute_dtype else self.tf_dtype
        self.blocks = [b.name for b in model.blocks()]
        self.substitutions = model.substitutions()
        for sub in self.substitutions:
            if sub.block not in self.blocks:
                raise ValueError(f"substitution {sub.name} reads block {sub.block!r}, not declared by {model.name}")
            if sub.collective != "allreduce":
                raise ConfigError(f"substitution {sub.name} asks for collective {sub.collective!r}; "
                                  "only 'allreduce' is supported")
        self.exchanged = frozenset(int(i) for i in exchanged)
        #: the operators that read the dense features (their part is added where the rows are)
        self.reads_dense = frozenset(i for i, sub in enumerate(self.substitutions) if sub.reads_dense)
        self.split = [i for i in range(len(self.substitutions)) if i not in self.exchanged]
        # Buffer layout: the split substitutions' partials side by side, in their order
        self.width = sum(self.substitutions[i].width for i in self.split)
        read_by = lambda subs: [b for b in self.blocks if any(self.substitutions[i].block == b for i in subs)]  # noqa: E731
        #: blocks the owners pool (a split operator reads them) / the row owners receive (an exchanged one does)
        self.split_blocks = read_by(self.split) if self.exchanged else list(self.blocks)
        self.exchange_blocks = read_by(sorted(self.exchanged))
        # l2 on looked-up embeddings is added once, by whoever holds a block's pooled values of all
        # rows: its owner when a split operator reads it, else the row owner
        self.row_owner_l2_blocks = [b for b in self.exchange_blocks if b not in self.split_blocks]
        dims = {b.name: b.dim for b in model.blocks()}
        #: the exchanged blocks' dims, side by side in a row owner's packed inputs (:meth:`exchanged_blocks`)
        self.exchange_dims = [dims[b] for b in self.exchange_blocks]
        names = list(dense.field_params)
        self.exchange_params = [n for n in names if int(n.split(":", 1)[0]) in self.exchanged]
        self.split_params = [n for n in names if n not in self.exchange_params]
        # Fields split by key: every rank's pooled values of its share of them (zeros where it holds
        # none) follow the partials in the buffer, so the sum over the ranks brings each field's
        # pooled values whole to where the rows are, and every operator's part of those fields runs
        # there, with their weight slices (held by every rank after its own fields'). The pooled
        # values are k floats a field where an operator's partials are its width (the first FC
        # layer's H): the cheaper of the two to sum.
        self.split_fields = list(dense.split_fields)
        self.shares = [int(f) for f in shares]
        self.own_count = len(dense.own_fields)
        #: the blocks the split fields' pooled values are sent of: those some operator reads
        self.share_blocks = read_by(range(len(self.substitutions))) if self.split_fields else []
        dims = {b.name: b.dim for b in model.blocks()}
        self.share_widths = [len(self.split_fields) * dims[b] for b in self.share_blocks]
        self.width += sum(self.share_widths)
        position = {f: j for j, f in enumerate(self.split_fields)}
        # where this rank's shares go among the split fields (a missing one reads the zero slice)
        mine = {position[f]: j for j, f in enumerate(self.shares)}
        self._share_slots = [mine.get(j, len(self.shares)) for j in range(len(self.split_fields))]
        # every field in order from [exchanged values of the whole fields | the split fields' values]
        split_at = {f: model.num_fields + j for j, f in enumerate(self.split_fields)}
        self._merged_order = [split_at.get(f, f) for f in range(model.num_fields)]
        self._build_split()

    def _in_compute_dtype(self, sub: Any) -> bool:
        return sub.low_precision_local and self.compute_dtype != self.tf_dtype

    def _cast_in(self, *tensors: Any) -> list[Any]:
        # floats only: a field_indices argument stays int32
        return [tf.cast(t, self.compute_dtype) if t.dtype.is_floating else t for t in tensors]

    def _sub_local(self, sub: Any, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """``sub.local``; in the compute dtype where the substitution allows it (``low_precision_local``:
        the first FC layer's matmul under ``--compute-dtype bfloat16``), the result in :attr:`tf_dtype`."""
        if not self._in_compute_dtype(sub):
            return sub.local(emb, params)
        emb, *values = self._cast_in(emb, *params.values())
        return tf.cast(sub.local(emb, dict(zip(params, values))), self.tf_dtype)

    def _whole_local(self, sub: Any, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """An exchanged operator's ``local`` on every field, differentiated by the substitution's
        closed form where it has one (``local_gradient``: the first FC layer's two matmuls, as the
        partials' local backward runs them), not by autodiff of ``local`` (its einsum's gradient
        ran a quarter slower on a rank's rows); ``check_substitution`` proved both equal."""
        if not closed_form_applies(type(sub)):
            return self._sub_local(sub, emb, params)
        names = [n for n in params if n != "field_indices"]
        fixed = {n: v for n, v in params.items() if n == "field_indices"}

        @tf.custom_gradient
        def local(emb: tf.Tensor, *values: tf.Tensor) -> Any:
            held = {**dict(zip(names, values)), **fixed}

            def backward(grad: tf.Tensor) -> list[tf.Tensor]:
                emb_grad, grads = self._sub_local_backward(sub, emb, held, grad)
                return [emb_grad, *[grads[n] for n in names]]

            return self._sub_local(sub, emb, held), backward

        return local(emb, *[params[n] for n in names])

    def _sub_local_dense(self, sub: Any, dense: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """``sub.local_dense`` on the rows' dense features, in the compute dtype as :meth:`_sub_local`."""
        dense = tf.cast(dense, self.tf_dtype)  # the data's float32 numbers in the model's dtype
        if not self._in_compute_dtype(sub):
            return sub.local_dense(dense, params)
        dense, *values = self._cast_in(dense, *params.values())
        return tf.cast(sub.local_dense(dense, dict(zip(params, values))), self.tf_dtype)

    def _sub_local_backward(self, sub: Any, emb: tf.Tensor, params: Mapping[str, tf.Tensor], grad: tf.Tensor
                            ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """``sub.local_backward``, in the compute dtype as :meth:`_sub_local`; gradients in :attr:`tf_dtype`."""
        if not self._in_compute_dtype(sub):
            return sub.local_backward(emb, params, grad)
        emb, grad, *values = self._cast_in(emb, grad, *params.values())
        emb_grad, grads = sub.local_backward(emb, dict(zip(params, values)), grad)
        return tf.cast(emb_grad, self.tf_dtype), {k: tf.cast(g, self.tf_dtype) for k, g in grads.items()}

    def _top(self, top: Sequence[tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        """The model's top network on the substituted operators' outputs -> logits (in :attr:`tf_dtype`)."""
        if self.compute_dtype == self.tf_dtype:
            return self.model.top(dict(zip(self.dense.top_params, top)), outputs)
        cast = lambda t: tf.cast(t, self.compute_dtype)  # noqa: E731
        logits = self.model.top({name: cast(v) for name, v in zip(self.dense.top_params, top)}, [cast(o) for o in outputs])
        return tf.cast(logits, self.tf_dtype)

    def dense_rows(self, batch: Any, lo: int = 0, hi: int | None = None) -> np.ndarray | None:
        """Rows ``lo:hi`` of the batch's dense features in the model's dtype (the top step's
        ``dense`` argument), or None when the model reads none."""
        if not self.reads_dense:
            return None
        given = getattr(batch, "dense", None)
        width = 0 if given is None else given.shape[1]
        if width != self.model.num_dense:
            raise ConfigError(f"the data has {width} dense features, the model {self.model.num_dense}")
        return np.ascontiguousarray(given[lo:hi], dtype=self.dense.dtype)

    def _params_of(self, i: int, names: Sequence[str], values: Sequence[Any]) -> dict[str, Any]:
        prefix = f"{i}:{self.substitutions[i].name}:"
        return {n[len(prefix):]: v for n, v in zip(names, values) if n.startswith(prefix)}

    def _operator_params(self, i: int, names: Sequence[str], values: Sequence[Any], *, on: str,
                         cut: bool = True) -> dict[str, Any]:
        """Substitution ``i``'s field weights among ``names``/``values`` for the fields it runs
        ``on``: ``"every"`` field (exchanged), this rank's ``"own"`` or the ``"split"`` fields (with
        ``cut``, the held slices are cut to those: a rank holds the split fields' after its own)
        and, when it reads them (``Substitution.reads_field_indices``), those fields' global indices."""
        params = self._params_of(i, names, values)
        fields = {"every": range(self.model.num_fields), "own": self.dense.own_fields, "split": self.split_fields}[on]
        if on != "every" and cut and self.split_fields:
            part = slice(None, self.own_count) if on == "own" else slice(self.own_count, None)
            params = {name: value[part] for name, value in params.items()}
        if self.substitutions[i].reads_field_indices:
            params["field_indices"] = tf.constant(list(fields), dtype=tf.int32)
        return params

    def _local_parts(self, pooled: Sequence[tf.Tensor], params: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """Each split substitution's ``local`` on this rank's fields: the buffer's column blocks."""
        by_block = dict(zip(self.split_blocks, pooled))
        return [self._sub_local(self.substitutions[i], by_block[self.substitutions[i].block],
                                self._operator_params(i, self.split_params, params, on="own"))
                for i in self.split]

    def _share_columns(self, spooled: Sequence[tf.Tensor], rows: Any) -> list[tf.Tensor]:
        """This rank's pooled values of its shares (per share block ``[B, S_r, dim]``) as the
        buffer's split-field columns ``[B, S·dim]`` (zeros for the split fields it holds none of)."""
        out = []
        for values, width in zip(spooled, self.share_widths):
            dim = width // len(self.split_fields)
            if len(self.shares) != len(self.split_fields):
                padded = tf.concat([values, tf.zeros([rows, 1, dim], values.dtype)], axis=1)
                values = tf.gather(padded, self._share_slots, axis=1)
            out.append(tf.reshape(values, [rows, width]))
        return out

    def _columns(self, buffer: tf.Tensor) -> list[tf.Tensor]:
        """The buffer cut into the split substitutions' column blocks, then the split fields' pooled
        values per share block ``[rows, S·dim]`` (``tf.split``: its gradient is one concat, where a
        slice's gradient would be a zero-filled buffer per substitution)."""
        widths = [self.substitutions[i].width for i in self.split] + self.share_widths
        return tf.split(buffer, widths, axis=1) if widths else []

    def _share_values(self, columns: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """The split fields' pooled values per share block ``[rows, S, dim]`` from their columns."""
        fields = len(self.split_fields)
        return [tf.reshape(c, [tf.shape(c)[0], fields, w // fields]) for c, w in zip(columns, self.share_widths)]

    def _share_gradients(self, columns: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """This rank's shares' pooled gradients (per share block ``[B, S_r, dim]``) from the
        split fields' columns of ``G``."""
        take = [self.split_fields.index(f) for f in self.shares]
        return [tf.gather(g, take, axis=1) for g in self._share_values(columns)]

    def _local_backward(self, pooled: Sequence[tf.Tensor], params: Sequence[tf.Tensor],
                        part_grads: Sequence[tf.Tensor]) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
        """``G`` (per split substitution: its column block) back through each split substitution's
        ``local_backward`` (closed form where it has one: no forward is recomputed); gradients of
        the blocks two substitutions read are summed. ``params``/the field gradients: the split
        operators' (:attr:`split_params`)."""
        by_block = dict(zip(self.split_blocks, pooled))
        block_grads: dict[str, list[tf.Tensor]] = {name: [] for name in self.split_blocks}
        param_grads: dict[str, tf.Tensor] = {}
        for i, part_grad in zip(self.split, part_grads):
            sub = self.substitutions[i]
            emb_grad, grads = self._sub_local_backward(
                sub, by_block[sub.block], self._operator_params(i, self.split_params, params, on="own"), part_grad)
            block_grads[sub.block].append(emb_grad)
            param_grads.update({f"{i}:{sub.name}:{name}": g for name, g in grads.items()})
        l2 = self.model.l2_embedding
        if l2:  # l2 on the looked-up embeddings (per sample, batch mean) belongs to their owner
            batch = tf.cast(tf.shape(pooled[0])[0], self.tf_dtype)
            for name, p in by_block.items():
                block_grads[name].append((2.0 * l2 / batch) * p)
        pooled_grads = [tf.add_n(block_grads[name]) if block_grads[name] else tf.zeros_like(by_block[name])
                        for name in self.split_blocks]
        return pooled_grads, [param_grads[name] for name in self.split_params]

    def _logits(self, columns: Sequence[tf.Tensor], xpooled: Sequence[tf.Tensor], xparams: Sequence[tf.Tensor],
                sparams: Sequence[tf.Tensor], top: Sequence[tf.Tensor], dense: Any) -> tf.Tensor:
        """The top network's logits from the reduced buffer's column blocks (:meth:`_columns`: the
        split operators' partials, then the split fields' pooled values), the split fields' slices
        ``sparams`` of the split operators' weights (in :attr:`split_params` order), the exchanged
        operators' inputs, and these rows' dense features ``dense`` (None: the data has none), whose
        part every operator that reads them adds before its ``combine``."""
        parts = columns[: len(self.split)]
        by_block = dict(zip(self.exchange_blocks, xpooled))
        shared = dict(zip(self.share_blocks, self._share_values(columns[len(self.split):])))
        weights = dict(zip(self.dense.top_params, top))  # the dense features' weights are among them
        reduced = iter(parts)
        outputs = []
        for i, sub in enumerate(self.substitutions):
            if i in self.exchanged:  # every field here: the split form on one virtual rank, which
                # check_substitution proved equal to ``reference`` (FM's textbook double sum over field
                # pairs costs several times its eq. (6) form, forward + backward)
                emb = by_block[sub.block]
                if self.split_fields:  # the whole fields' exchanged values and the split fields' summed ones
                    emb = tf.gather(tf.concat([emb, shared[sub.block]], axis=1), self._merged_order, axis=1)
                params = self._operator_params(i, self.exchange_params, xparams, on="every")
                summed = self._whole_local(sub, emb, params)
            else:
                summed = next(reduced)
                if self.split_fields:  # the split fields' part of the operator, where the rows are
                    summed += self._sub_local(sub, shared[sub.block],
                                              self._operator_params(i, self.split_params, sparams, on="split", cut=False))
            if i in self.reads_dense:
                summed += self._sub_local_dense(sub, dense, self._params_of(i, weights, list(weights.values())))
            outputs.append(sub.combine(summed))
        return self._top(top, outputs)

    def _build_split(self) -> None:
        jit = lambda fn: compiled(fn, self.jit)  # noqa: E731

        @jit
        def partials(pooled, params, spooled):
            rows = tf.shape([*pooled, *spooled][0])[0]
            return tf.concat(self._local_parts(pooled, params) + self._share_columns(spooled, rows), axis=1)

        @jit
        def local_backward(pooled, params, buffer_grad):
            columns = self._columns(buffer_grad)
            pooled_grads, field_grads = self._local_backward(pooled, params, columns[: len(self.split)])
            return pooled_grads, field_grads, self._share_gradients(columns[len(self.split):])

        @compiled
        def top_predict(buffer, xpooled, xparams, sparams, top, dense):
            sliced = [p[self.own_count:] for p in sparams]  # the split fields' slices, after this rank's own
            return tf.sigmoid(self._logits(self._columns(buffer), self.exchanged_blocks(xpooled), xparams, sliced, top,
                                           dense))

        @jit
        def train_whole(pooled, params, top, labels, global_size, dense):
            # one rank, every operator split: nothing is reduced between the partials and the top
            # network, so the three run as one graph (one call instead of three) and the partials
            # go to the top network as they are (no buffer is packed or cut)
            parts = self._local_parts(pooled, params)
            loss, part_grads, _, _, _, top_grads = self._top_train_parts(parts, [], [], [], labels, top, global_size,
                                                                         dense)
            pooled_grads, field_grads = self._local_backward(pooled, params, part_grads)
            return loss, pooled_grads, field_grads, top_grads

        self.partials, self.local_backward, self.top_predict, self.train_whole = (
            partials, local_backward, top_predict, train_whole)
        self.top_train = compiled(self._top_train, self.jit)
        self.top_train_packed = compiled(self._top_train_packed, self.jit)

    def _top_train(self, buffer: tf.Tensor, xpooled: Sequence[tf.Tensor], xparams: Sequence[tf.Tensor],
                   sparams: Sequence[tf.Tensor], labels: tf.Tensor, top: Sequence[tf.Tensor], global_size: Any,
                   dense: Any) -> tuple:
        """Loss of these rows (their share of the global batch's mean: all of it when they are the
        batch), ``G = ∂L/∂buffer``, the gradients of the exchanged blocks' pooled values and field
        weights, of the split fields' slices of the split operators' weights (``sparams``: the whole
        weights as held), and the top network's (the dense features' weights among them); ``dense``:
        these rows' dense features, or None."""
        loss, column_grads, xpooled_grads, xparam_grads, sparam_grads, top_grads = self._top_train_parts(
            self._columns(buffer), xpooled, xparams, sparams, labels, top, global_size, dense)
        buffer_grad = tf.concat(column_grads, axis=1) if column_grads else tf.zeros_like(buffer)
        return loss, buffer_grad, xpooled_grads, xparam_grads, sparam_grads, top_grads

    def _top_train_packed(self, buffer: tf.Tensor, xpooled: Sequence[tf.Tensor], xparams: Sequence[tf.Tensor],
                          sparams: Sequence[tf.Tensor], labels: tf.Tensor, top: Sequence[tf.Tensor], global_size: Any,
                          dense: Any) -> tuple:
        """:meth:`_top_train` for a rank's row block: ``G`` of its rows, the exchanged blocks' pooled
        gradients (packed as ``xpooled`` is, :meth:`exchanged_blocks`), and ONE flat vector of the
        loss and the gradients of the exchanged field weights, the split fields' slices and the top
        network, in that order (what the top reduction sums). Packed in the graph: at 512 rows,
        packing the returned tensors in numpy took 0.7 ms a step, and the phase ``top`` ran 0.5 ms
        (4 %) shorter so (2 cores, alternating jobs)."""
        loss, buffer_grad, xpooled_grads, xparam_grads, sparam_grads, top_grads = self._top_train(
            buffer, self.exchanged_blocks(xpooled), xparams, sparams, labels, top, global_size, dense)
        if not isinstance(xpooled, (list, tuple)):
            xpooled_grads = tf.concat(xpooled_grads, axis=-1) if len(xpooled_grads) > 1 else xpooled_grads[0]
        flat = [tf.reshape(g, [-1]) for g in (*xparam_grads, *sparam_grads, *top_grads)]
        return buffer_grad, xpooled_grads, tf.concat([tf.reshape(loss, [1]), *flat], axis=0)

    def exchanged_blocks(self, xpooled: Any) -> list:
        """The exchanged blocks' pooled values, one per block: ``xpooled`` as given (a list), or cut
        in the graph out of ONE ``[rows, F, Σ dim]`` array, the blocks side by side in
        :attr:`exchange_blocks` order (as the row owner's exchange pools them). Packed, the array
        goes into TF without a copy (``des/zero_copy.py``); column views of it did not (TF copied
        both blocks of DeepFM's exchanged inputs every step: 0.3 ms at 512 rows, 2.5 ms at 4096 on
        the 2-core VM), and :meth:`_top_train_packed` gives their gradients back packed alike (one
        pass of the row owner's adjoint over the ids, not one per block)."""
        if isinstance(xpooled, (list, tuple)):
            return list(xpooled)
        return tf.split(xpooled, self.exchange_dims, axis=-1) if len(self.exchange_dims) > 1 else [xpooled]

    def _top_train_parts(self, columns: Sequence[tf.Tensor], xpooled: Sequence[tf.Tensor],
                         xparams: Sequence[tf.Tensor], sparams: Sequence[tf.Tensor], labels: tf.Tensor,
                         top: Sequence[tf.Tensor], global_size: Any, dense: Any) -> tuple:
        """:meth:`_top_train` on the buffer's column blocks: their gradients, one per block."""
        columns = list(columns)
        with tf.GradientTape() as tape:
            # the split fields' slices of the weights as held (after this rank's own fields')
            sliced = [p[self.own_count:] for p in sparams]
            tape.watch([columns, xpooled, xparams, sliced, top])
            logits = self._logits(columns, xpooled, xparams, sliced, top, dense)
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)) / global_size
            objective = loss  # the reported loss is the data term, as the owners' l2 is not in it either
            l2 = self.model.l2_embedding
            # l2 on pooled values is added where those of all rows are: the split fields' here
            squares = [tf.reduce_sum(tf.square(c)) for c in columns[len(self.split):]] if l2 else []
            if l2 and self.row_owner_l2_blocks:
                by_block = dict(zip(self.exchange_blocks, xpooled))
                squares += [tf.reduce_sum(tf.square(by_block[b])) for b in self.row_owner_l2_blocks]
            if squares:
                objective += l2 * tf.add_n(squares) / global_size
        column_grads, xpooled_grads, xparam_grads, sparam_grads, top_grads = tape.gradient(
            objective, [columns, xpooled, xparams, sliced, top], unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return loss, column_grads, xpooled_grads, xparam_grads, sparam_grads, top_grads

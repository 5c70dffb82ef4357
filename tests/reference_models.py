"""Independent single-process references: LR, FM, W&D, DeepFM, DCN-v2 and DLRM written the textbook
way in plain TensorFlow -- one dense ``tf.Variable`` per field and block over a fixed vocabulary, the
whole first FC kernel (and DCN-v2's first cross kernel) as one matrix, the papers' equations, Keras
optimizers -- with no des substitution, engine or hash-table code. Only initial *values* are shared
with the engine under test."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf


class PlainTFModel:
    def __init__(
        self,
        model: str,
        vocab: Sequence[np.ndarray],
        linear_init: Sequence[np.ndarray],
        embedding_init: Sequence[np.ndarray] | None,
        first_fc_kernel: np.ndarray | None,
        top_init: Mapping[str, np.ndarray],
        hidden: Sequence[int],
        optimizers: Mapping[str, keras.optimizers.Optimizer],
        activation: str = "relu",
        l2_embedding: float = 0.0,
        l2_dense: float = 0.0,
        cross_kernel: np.ndarray | None = None,
        cross_layers: int = 0,
    ) -> None:
        self.model = model
        self.vocab = [np.asarray(v) for v in vocab]
        self.linear = [tf.Variable(a) for a in linear_init]
        self.embedding = [tf.Variable(a) for a in embedding_init] if embedding_init is not None else []
        self.first_fc = tf.Variable(first_fc_kernel) if first_fc_kernel is not None else None
        self.cross = tf.Variable(cross_kernel) if cross_kernel is not None else None  # DCN-v2's W_0, [F·k, F·k]
        self.cross_layers = cross_layers
        self.top = {name: tf.Variable(value) for name, value in top_init.items()}
        self.depth = len(hidden)
        self.optimizers = optimizers
        self.activation = {"relu": tf.nn.relu, "tanh": tf.tanh, "sigmoid": tf.sigmoid}[activation]
        self.l2_embedding, self.l2_dense = l2_embedding, l2_dense

    def indices(self, batch) -> list[np.ndarray]:
        """Vocabulary positions of each field's id (one-hot data)."""
        out = []
        for f, vocab in enumerate(self.vocab):
            keys = batch.fields[f].keys
            pos = np.searchsorted(vocab, keys)
            assert np.array_equal(vocab[pos], keys), "id outside the reference vocabulary"
            out.append(pos)
        return out

    def logits(self, idx: Sequence[np.ndarray]) -> tf.Tensor:
        e = tf.stack([tf.gather(v, i) for v, i in zip(self.embedding, idx)], axis=1) if self.embedding else None
        if self.model == "dlrm":
            return self.dlrm(e)
        wide = tf.add_n([tf.gather(w, i)[:, 0] for w, i in zip(self.linear, idx)])
        logit = self.top["bias"][0] + wide
        if e is None:
            return logit
        if self.model == "dcnv2":
            return logit + self.dcnv2(e)
        if self.model in ("fm", "deepfm"):
            # Rendle (2010), eq. 3-5: Σ_{i<j} <v_i, v_j> = ½ Σ_f ((Σ_i v_if)² − Σ_i v_if²)
            logit += 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(e, 1)) - tf.reduce_sum(tf.square(e), 1), 1)
        if self.model in ("wdl", "deepfm"):
            h = tf.reshape(e, [e.shape[0], -1]) @ self.first_fc + self.top["deep_bias_0"]
            h = self.activation(h)
            for i in range(1, self.depth + 1):
                h = h @ self.top[f"deep_kernel_{i}"] + self.top[f"deep_bias_{i}"]
                if i < self.depth:
                    h = self.activation(h)
            logit += h[:, 0]
        return logit

    def mlp(self, h: tf.Tensor, prefix: str, depth: int) -> tf.Tensor:
        """Layers 1..depth of a tower after its first layer's pre-activation ``h``; the last linear."""
        h = self.activation(h)
        for i in range(1, depth + 1):
            h = h @ self.top[f"{prefix}_kernel_{i}"] + self.top[f"{prefix}_bias_{i}"]
            if i < depth:
                h = self.activation(h)
        return h

    def dcnv2(self, e: tf.Tensor) -> tf.Tensor:
        """Wang et al. (2021), eq. (1) and figure 2 (b): x_{l+1} = x_0 ⊙ (W_l x_l + b_l) + x_l, in
        parallel with the DNN, one output unit over both."""
        x0 = tf.reshape(e, [e.shape[0], -1])
        xl = x0
        for layer in range(self.cross_layers):
            kernel = self.cross if layer == 0 else self.top[f"cross_kernel_{layer}"]
            xl = x0 * (xl @ kernel + self.top[f"cross_bias_{layer}"]) + xl
        h = self.activation(x0 @ self.first_fc + self.top["deep_bias_0"])
        for i in range(1, self.depth):
            h = self.activation(h @ self.top[f"deep_kernel_{i}"] + self.top[f"deep_bias_{i}"])
        return (tf.concat([xl, h], axis=1) @ self.top["output_kernel"])[:, 0]

    def dlrm(self, e: tf.Tensor) -> tf.Tensor:
        """Naumov et al. (2019) without dense features: the dot products of every pair of field
        embeddings (i < j, row-major), then the top MLP."""
        fields = e.shape[1]
        pairs = [tf.reduce_sum(e[:, i] * e[:, j], axis=1) for i in range(fields) for j in range(i + 1, fields)]
        interaction = tf.stack(pairs, axis=1)
        return self.mlp(interaction @ self.top["deep_kernel_0"] + self.top["deep_bias_0"], "deep", self.depth)[:, 0]

    def penalty(self, idx: Sequence[np.ndarray], batch_size: int) -> tf.Tensor:
        """l2 as des documents it: on the rows a batch looks up (every block, batch mean), and on
        the dense kernels (the whole first FC matrix and the deep kernels, not the biases)."""
        reg = tf.constant(0.0, dtype=self.top[next(iter(self.top))].dtype)
        if self.l2_embedding:
            looked_up = [tf.gather(v, i) for v, i in zip(self.linear + self.embedding, idx + idx[: len(self.embedding)])]
            reg += self.l2_embedding * tf.add_n([tf.reduce_sum(tf.square(r)) for r in looked_up]) / batch_size
        if self.l2_dense and self.first_fc is not None:
            kernels = [self.first_fc] + [self.top[f"deep_kernel_{i}"] for i in range(1, self.depth + 1)]
            reg += self.l2_dense * tf.add_n([tf.reduce_sum(tf.square(k)) for k in kernels])
        return reg

    def predict(self, batch) -> np.ndarray:
        return tf.sigmoid(self.logits(self.indices(batch))).numpy()

    def train_step(self, batch) -> float:
        idx = self.indices(batch)
        labels = tf.constant(batch.labels, dtype=self.top[next(iter(self.top))].dtype)
        groups = {
            "linear": self.linear,
            "embedding": self.embedding,
            "dense": list(self.top.values()) + [v for v in (self.first_fc, self.cross) if v is not None],
        }
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=self.logits(idx)))
            objective = loss + self.penalty(idx, len(batch.labels))
        all_vars = [v for vs in groups.values() for v in vs]
        grads = tape.gradient(objective, all_vars)
        start = 0
        for name, variables in groups.items():
            if not variables:
                continue
            chunk = [tf.convert_to_tensor(g) for g in grads[start : start + len(variables)]]
            self.optimizers[name].apply_gradients(zip(chunk, variables))
            start += len(variables)
        return float(loss)

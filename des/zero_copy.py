"""numpy arrays in and out of TensorFlow without copying them.

TF copies every numpy array a ``tf.function`` is called with into a buffer of its own, and
``Tensor.numpy()`` copies the result back out. On one rank a DeepFM step at B=4096 moves ~8 MB
each way (the pooled embeddings and their gradients, the dense weights and theirs): copies that a
plain TF program on dense inputs does not make.

* :func:`to_tensor` hands TF a numpy array's memory (DLPack) when TF can take it as it is: C
  order, a dtype DLPack carries, and :data:`ALIGNMENT`-aligned (TF aborts the process on an
  unaligned import, so anything else is converted the usual way, by a copy). The array must not
  change while TF uses it: every call here is synchronous, and TF never writes into memory it does
  not own (a tensor's buffer is forwarded to an op's output only when TF owns it).
* :func:`aligned_empty` allocates arrays that qualify (the gathered embeddings, the dense weights).
* :func:`to_numpy` is ``Tensor.numpy()`` without the copy: an ndarray over the tensor's buffer that
  keeps the tensor alive. It is writeable only so that numba sees the same array type as for any
  other array (one compiled kernel, not a read-only variant); nothing writes into it.

TensorFlow is imported on first use only (the table code that allocates with
:func:`aligned_empty` runs without it).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

#: TF's buffer alignment (Eigen's ``EIGEN_MAX_ALIGN_BYTES`` with AVX-512): the least its DLPack import takes
ALIGNMENT = 64
_DLPACK_KINDS = "fiub"  # float, signed, unsigned, bool: what both numpy and TF's DLPack carry


def aligned_empty(shape: int | tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialized C-order array whose data starts at a multiple of :data:`ALIGNMENT`."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """``array`` copied into :func:`aligned_empty` memory."""
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


def is_aligned(array: np.ndarray) -> bool:
    """Its data starts at a multiple of :data:`ALIGNMENT` (what TF's DLPack import needs)."""
    return array.__array_interface__["data"][0] % ALIGNMENT == 0


def to_tensor(value: Any) -> Any:
    """``value`` as TF takes it: a numpy array that qualifies (module docstring) as a tensor over
    its memory, any other value unchanged (TF converts it, copying an array)."""
    if (not isinstance(value, np.ndarray) or not value.size or value.dtype.kind not in _DLPACK_KINDS
            or not value.flags.c_contiguous or not is_aligned(value)):
        return value
    from tensorflow.experimental import dlpack

    return dlpack.from_dlpack(value.__dlpack__())


def to_numpy(tensor: Any) -> np.ndarray:
    """A CPU tensor's values as a numpy array over its buffer (no copy); ``Tensor.numpy()`` for a
    dtype DLPack does not carry (bfloat16) or an empty tensor."""
    if not tensor.dtype.is_numpy_compatible or tensor.dtype.name == "bfloat16" or not tensor.shape.num_elements():
        return tensor.numpy()
    view = np.from_dlpack(tensor)
    buffer = (ctypes.c_byte * view.nbytes).from_address(view.__array_interface__["data"][0])
    buffer._tensor_memory = view  # the buffer keeps the tensor's memory alive
    return np.frombuffer(buffer, dtype=view.dtype).reshape(view.shape)

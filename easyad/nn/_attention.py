"""MultiheadAttention with torch's parameters (``in_proj_weight`` (3E, E),
``in_proj_bias`` (3E,), ``out_proj.weight`` (E, E), ``out_proj.bias`` (E,)), so a torch
state_dict loads as it is; the heads are a reshape and transpose of the projections, the
attention a composition of tensor operations."""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import random as _random
from easyad import tensor as _tensor
from easyad.errors import ShapeError
from easyad.nn import functional as F
from easyad.nn import init
from easyad.nn._layers import Linear
from easyad.nn._module import Module
from easyad.nn._parameter import Parameter, float_dtype
from easyad.tensor import Tensor


def _bool_bias(mask: Any, dtype: Any) -> Any:
    """torch's MultiheadAttention masks: bool True means *do not attend* (-inf); a float
    mask is added."""
    if isinstance(mask, Tensor) and mask.tape is not None:
        return mask
    m = np.asarray(mask.value if isinstance(mask, Tensor) else mask)
    if m.dtype == bool:
        return np.where(m, -np.inf, 0.0).astype(dtype)
    return m.astype(dtype)


class MultiheadAttention(Module):
    """torch's ``MultiheadAttention`` (``kdim = vdim = embed_dim``): call it as
    ``mha(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False, tape=None)``; returns ``(output,
    weights)`` (weights None unless ``need_weights``). Inputs are (N, L, E) with
    ``batch_first=True``, else (L, N, E) (torch's default), or unbatched (L, E).
    Called with one input (``mha(x)``, ``mha(x, tape)``: as a Sequential calls it), it is
    self-attention and returns the output only.
    Initialised as torch: ``in_proj_weight`` Xavier-uniform, biases zero, ``out_proj``
    a Linear's weight.

    >>> import numpy as np, easyad as ad
    >>> mha = ad.nn.MultiheadAttention(4, 2, batch_first=True, generator=0)
    >>> x = np.ones((3, 5, 4))
    >>> out, w = mha(x, x, x)
    >>> out.shape, w.shape
    ((3, 5, 4), (3, 5, 5))
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True, add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: int | None = None, vdim: int | None = None, batch_first: bool = False,
                 generator: Any = None, dtype: Any = None, device: Any = None) -> None:
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim {embed_dim} must split into "
                             f"num_heads={num_heads}")
        if add_bias_kv or add_zero_attn or kdim not in (None, embed_dim) or \
                vdim not in (None, embed_dim):
            raise NotImplementedError("MultiheadAttention: add_bias_kv, add_zero_attn and "
                                      "kdim/vdim other than embed_dim are not supported "
                                      "(project key and value to embed_dim first)")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.batch_first, self.head_dim = batch_first, embed_dim // num_heads
        dt = float_dtype(dtype)
        rng = _random.resolve(generator)
        self.in_proj_weight = Parameter(np.zeros((3 * embed_dim, embed_dim)), dt, device)
        init.xavier_uniform_(self.in_proj_weight, generator=rng)
        self.in_proj_bias = Parameter(np.zeros(3 * embed_dim), dt, device) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, generator=rng, dtype=dtype,
                               device=device)
        if self.out_proj.bias is not None:
            init.zeros_(self.out_proj.bias)

    def __call__(self, query: Any, key: Any = None, value: Any = None,  # type: ignore[override]
                 key_padding_mask: Any = None, need_weights: bool = True,
                 attn_mask: Any = None, average_attn_weights: bool = True,
                 is_causal: bool = False, tape: Any = None) -> Any:
        if value is None and not isinstance(key, (Tensor, np.ndarray, list, tuple)):
            return self.forward(query, tape if key is None else key)   # as Sequential calls
        if key is None or value is None:
            raise TypeError("MultiheadAttention: pass query, key and value (the same "
                            "array three times for self-attention)")
        args = [self._as_input(a) if not isinstance(a, Tensor) else a
                for a in (query, key, value)]
        if tape is None:
            tape = next((a.tape for a in args if a.tape is not None), None)
        return self.attend(*args, key_padding_mask, need_weights, attn_mask,
                           average_attn_weights, is_causal, tape)

    def forward(self, x: Any, tape: Any = None) -> Any:
        """Self-attention of ``x`` without weights (so it sits in a Sequential)."""
        return self.attend(x, x, x, None, False, None, True, False, tape)[0]

    def attend(self, query: Any, key: Any, value: Any, key_padding_mask: Any,
               need_weights: bool, attn_mask: Any, average_attn_weights: bool,
               is_causal: bool, tape: Any) -> tuple[Any, Any]:
        e, h, d = self.embed_dim, self.num_heads, self.head_dim
        shapes = [tuple(a.shape) for a in (query, key, value)]
        if any(len(s) not in (2, 3) or s[-1] != e for s in shapes) or \
                len({len(s) for s in shapes}) != 1 or shapes[1] != shapes[2]:
            raise ShapeError(f"MultiheadAttention: query, key and value of shapes {shapes} "
                             f"must be ({'N, L' if self.batch_first else 'L, N'}, {e}) "
                             f"or ({'L'}, {e}), key and value alike")
        unbatched = len(shapes[0]) == 2
        if unbatched:
            query, key, value = (a.reshape((1,) + tuple(a.shape)) for a in (query, key,
                                                                          value))
        elif not self.batch_first:
            query, key, value = (a.transpose((1, 0, 2)) for a in (query, key, value))
        n, length, source = query.shape[0], query.shape[1], key.shape[1]
        if key.shape[0] != n or query.shape[0] != n:
            raise ShapeError(f"MultiheadAttention: query, key and value have batch sizes "
                             f"{query.shape[0]}, {key.shape[0]}, {value.shape[0]}; "
                             f"make them equal")
        w = self.in_proj_weight.tensor(tape)
        b = self.in_proj_bias.tensor(tape) if self.in_proj_bias is not None else None

        def project(x: Any, i: int, steps: int) -> Any:
            y = F.linear(x, w[i * e:(i + 1) * e], None if b is None else b[i * e:(i + 1) * e])
            return y.reshape((n, steps, h, d)).transpose((0, 2, 1, 3))     # (N, h, L, d)
        q, k, v = project(query, 0, length), project(key, 1, source), project(value, 2,
                                                                              source)
        scores = (q @ k.transpose((0, 1, 3, 2))) * (1.0 / float(np.sqrt(d)))
        bias = self._bias(attn_mask, key_padding_mask, is_causal, n, length, source,
                          scores.dtype)
        if bias is not None:
            scores = scores + bias
        weights = _tensor.softmax(scores, axis=-1)
        if self.training and self.dropout > 0.0:
            weights = F.dropout(weights, self.dropout)
        out = (weights @ v).transpose((0, 2, 1, 3)).reshape((n, length, e))
        out = self.out_proj(out, tape)
        if unbatched:
            out = out.reshape((length, e))
        elif not self.batch_first:
            out = out.transpose((1, 0, 2))
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = _tensor.mean(weights, axis=1)
        if unbatched:
            weights = weights.reshape(tuple(weights.shape)[1:])
        return out, weights

    def _bias(self, attn_mask: Any, key_padding_mask: Any, is_causal: bool, n: int,
              length: int, source: int, dtype: Any) -> Any:
        bias: Any = None
        if is_causal and attn_mask is None:
            attn_mask = ~np.tril(np.ones((length, source), dtype=bool))
        if attn_mask is not None:
            m = _bool_bias(attn_mask, dtype)
            ms = tuple(m.shape)
            if ms == (n * self.num_heads, length, source):
                m = m.reshape((n, self.num_heads, length, source))
            elif ms != (length, source):
                raise ShapeError(f"MultiheadAttention: attn_mask of shape {ms} must be "
                                 f"({length}, {source}) or ({n * self.num_heads}, {length}, "
                                 f"{source})")
            bias = m
        if key_padding_mask is not None:
            kp = _bool_bias(key_padding_mask, dtype)
            if tuple(kp.shape) != (n, source):
                raise ShapeError(f"MultiheadAttention: key_padding_mask of shape "
                                 f"{tuple(kp.shape)} must be ({n}, {source}): one per key")
            kp = kp.reshape((n, 1, 1, source))
            bias = kp if bias is None else bias + kp
        return bias

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"batch_first={self.batch_first}")

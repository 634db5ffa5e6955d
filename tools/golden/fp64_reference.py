"""transformers' models kept in float64 throughout, for goldens of float64
identities.

transformers rounds to float32 in two places even in a float64 model: its
eager attention's softmax and the RMSNorm upcast. ``use_fp64_reference``
replaces both by the same math in the input dtype: an attention registered
as ``"eager_fp64"`` (causal, for unpadded rows, plus the layer's sliding
window where it has one, and gpt-oss's attention sinks where the layer
passes them) and the ``forward`` of the given RMSNorm classes.
Only the rotary tables stay float32, as in loraplex.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface

ATTENTION = "eager_fp64"


def attention_in_input_dtype(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Eager attention without the float32 softmax: causal (the rows are
    unpadded), plus the layer's sliding window where it has one."""
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    weights = (query @ key.transpose(2, 3)) * scaling
    q_len, k_len = weights.shape[-2], weights.shape[-1]
    q_pos = torch.arange(k_len - q_len, k_len)[:, None]
    k_pos = torch.arange(k_len)[None, :]
    hidden = k_pos > q_pos
    # An attribute of the layer (OLMo 3, Gemma 3) or an argument (Phi-3).
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    if window is not None:
        hidden = hidden | (q_pos - k_pos >= window)
    weights = weights.masked_fill(hidden, float("-inf"))
    sinks = kwargs.get("s_aux")
    if sinks is None:
        weights = torch.softmax(weights, dim=-1)
    else:
        # gpt-oss: each head's sink logit joins the softmax as one more
        # column, which is then dropped (its eager_attention_forward).
        column = sinks.reshape(1, -1, 1, 1).expand(weights.shape[0], -1, q_len, 1)
        combined = torch.cat([weights, column], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        weights = torch.softmax(combined, dim=-1)[..., :-1]
    out = (weights @ value).transpose(1, 2).contiguous()
    return out, weights


def normed(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def weight_times_normed(self, hidden_states):
    """w · x̂ (Llama, Qwen3, OLMo, Phi-3) without the float32 upcast."""
    return self.weight * normed(hidden_states, self.variance_epsilon)


def one_plus_weight_times_normed(self, x):
    """(1 + w) · x̂ (Gemma 3) without the float32 upcast."""
    return normed(x, self.eps) * (1.0 + self.weight)


def use_fp64_reference(weight_norms=(), one_plus_weight_norms=()) -> None:
    """Registers the attention and patches the RMSNorm classes given."""
    AttentionInterface.register(ATTENTION, attention_in_input_dtype)
    for norm_class in weight_norms:
        norm_class.forward = weight_times_normed
    for norm_class in one_plus_weight_norms:
        norm_class.forward = one_plus_weight_times_normed

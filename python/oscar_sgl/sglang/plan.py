"""The key-rotation rule on the server: `reference.key_rotation_plan` computed from the weights
SGLang loaded on this rank (docs/OSCAR.md §7).

The rule needs, per decoder layer, the query and key projection rows and biases, the input norm's
gains, the q/k RMSNorm gains when the model has them and the RoPE base (`reference.head_alignment`). SGLang's attention
modules fuse the projections (`qkv_proj`, rows ``[q | k | v]`` of this rank's heads) or keep them
apart (`q_proj`, `k_proj`); a tensor-parallel rank holds whole heads, so its shard gives the rule
for exactly the KV heads its pool stores. Gains are read as the norm module's own output for an
all-ones input (``forward_native``, SGLang's torch formula), so the Llama (``w``) and Gemma
(``1 + w``) conventions need no special case. Runs once, when the attention backend is built: after
the weights are loaded and before the first write or CUDA-graph capture.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import reference as ref
from ..config import OscarConfig
from ..errors import OscarConfigError

_FIX = "; use --oscar-key-rotation all (every head's keys rotated, the paper)"


def _decoder_layers(model: Any) -> Any:
    inner = getattr(model, "model", None)
    for owner in (inner, model, getattr(inner, "language_model", None), getattr(model, "language_model", None)):
        layers = getattr(owner, "layers", None) if owner is not None else None
        if layers is not None:
            return layers
    return None


def _norm_gain(norm: Any, dim: int, where: str) -> torch.Tensor:
    w = getattr(norm, "weight", None)
    if w is None or not torch.is_floating_point(w):
        raise OscarConfigError(f"--oscar-key-rotation weights reads the gains of {where}, which has no float weight{_FIX}")
    fn = getattr(norm, "forward_native", None) or norm
    with torch.no_grad():
        out = fn(torch.ones(1, dim, dtype=w.dtype, device=w.device))
    if isinstance(out, tuple):
        out = out[0]
    return out.reshape(-1).float()


def _projections(attn: Any, head_dim: int, num_kv_heads: int, where: str) -> tuple[torch.Tensor, ...]:
    """``(w_q, w_k, b_q, b_k)`` of this rank's heads (biases None when the projection has none)."""
    if hasattr(attn, "qkv_proj"):
        w = getattr(attn.qkv_proj, "weight", None)
        b = getattr(attn.qkv_proj, "bias", None)
        q_size = getattr(attn, "q_size", None)
        kv_size = getattr(attn, "kv_size", num_kv_heads * head_dim)
        if q_size is None and hasattr(attn, "num_heads"):
            q_size = attn.num_heads * head_dim
        if w is None or q_size is None:
            raise OscarConfigError(f"--oscar-key-rotation weights cannot split {where}.qkv_proj into q / k rows{_FIX}")
        wq, wk = w[:q_size], w[q_size:q_size + kv_size]
        bq, bk = (None, None) if b is None else (b[:q_size], b[q_size:q_size + kv_size])
    elif hasattr(attn, "q_proj") and hasattr(attn, "k_proj"):
        wq, wk = getattr(attn.q_proj, "weight", None), getattr(attn.k_proj, "weight", None)
        bq, bk = getattr(attn.q_proj, "bias", None), getattr(attn.k_proj, "bias", None)
        if wq is None or wk is None:
            raise OscarConfigError(f"--oscar-key-rotation weights finds no q_proj / k_proj weight in {where}{_FIX}")
    else:
        raise OscarConfigError(f"--oscar-key-rotation weights reads q/k projections; {where} "
                               f"({type(attn).__name__}) has neither qkv_proj nor q_proj / k_proj{_FIX}")
    for name, t in (("q", wq), ("k", wk)):
        if not torch.is_floating_point(t) or t.element_size() < 2:
            raise OscarConfigError(f"--oscar-key-rotation weights reads the {name} projection of {where}, stored as "
                                   f"{t.dtype} (a quantized checkpoint){_FIX}")
    return wq, wk, bq, bk


def _rope_theta(model: Any, attn: Any) -> float | None:
    """The RoPE base: the attention module's rotary embedding's, else the model config's."""
    base = getattr(getattr(attn, "rotary_emb", None), "base", None)
    if base:
        return float(base)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    return ref.rope_theta_of(config) if config is not None else None


def key_rotation_plan_from_sglang(model: Any, cfg: OscarConfig, *, start_layer: int, num_layers: int, num_kv_heads: int,
                                  head_dim: int) -> tuple[list[tuple[bool, ...]], list[list[float]]]:
    """``(plan, rho)`` for the pool's layers ``start_layer .. start_layer + num_layers - 1``: one
    flag and one alignment per KV head this rank holds (`reference.plan_from_alignment`).

    Raises:
        OscarConfigError: the model's modules do not expose what the rule reads (naming the layer
            and what is missing), or its projections are quantized; the message says to use
            ``--oscar-key-rotation all``.
    """
    if model is None:
        raise OscarConfigError(f"--oscar-key-rotation weights needs the loaded model (the model runner has none){_FIX}")
    layers = _decoder_layers(model)
    if layers is None:
        raise OscarConfigError(f"--oscar-key-rotation weights reads the decoder layers; {type(model).__name__} "
                               f"exposes no `model.layers`{_FIX}")
    rho = []
    for li in range(start_layer, start_layer + num_layers):
        where = f"layer {li}"
        layer = layers[li]
        attn = getattr(layer, "self_attn", None)
        norm = getattr(layer, "input_layernorm", None)
        if attn is None or norm is None:
            raise OscarConfigError(f"--oscar-key-rotation weights reads self_attn and input_layernorm; {where} "
                                   f"({type(layer).__name__}) lacks one{_FIX}")
        wq, wk, bq, bk = _projections(attn, head_dim, num_kv_heads, f"{where} self_attn")
        gains = {name: _norm_gain(getattr(attn, name), head_dim, f"{where} self_attn.{name}")
                 for name in ("q_norm", "k_norm") if getattr(attn, name, None) is not None}
        try:
            rho.append(ref.head_alignment(wq, wk, _norm_gain(norm, wq.shape[1], f"{where} input_layernorm"),
                                          num_kv_heads=num_kv_heads, head_dim=head_dim,
                                          q_norm_gain=gains.get("q_norm"), k_norm_gain=gains.get("k_norm"),
                                          q_bias=bq, k_bias=bk, rope_theta=_rope_theta(model, attn), k_group=cfg.k_group))
        except ValueError as e:
            raise OscarConfigError(f"--oscar-key-rotation weights: {where}: {e}{_FIX}") from None
    return ref.plan_from_alignment(rho, cfg), rho


def kivi_layers_over_ranks(plan: list[tuple[bool, ...]]) -> list[tuple[bool, ...]]:
    """This rank's plan with each layer's KIVI decision taken over the heads of every attention
    tensor-parallel rank (`reference.LayerKeys`): a layer is stored as KIVI only when no rank
    rotates any of its heads' keys, as `OscarCache` decides over all heads; a layer whose rotated
    heads are all on other ranks is mixed here, with every flag off (values rotated, token scales
    on). One all-reduce (MAX) of a flag per layer over the attention-TP group's CPU group, when
    the backend is built on every rank; nothing at TP = 1."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if int(getattr(parallel, "attn_tp_size", 1) or 1) <= 1:
        return plan
    import torch.distributed as dist

    rotated = torch.tensor([int(any(row)) for row in plan], dtype=torch.int32)
    dist.all_reduce(rotated, op=dist.ReduceOp.MAX, group=parallel.attn_tp_group.cpu_group)
    return [ref.LayerKeys(row, kivi=not r) for row, r in zip(plan, rotated.tolist())]

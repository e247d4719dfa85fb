"""The OScaR pool + `oscar` backend on device="cpu" with SGLang's real pool / req-to-token / layer
classes: writes through the backend, then attention equals `reference.decode_attention`.

`model_runner` and `forward_batch` are plain namespaces holding only the fields the backend reads
(building a real ModelRunner needs a loaded model; the real server test covers that path).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from oscar_sgl import reference as ref  # noqa: E402
from oscar_sgl.config import OscarConfig  # noqa: E402
from oscar_sgl.sglang.allocator import OscarPagedAllocator  # noqa: E402
from oscar_sgl.sglang.backend import create_oscar_backend  # noqa: E402
from oscar_sgl.sglang.metrics import snapshot  # noqa: E402
from oscar_sgl.sglang.pool import pool_class_for  # noqa: E402
from support.kernel_data import query_reference  # noqa: E402

H, HQ, D, P, LAYERS = 2, 4, 16, 16, 2
CFG = OscarConfig(bits=2, k_group=8, v_group=8, page_size=P)
CFG_PAGE = CFG.replace(key_ranges="page")


def _setup(max_tokens=256, prefill="position", plan=None, window=-1, cfg=CFG, bf16_layers=()):
    """The stack over a pool whose key-rotation plan is ``plan`` (default: every head's keys
    rotated; the backend computes it from the weights only when none is installed, and these
    runners hold no model). ``window``: the layers' sliding window (SGLang's -1: none)."""
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    pool = pool_class_for(cfg, max_running_requests=4, prefill=prefill, bf16_layers=bf16_layers)(
        max_tokens, page_size=P, dtype=torch.float32, head_num=H, head_dim=D, layer_num=LAYERS,
        device="cpu", enable_memory_saver=False,
    )
    pool.oscar_set_key_rotation(plan if plan is not None else [(True,) * H] * LAYERS)
    alloc = OscarPagedAllocator(max_tokens, P, torch.float32, "cpu", pool, False, step=pool.oscar_step)
    r2t = ReqToTokenPool(size=4, max_context_len=256, device="cpu", enable_memory_saver=False)
    runner = SimpleNamespace(device="cpu", req_to_token_pool=r2t, token_to_kv_pool=pool)
    backend = create_oscar_backend(runner)
    layers = [RadixAttention(HQ, D, D ** -0.5, H, layer_id=i, sliding_window_size=window) for i in range(LAYERS)]
    return pool, alloc, r2t, backend, layers


def _batch(row, slots, prefix, seq):
    return SimpleNamespace(
        req_pool_indices=torch.tensor([row]), seq_lens=torch.tensor([seq]),
        extend_prefix_lens=torch.tensor([prefix]), out_cache_loc=slots[prefix:seq],
    )


# per layer, one flag per KV head; "rank": layer 0 as a tensor-parallel rank holds it when the layer's
# rotated heads are all on other ranks (mixed, every local flag off), layer 1 KIVI over every rank
PLANS = {"all": None, "mixed+kivi": [(True, False), (False, False)],
         "rank": [ref.LayerKeys((False, False), kivi=False), ref.LayerKeys((False, False), kivi=True)]}


@pytest.mark.parametrize("plan,window,cfg", [("all", -1, CFG), ("mixed+kivi", -1, CFG), ("all", 20, CFG),
                                             ("mixed+kivi", 20, CFG_PAGE), ("rank", -1, CFG)])
@pytest.mark.parametrize("mode", ["position", "exact"])
@pytest.mark.parametrize("prefill", [37, 32, 5])
def test_extend_then_decode_equals_reference(prefill, mode, plan, window, cfg):
    """``plan`` "mixed+kivi": layer 0 rotates head 0's keys only, layer 1 none (stored as KIVI).
    ``plan`` "rank": layer 0 stored as mixed with no local head rotated (values rotated, token
    scales), layer 1 as KIVI: the layer decisions a tensor-parallel rank gets over all ranks' heads.
    ``window`` 20: sliding-window layers (a query at x sees x - 20 .. x). ``cfg`` `CFG_PAGE`:
    page-grid key ranges."""
    if (plan != "all" or window >= 0) and prefill == 32:
        pytest.skip("the key-rotation plan and the window are covered at prefill 37 and 5")
    torch.manual_seed(prefill)
    flags = PLANS[plan]
    pool, alloc, r2t, backend, layers = _setup(prefill=mode, plan=flags, window=window, cfg=cfg)
    total = prefill + 20
    slots = torch.zeros(total, dtype=torch.int64)
    k_all = torch.randn(LAYERS, H, total, D) * torch.linspace(0.5, 4, total)[None, None, :, None]
    v_all = torch.randn(LAYERS, H, total, D)
    q_all = torch.randn(LAYERS, total, HQ, D)

    def allocate(prefix, seq, decode):
        """What SGLang's scheduler does before the forward: the paged allocator hands out slots."""
        t = lambda x: torch.tensor([x], dtype=torch.int64)  # noqa: E731
        last = t(int(slots[prefix - 1]) if prefix else -1)
        if decode:
            out = alloc.alloc_decode(t(seq), t(seq), last)
        else:
            out = alloc.alloc_extend(t(prefix), t(prefix), t(seq), t(seq), last, seq - prefix)
        assert out is not None
        slots[prefix:seq] = out
        r2t.req_to_token[1, prefix:seq] = out.to(torch.int32)

    def step(prefix, seq, decode):
        allocate(prefix, seq, decode)
        fb = _batch(1, slots, prefix, seq)
        backend.init_forward_metadata(fb)  # the one runtime call of the step
        for li, layer in enumerate(layers):
            k = k_all[li, :, prefix:seq].transpose(0, 1).contiguous()
            v = v_all[li, :, prefix:seq].transpose(0, 1).contiguous()
            q = q_all[li, prefix:seq].reshape(seq - prefix, HQ * D)
            fwd = backend.forward_decode if decode else backend.forward_extend
            o = fwd(q, k, v, layer, fb).reshape(seq - prefix, HQ, D)
            for i, pos in enumerate(range(prefix, seq)):
                want = query_reference(q_all[li, pos], k_all[li], v_all[li], pos, prefix, mode, cfg, D ** -0.5,
                                       key_rotated=flags[li] if flags else None, window_left=window)
                torch.testing.assert_close(o[i], want, atol=2e-5, rtol=2e-5)

    step(0, prefill, decode=False)  # a fresh prompt (exact attention with `exact`)
    step(prefill, prefill + 9, decode=False)  # a prefix-cache hit / chunked prefill
    for s in range(prefill + 9, total):
        step(s, s + 1, decode=True)
    # Sealed pages hold exactly the reference bytes.
    first = int(slots[0]) // P
    for li in range(LAYERS):
        kb, vb = ref.seal(k_all[li, :, :P], v_all[li, :, :P], cfg, flags[li] if flags else None)
        assert torch.equal(pool.k_codes[li][first], kb.codes) and torch.equal(pool.v_codes[li][first], vb.codes)
        assert torch.equal(pool.k_params[li][first], kb.params)
        assert (kb.ranges is None) == (pool.k_ranges is None)
        if kb.ranges is not None:
            assert torch.equal(pool.k_ranges[li][first], kb.ranges)
        assert (kb.scale is None) == (flags is not None and ref.kivi_layer(cfg, flags[li]))
        assert (flags is None or not ref.kivi_layer(cfg, flags[li])) == pool.layer_rotates_values(li)
        if kb.scale is not None:
            assert torch.equal(pool.scales[li][first], kb.scale)
    states = pool.oscar_page_states()
    assert states["sealed"] == total // P and states["open"] == 1
    # Freeing the request's pages returns the staging page (the runtime sees it at the next step).
    alloc.free(slots)
    pool.oscar_step.begin(new_step=True)
    pool.oscar_step.begin(new_step=True)
    assert pool.oscar_page_states() == {"sealed": 0, "open": 0, "staging_in_use": 0,
                                       "staging_total": pool.num_staging}
    pool.oscar_runtime.check()


def _window_reference(q, k, v, pos, window, sm_scale):
    """Plain softmax attention in float64 of the query ``q`` [Hq, D] at position ``pos`` over the
    keys / values ``k``, ``v`` [H, >= pos + 1, D] at positions pos - window .. pos (GQA)."""
    lo = max(0, pos - window)
    kk, vv = k[:, lo:pos + 1].double(), v[:, lo:pos + 1].double()
    g = q.shape[0] // k.shape[0]
    kk, vv = kk.repeat_interleave(g, 0), vv.repeat_interleave(g, 0)
    p = torch.softmax(torch.einsum("hd,htd->ht", q.double(), kk) * sm_scale, -1)
    return torch.einsum("ht,htd->hd", p, vv).float()


def _bf16_layer_run(chunks):
    """`--oscar-sliding-layers bf16`: layer 1 (a sliding layer, window 20) kept in the KV dtype, layer 0
    quantized in the same pool; a prompt in ``chunks``, then decode steps. Checks every output
    against its reference (float64 windowed attention on layer 1, the OScaR reference on layer 0)
    and returns layer 1's outputs by position."""
    from oscar_sgl.sglang import sliding

    torch.manual_seed(3)
    window, total = 20, sum(chunks) + 12
    pool, alloc, r2t, backend, layers = _setup(window=window, bf16_layers=(1,))
    assert pool.is_bf16_layer(1) and not pool.is_bf16_layer(0)
    assert pool.k_codes[1].shape[0] == 1 and pool.stage_k[1].shape[0] == 1 and pool.bf16_k[0] is None
    assert pool.bf16_k[1].shape == (pool.size + P, H, D) and pool.get_key_buffer(1) is pool.bf16_k[1]
    with pytest.raises(NotImplementedError, match="packed"):
        pool.get_key_buffer(0)
    slots = torch.zeros(total, dtype=torch.int64)
    k_all = torch.randn(LAYERS, H, total, D) * 2
    v_all = torch.randn(LAYERS, H, total, D)
    q_all = torch.randn(LAYERS, total, HQ, D)
    got = torch.zeros(total, HQ, D)
    old_block = sliding.EXTEND_BLOCK

    def step(prefix, seq, decode):
        t = lambda x: torch.tensor([x], dtype=torch.int64)  # noqa: E731
        last = t(int(slots[prefix - 1]) if prefix else -1)
        out = (alloc.alloc_decode(t(seq), t(seq), last) if decode
               else alloc.alloc_extend(t(prefix), t(prefix), t(seq), t(seq), last, seq - prefix))
        slots[prefix:seq] = out
        r2t.req_to_token[1, prefix:seq] = out.to(torch.int32)
        fb = _batch(1, slots, prefix, seq)
        backend.init_forward_metadata(fb)
        for li, layer in enumerate(layers):
            k = k_all[li, :, prefix:seq].transpose(0, 1).contiguous()
            v = v_all[li, :, prefix:seq].transpose(0, 1).contiguous()
            q = q_all[li, prefix:seq].reshape(seq - prefix, HQ * D)
            o = (backend.forward_decode if decode else backend.forward_extend)(q, k, v, layer, fb).reshape(-1, HQ, D)
            for i, pos in enumerate(range(prefix, seq)):
                if li == 1:
                    want = _window_reference(q_all[1, pos], k_all[1], v_all[1], pos, window, D ** -0.5)
                    got[pos] = o[i]
                else:
                    want = query_reference(q_all[0, pos], k_all[0], v_all[0], pos, prefix, "position", CFG,
                                           D ** -0.5, window_left=window)
                torch.testing.assert_close(o[i], want, atol=2e-5, rtol=2e-5)

    try:
        sliding.EXTEND_BLOCK = 16  # several blocks over these short prompts
        at = 0
        for n in chunks:
            step(at, at + n, decode=False)
            at += n
        for s in range(at, total):
            step(s, s + 1, decode=True)
    finally:
        sliding.EXTEND_BLOCK = old_block
    torch.testing.assert_close(pool.bf16_k[1][slots], k_all[1].transpose(0, 1))
    first = int(slots[0]) // P  # layer 0's first page is sealed as the reference seals it
    kb, _ = ref.seal(k_all[0, :, :P], v_all[0, :, :P], CFG)
    assert torch.equal(pool.k_codes[0][first], kb.codes)
    s = snapshot(pool)
    assert s["bf16_layers"] == [1] and s["sliding_layers"] == CFG.sliding_layers
    assert s["kv_bytes_per_token"] == CFG.bytes_per_token(H, D) + 2 * H * D * 4  # float32 pool here
    assert s["effective_bits"] == pytest.approx(8 * s["kv_bytes_per_token"] / (2 * H * D * LAYERS))
    assert s["key_rotation"]["heads"] == H  # layer 1 rotates nothing
    return got


def test_bf16_sliding_layers_attend_exactly_over_their_window():
    """Layer 1's rows are written at their slots and every query sees its window exactly; the packed
    arrays of layer 1 are one page, its K/V buffers one row per slot (`_bf16_layer_run`). The same
    prompt chunked differently gives the same bits on layer 1 (extend blocks aligned to positions,
    not to the chunk)."""
    one = _bf16_layer_run((37,))
    for chunks in ((5, 32), (16, 16, 5), (3, 30, 4)):
        assert torch.equal(_bf16_layer_run(chunks)[:37], one[:37]), chunks


@pytest.mark.parametrize("gather", [None, 1])
def test_bf16_window_attention_over_a_batch(gather):
    """`sliding.window_extend` over a batch of three requests (a fresh prompt, a chunk after a
    prefix, a one-token chunk) and `window_decode` over their next tokens equal the float64
    windowed reference; ``gather`` 1: one block (one request) per launch."""
    from oscar_sgl.sglang import sliding

    torch.manual_seed(5)
    window, slots_n = 11, 300
    k_buf, v_buf = torch.randn(slots_n, H, D), torch.randn(slots_n, H, D)
    r2t = torch.randperm(slots_n)[:4 * 64].reshape(4, 64).to(torch.int32)
    rows, pre, seq = [2, 0, 3], [0, 29, 40], [37, 45, 41]
    q = torch.randn(sum(b - a for a, b in zip(pre, seq)), HQ, D)
    k_tok = lambda r, n: k_buf[r2t[r, :n].long()].transpose(0, 1)  # noqa: E731  [H, n, D] by position
    v_tok = lambda r, n: v_buf[r2t[r, :n].long()].transpose(0, 1)  # noqa: E731
    old = sliding.GATHER_ELEMENTS
    try:
        if gather:
            sliding.GATHER_ELEMENTS = gather
        out = sliding.window_extend(q, k_buf, v_buf, r2t, rows, pre, seq, window, D ** -0.5, block=16)
        at = 0
        for r, s0, s1 in zip(rows, pre, seq):
            for pos in range(s0, s1):
                want = _window_reference(q[at], k_tok(r, s1), v_tok(r, s1), pos, window, D ** -0.5)
                torch.testing.assert_close(out[at], want, atol=2e-5, rtol=2e-5)
                at += 1
        qd = torch.randn(3, HQ, D)
        lens = torch.tensor(seq) + 1
        got = sliding.window_decode(qd, k_buf, v_buf, r2t, torch.tensor(rows), lens, window, D ** -0.5)
        for i, (r, n) in enumerate(zip(rows, lens.tolist())):
            want = _window_reference(qd[i], k_tok(r, n), v_tok(r, n), n - 1, window, D ** -0.5)
            torch.testing.assert_close(got[i], want, atol=2e-5, rtol=2e-5)
    finally:
        sliding.GATHER_ELEMENTS = old


def test_key_rotation_weights_needs_the_loaded_model_and_a_fitting_plan():
    """`--oscar-key-rotation weights` (the default) reads the weights the model runner loaded: a
    runner without a model is refused at backend build, naming the fix; a plan of the wrong shape,
    or one installed after pages were written, is refused too."""
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    from oscar_sgl.config import OscarConfigError

    pool = pool_class_for(CFG, max_running_requests=4)(
        64, page_size=P, dtype=torch.float32, head_num=H, head_dim=D, layer_num=LAYERS, device="cpu",
        enable_memory_saver=False,
    )
    r2t = ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
    with pytest.raises(OscarConfigError, match="needs the loaded model.*--oscar-key-rotation all"):
        create_oscar_backend(SimpleNamespace(device="cpu", req_to_token_pool=r2t, token_to_kv_pool=pool))
    with pytest.raises(ValueError, match="2 layers of 2 flags"):
        pool.oscar_set_key_rotation([(True, False, True)] * LAYERS)
    pool.oscar_set_key_rotation([(True, False), (False, False)])
    summary = snapshot(pool)["key_rotation"]
    assert summary["rotated_heads"] == 1 and summary["heads"] == 4 and summary["kivi_layers"] == [1]
    assert summary["plan"] == [[1, 0], [0, 0]] and summary["rule"] == "weights"
    # a layer decided over other tensor-parallel ranks' heads too: mixed with no local head rotated
    pool.oscar_set_key_rotation([ref.LayerKeys((False, False), kivi=False), ref.LayerKeys((False, False), kivi=True)])
    assert snapshot(pool)["key_rotation"]["kivi_layers"] == [1]
    assert pool.layer_rotates_values(0) and pool.layer_scales_tokens(0) and not pool.layer_rotates_values(1)
    assert pool.paged_layer(0).key_rotated.tolist() == [0, 0] and pool.paged_layer(1).key_rotated is None
    with pytest.raises(ValueError, match="cannot be stored as KIVI"):
        ref.LayerKeys((True, False), kivi=True)


def test_the_backend_refuses_attention_it_would_not_compute():
    """At backend build, over the loaded model: a module with attention sinks (gpt-oss) or a
    soft-capping layer is refused; sliding-window layers are recorded (and shown in the snapshot).
    At a forward: any extra argument the model passes (`sinks=`) is refused by name, never ignored."""
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    from oscar_sgl.config import OscarConfigError

    def build(*modules):
        pool = pool_class_for(CFG, max_running_requests=4)(
            64, page_size=P, dtype=torch.float32, head_num=H, head_dim=D, layer_num=LAYERS, device="cpu",
            enable_memory_saver=False,
        )
        pool.oscar_set_key_rotation([(True,) * H] * LAYERS)
        r2t = ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
        model = torch.nn.ModuleList(modules)
        return pool, create_oscar_backend(SimpleNamespace(device="cpu", req_to_token_pool=r2t, token_to_kv_pool=pool,
                                                          model=model))

    attn = [RadixAttention(HQ, D, D ** -0.5, H, layer_id=0, sliding_window_size=15),
            RadixAttention(HQ, D, D ** -0.5, H, layer_id=1)]
    pool, backend = build(*attn)
    assert snapshot(pool)["sliding_window_layers"] == {"0": 15}
    sinks = torch.nn.Module()
    sinks.sinks = torch.nn.Parameter(torch.zeros(HQ), requires_grad=False)
    with pytest.raises(OscarConfigError, match="must not have attention sinks with --kv-cache oscar, got 2.sinks"):
        build(*attn, sinks)
    with pytest.raises(OscarConfigError, match="logit_cap=30.0 at layer 1"):
        build(attn[0], RadixAttention(HQ, D, D ** -0.5, H, layer_id=1, logit_cap=30.0))
    q = torch.zeros(1, HQ * D)
    kv = torch.zeros(1, H, D)
    fb = _batch(0, torch.zeros(1, dtype=torch.int64), 0, 1)
    with pytest.raises(OscarConfigError, match="passes sinks at layer 0, which --kv-cache oscar does not compute"):
        backend.forward_extend(q, kv, kv, attn[0], fb, sinks=torch.zeros(HQ))
    with pytest.raises(OscarConfigError, match="passes sinks at layer 1"):
        backend.forward_decode(q, kv, kv, attn[1], fb, sinks=torch.zeros(HQ))


def test_cell_size_and_snapshot():
    pool, *_ = _setup()
    s = snapshot(pool)
    assert s["kv_bytes_per_token"] == CFG.bytes_per_token(H, D) * LAYERS
    assert s["compression_ratio"] == pytest.approx(2 * H * D * 2 / CFG.bytes_per_token(H, D))
    assert s["pages"]["free"] == pool.num_pages - 1


def test_staging_reserve_covers_the_staging_the_pool_allocates():
    """The bytes the pool sizer charges for staging (plugin hook on DefaultPoolConfigurator) are at
    least what the pool allocates, so a GPU server never allocates staging on top of its budget."""
    from oscar_sgl.sglang.pool import staging_bytes_upper_bound

    for max_tokens in (256, 4096):
        pool, *_ = _setup(max_tokens)
        allocated = sum(t.numel() * t.element_size() for t in pool.stage_k + pool.stage_v)
        allocated += sum(t.numel() * t.element_size() for t in (pool.stage_scale or []))
        # the one-layer scratch of direct seals
        allocated += sum(t.numel() * t.element_size() for t in (pool.scratch_k, pool.scratch_v, pool.scratch_scale)
                         if t is not None)
        reserve = staging_bytes_upper_bound(CFG, num_kv_heads=H, head_dim=D, num_layers=LAYERS,
                                            max_running_requests=4, max_prefill_tokens=None, element_size=4)
        assert allocated <= reserve
        if pool.num_staging < pool.num_pages and pool.stage_scale is None:
            # Not capped by the page count: exact, but for the token scales only the kernel path stages.
            assert reserve - allocated == P * 4 * CFG.scale_columns(H) * (LAYERS * (pool.num_staging + 1)
                                                                         + pool.num_scratch)


def test_pool_sizer_charges_the_staging_reserve():
    """The hook adds the reserve to SGLang's fixed overhead (the bias subtracted before sizing)."""
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    from oscar_sgl.sglang import plugin

    hooks = [fn for target, kind, fn in plugin.HOOKS
             if target.endswith("DefaultPoolConfigurator.__init__") and kind == "AFTER"]
    assert len(hooks) == 1
    from oscar_sgl.sglang.plugin import SERVER_ARGS_ATTR

    args = SimpleNamespace(**{SERVER_ARGS_ATTR: CFG.to_dict()}, max_running_requests=4, max_prefill_tokens=None,
                           chunked_prefill_size=None)
    kvc = SimpleNamespace(server_args=args, kv_cache_dtype=torch.bfloat16,
                          model_config=SimpleNamespace(get_num_kv_heads=lambda tp: H, head_dim=D),
                          layer_info=SimpleNamespace(num_effective_layers=LAYERS))
    conf = object.__new__(DefaultPoolConfigurator)
    conf._fixed_overhead_bytes = 1000
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(attn_tp_size=1):  # what a single-rank server publishes
        hooks[0](None, conf, kvc)
    from oscar_sgl.sglang.pool import staging_bytes_upper_bound

    want = staging_bytes_upper_bound(CFG, num_kv_heads=H, head_dim=D, num_layers=LAYERS, max_running_requests=4,
                                     max_prefill_tokens=None, element_size=2)
    assert conf._fixed_overhead_bytes == 1000 + want


def test_plain_reads_fail_loudly():
    pool, *_ = _setup()
    with pytest.raises(NotImplementedError, match="packed"):
        pool.get_key_buffer(0)
    with pytest.raises(NotImplementedError, match="retraction"):
        pool.get_cpu_copy(torch.arange(4))

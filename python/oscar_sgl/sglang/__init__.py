"""The SGLang glue of OScaR: the only place in `oscar_sgl` that imports `sglang`, always lazily.

- `plugin.register` — the `sglang.srt.plugins` entry point: adds `--kv-cache {default,oscar}` and
  the `--oscar-*` flags to `python -m sglang.launch_server`, and registers the hooks below.
- `step.OscarStep` — the one owner of a step's state: runtime handle, event batch, page maps, seal
  plans, CUDA-graph plan (the allocator records into it, the pool writes and seals by it, the
  backend begins it).
- `pool.OscarKVPool` — packed INT2/INT4 codes + fp16 params + fp32 token scales per page, BF16
  staging for open pages (docs/LAYOUT.md §3, docs/OSCAR.md §4).
- `backend.OscarAttnBackend` — the `oscar` attention backend (torch reference on CPU).
- `metrics` — compression ratio, pages by state, seals and staging use, per TP rank, as of after
  the last step.

What is supported where, and the startup checks: `oscar_sgl.supported`. SGLang's classes are
subclassed through module-level mixins resolved once (`classes.sglang_subclass`).

Importing this package imports nothing from SGLang or torch.
"""

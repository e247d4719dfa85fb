"""``OSCAR_SGL_COMPILE_LOG=FILE``: log every Triton compile of a process, one JSON line each.

Triton compiles a kernel the first time it meets a new specialization (constexprs, the 16-byte
alignment of pointers, integers equal to 1 or divisible by 16); in a server that is a stall of
seconds in the middle of a step unless it happened at startup. With the variable set, the SGLang
plugin (``oscar_sgl.sglang.plugin.register``, run in every SGLang process) installs a Triton
compilation listener that appends ``{"kernel", "cache_hit", "seconds", "time", "pid", "constants"}``
per compile (``seconds``: Triton's own timing of the compile; ``time``: Unix time when it ended) to
FILE, so a startup or a slow first request can be attributed (``summarize``; the serving
benchmark's ``--compile-log``). Triton's cache hits are logged too (``cache_hit`` true: loaded, not
compiled). Without the variable nothing is installed.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ENV = "OSCAR_SGL_COMPILE_LOG"

_installed: str | None = None


def install_from_env() -> bool:
    """Install the listener when ``OSCAR_SGL_COMPILE_LOG`` names a file (once per process; a listener
    already set is called after ours). Returns whether one is installed."""
    global _installed
    path = os.environ.get(ENV)
    if not path:
        return False
    if _installed == path:
        return True
    try:
        from triton import knobs
    except ImportError:  # no Triton, or one without knobs: nothing to log
        return False
    comp = getattr(knobs, "compilation", None)
    if comp is None or not hasattr(comp, "listener"):
        return False
    previous = comp.listener

    def listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
        try:
            consts = getattr(src, "constants", None) or {}
            rec = {"kernel": str(getattr(src, "name", src)), "cache_hit": bool(cache_hit),
                   "seconds": round(getattr(times, "total", 0) / 1e6, 4), "time": time.time(), "pid": os.getpid(),
                   "constants": {str(k): repr(v) for k, v in consts.items()}}
            with open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        except Exception:  # noqa: BLE001  (a log line must never fail a compile)
            pass
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

    comp.listener = listener
    _installed = path
    return True


def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a compile log (lines that do not parse are skipped)."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def summarize(records: list[dict[str, Any]], *, split_at: float | None = None) -> dict[str, Any]:
    """Compiles (cache misses) and cache hits: count and seconds per kernel, in total and, with
    ``split_at`` (a Unix time, e.g. when the server was ready), before and after it."""

    def table(recs: list[dict[str, Any]]) -> dict[str, Any]:
        per: dict[str, list[float]] = defaultdict(list)
        for r in recs:
            if not r.get("cache_hit"):
                per[r["kernel"]].append(float(r.get("seconds", 0.0)))
        kernels = {k: {"compiles": len(v), "seconds": round(sum(v), 2)} for k, v in per.items()}
        kernels = dict(sorted(kernels.items(), key=lambda kv: -kv[1]["seconds"]))
        return {"compiles": sum(v["compiles"] for v in kernels.values()),
                "seconds": round(sum(v["seconds"] for v in kernels.values()), 2),
                "cache_hits": sum(1 for r in recs if r.get("cache_hit")), "kernels": kernels}

    res = {"all": table(records)}
    if split_at is not None:
        res["before"] = table([r for r in records if r.get("time", 0) <= split_at])
        res["after"] = table([r for r in records if r.get("time", 0) > split_at])
    return res

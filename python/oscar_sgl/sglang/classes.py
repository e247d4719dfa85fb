"""The one way this package subclasses SGLang's classes without importing SGLang at import time.

Each OScaR class is a module-level mixin (``OscarKVPoolMixin``, ``OscarPagedAllocatorMixin``,
``OscarAttnBackendMixin``) written against one SGLang base class; :func:`sglang_subclass` resolves
the base on first use and returns ``class Name(Mixin, Base)``, once per process.
"""

from __future__ import annotations

import functools
import importlib

__all__ = ["sglang_subclass"]


@functools.cache
def sglang_subclass(mixin: type, base: str, name: str) -> type:
    """``class name(mixin, <base>)`` where ``base`` is SGLang's class as ``"module.Class"``."""
    module, attr = base.rsplit(".", 1)
    base_cls = getattr(importlib.import_module(module), attr)
    return type(name, (mixin, base_cls), {"__module__": mixin.__module__, "__qualname__": name,
                                          "__doc__": mixin.__doc__})

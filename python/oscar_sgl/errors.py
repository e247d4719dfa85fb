"""Every exception oscar_sgl raises on purpose: `OscarConfigError` for a configuration OScaR cannot
run (see `oscar_sgl.supported`), and those of the Rust core, with the one table that maps its
errors to them.

Every class subclasses a built-in, so code that catches ``ValueError`` / ``MemoryError`` /
``RuntimeError`` (a server's ``except Exception`` included) keeps working, and ``OscarCoreError``
catches them all. The Rust binding calls :func:`from_core` with the error's kind; nothing else maps
Rust errors.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = [
    "EventError",
    "OscarConfigError",
    "InvariantViolation",
    "LayoutError",
    "OscarCoreError",
    "StagingExhausted",
    "from_core",
]


class OscarConfigError(ValueError):
    """A configuration, flag or model OScaR cannot run with (`oscar_sgl.supported`), raised at the
    earliest point that knows enough: flag parsing, model load, pool build. Its message starts with
    the flag or property at fault."""


class OscarCoreError(Exception):
    """Base of every error raised by ``oscar_sgl._core``.

    Attributes:
        kind: the core's error kind (``"layout"``, ``"event"``, ``"staging_exhausted"``, ``"invariant"``).
        details: the error's fields (page, event index, ...), possibly empty.
    """

    kind: str = ""

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details: dict[str, Any] = dict(details or {})


class LayoutError(OscarCoreError, ValueError):
    """A bad shape, bit width, group size, buffer length or non-finite value (packer, planner, or
    runtime configuration)."""

    kind = "layout"


class EventError(OscarCoreError, ValueError):
    """A malformed event batch (unknown opcode, truncated record, page id out of range). Nothing of
    the batch was applied."""

    kind = "event"

    @property
    def at(self) -> int | None:
        """Word offset in the ops array."""
        return self.details.get("at")


class _AtPage(OscarCoreError):
    """An error about one page, raised while applying one event of a batch."""

    @property
    def page(self) -> int | None:
        return self.details.get("page")

    @property
    def event(self) -> int | None:
        """Index of the event in its batch."""
        return self.details.get("event")


class StagingExhausted(_AtPage, MemoryError):
    """No free BF16 staging page for a page that opens: the staging pool is smaller than the number
    of pages open at once. Events before ``event`` were applied."""

    kind = "staging_exhausted"


class InvariantViolation(_AtPage, RuntimeError):
    """A page-runtime invariant does not hold (a page sealed twice or written after sealing, a
    locked page released, a staging slot leaked, ...): a bug, never an expected condition."""

    kind = "invariant"

    @property
    def violation(self) -> str | None:
        """Which invariant: ``"write_sealed"``, ``"release_locked"``, ``"double_free"``, ..."""
        return self.details.get("violation")


_BY_KIND: dict[str, type[OscarCoreError]] = {
    cls.kind: cls for cls in (LayoutError, EventError, StagingExhausted, InvariantViolation)
}


def from_core(kind: str, message: str, details: Mapping[str, Any] | None = None) -> OscarCoreError:
    """The exception for one Rust error (called by the binding; an unknown kind is a packaging bug)."""
    cls = _BY_KIND.get(kind)
    if cls is None:
        raise AssertionError(f"oscar_sgl._core raised an unknown error kind {kind!r}: {message}")
    return cls(message, details)

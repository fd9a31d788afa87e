"""The contracts speculators 0.3.0's generator relies on, one module each, in the order its run meets them.

Each module holds the contract's statement (`CONTRACT`), its probe (`probe(ctx)`), and its shim
(`apply(ns, current, state)` for the driver side, `apply_worker(...)`/`accepting` for the worker side).
"""

from __future__ import annotations

from importlib import import_module

MODULES = (
    "scheduler_config", "memory", "kv_helpers", "scheduler", "request", "prefix_cache",
    "rpc", "twophase", "kimi_stack", "eagle3", "embed", "layers",
)
#: Contracts probed once per vLLM; the others once per model architecture.
PER_MODEL = ("kimistack", "eagle3", "embed", "layer")


def modules() -> list:
    return [import_module(f"harness.contracts.{m}") for m in MODULES]


def driver_contracts() -> list:
    """Modules whose shim rewrites a name in speculators' generator module."""
    return [m for m in modules() if hasattr(m, "apply")]


def by_id() -> dict:
    return {m.CONTRACT.id: m for m in modules()}

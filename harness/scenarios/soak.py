"""The soak scenario: one generator, many calls of sizes that grow, shrink, straddle step budgets and repeat, as a
training team's extraction loop makes them.

The suites otherwise prove the shims on fixed batches; state that assumes the first batch is the largest (the
hand-off buffer's growth, pinned on CUDA) only breaks on a later, larger one (seen on the H200: the fourth call
of 4x64, 16x1500, 4x64, 32x2000 killed the worker). Each call is checked: rows = tokens for every prompt and
layer, each prompt's rows equal to the same prompt extracted alone (within `bound`), no worker replaced, and
memory (host RSS of this process and the workers, less what this check itself keeps; device memory reserved by
each worker) read after the call.
One call is preceded by a refused one (a token outside the vocabulary) that must leave the generator usable.

Two distances from the prompt alone are kept per call. The mean absolute difference decides whether a prompt's
rows are its own: rows of another prompt, or out of order, differ by the states' whole spread. The maximum is
the engine's batch variance; `strict` holds it to the bound too (float32 on CPU, TRITON_ATTN in bf16 are
bitwise). Where it is not held, it is reported: on the H200, tiny Kimi-K2.5 on TRITON_MLA in bf16 differs from
itself alone by up to ~2.6 at 1,500-token prompts, from row ~130 on, not at chunk boundaries, and as far from
transformers' float32 when extracted alone (benchmarks/gpu_chunk_boundary.py): MLA kernel numerics, not the
harness's placement.
Memory is flat when no reading after the warm-up exceeds the peak up to it by more than `FLAT_SLACK` (relative)
plus `FLAT_BYTES`. The warm-up ends once both extremes have run: the largest batch (most tokens) and the longest
prompt (extracted alone, it needs attention workspace no batch of shorter prompts does: on an H100 and an H200
alike, tiny Kimi-K2.5 on TRITON_MLA reserved 463 MiB more for it than for the 64,000-token batch). A caching
allocator grows once per new extreme; a leak keeps growing after both.
On the device, flat is judged on the bytes live tensors hold (a leak holds them); the bytes the caching allocator
reserves are reported beside them, since they also grow with fragmentation when batch shapes vary.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass, field

#: How far a reading after warm-up may rise above the warm-up peak before memory counts as growing.
FLAT_SLACK = 0.05
FLAT_BYTES = 64 << 20


@dataclass
class Plan:
    """The calls (each a batch of prompts, drawn from a pool so that prompts repeat) and which one a refused call
    precedes."""

    seed: int
    calls: list[list[list[int]]]
    refused_before: int  # index of the call preceded by a refused one


def plan(
    seed: int,
    n_calls: int,
    vocab_size: int,
    max_model_len: int,
    step_budget: int,
    max_prompts: int,
    opening: tuple[tuple[int, int], ...] = (),
) -> Plan:
    """`opening` calls first ((prompts, tokens each)), then random calls; at least one prompt of exactly
    `max_model_len - 1` tokens, some calls over `step_budget` tokens (several steps), repeats of earlier prompts."""
    rng = random.Random(seed)
    longest = max_model_len - 1
    pool: list[list[int]] = []

    def fresh(n: int) -> list[int]:
        p = [rng.randrange(vocab_size) for _ in range(n)]
        pool.append(p)
        return p

    calls = [[fresh(length) for _ in range(count)] for count, length in opening]
    while len(calls) < n_calls:
        i = len(calls)
        count = rng.randint(1, max_prompts)
        if i % 5 == 0:  # over one step's budget (by a quarter at least): several scheduler steps
            want = step_budget * 5 // 4
            count = min(max_prompts, max(count, -(-want // longest)))
            length = min(longest, -(-want // count))
            lengths = [length] * count
        else:
            lengths = [
                rng.randint(1, longest) if rng.random() < 0.2 else rng.randint(1, max(1, longest // 8))
                for _ in range(count)
            ]
        batch = [rng.choice(pool) if pool and rng.random() < 0.3 else fresh(n) for n in lengths]
        calls.append(batch)
    calls[min(len(calls) - 1, len(opening) + 1)][0] = fresh(longest)  # exactly max_model_len - 1 tokens
    return Plan(seed, calls, refused_before=min(len(calls) - 1, len(opening) + 2))


@dataclass
class Call:
    prompts: int
    tokens: int
    seconds: float
    rows_ok: bool
    max_diff_alone: float
    mean_diff_alone: float
    host_rss: int
    device: list[tuple[int, int] | None]  # per rank: (allocated, reserved) bytes
    longest: int = 0  # tokens of the call's longest prompt


@dataclass
class Soak:
    seed: int
    calls: list[Call] = field(default_factory=list)
    refused: str | None = None  # the refused call's error, one line
    workers_before: list[int] = field(default_factory=list)
    workers_after: list[int] = field(default_factory=list)
    bound: float = 0.0
    strict: bool = True
    failures: list[str] = field(default_factory=list)

    @property
    def warmup(self) -> int:
        """Index of the call by which both extremes have run: the largest batch (by tokens), the longest prompt."""
        most, longest = max(c.tokens for c in self.calls), max(c.longest for c in self.calls)
        return max(
            next(i for i, c in enumerate(self.calls) if c.tokens == most),
            next(i for i, c in enumerate(self.calls) if c.longest == longest),
        )

    def growth(self) -> dict:
        """Peaks up to and after warm-up, host and device, and whether memory stayed flat."""
        w = self.warmup

        def peaks(values):
            before, after = max(values[: w + 1]), max(values[w + 1 :], default=0)
            return before, after, after <= before * (1 + FLAT_SLACK) + FLAT_BYTES

        host = peaks([c.host_rss for c in self.calls])
        per_rank = list(zip(*[c.device for c in self.calls], strict=True)) if self.calls else []
        ranks = [r for r in per_rank if all(v is not None for v in r)]
        held = [peaks([v[0] for v in r]) for r in ranks]
        reserved = [peaks([v[1] for v in r]) for r in ranks]
        return {
            "warmup_call": w,
            "host_peak_warmup": host[0],
            "host_peak_after": host[1],
            "host_flat": host[2],
            "device_peak_warmup": [d[0] for d in held],
            "device_peak_after": [d[1] for d in held],
            "device_flat": all(d[2] for d in held),
            **(
                {
                    "device_reserved_peak_warmup": [d[0] for d in reserved],
                    "device_reserved_peak_after": [d[1] for d in reserved],
                    "device_mib": [
                        [[v[0] >> 20, v[1] >> 20] if v is not None else None for v in c.device] for c in self.calls
                    ],
                }
                if ranks
                else {}
            ),
        }

    @property
    def ok(self) -> bool:
        return self._ok(self.growth())

    def _ok(self, growth: dict) -> bool:
        # a refusal that did not happen is among the failures (run)
        return (
            not self.failures
            and self.workers_before == self.workers_after
            and growth["host_flat"]
            and growth["device_flat"]
        )

    def to_json(self) -> dict:
        g = self.growth()
        return {
            "seed": self.seed,
            "calls": len(self.calls),
            "refused": self.refused,
            "bound": self.bound,
            "workers_restarted": self.workers_before != self.workers_after,
            "failures": self.failures[:10],
            "tokens_per_call": [c.tokens for c in self.calls],
            "max_diff_alone": max((c.max_diff_alone for c in self.calls), default=None),
            "mean_diff_alone": max((c.mean_diff_alone for c in self.calls), default=None),
            "max_held_to_bound": self.strict,
            "calls_over_bound_max": sum(c.max_diff_alone > self.bound for c in self.calls),
            "seconds": round(sum(c.seconds for c in self.calls), 2),
            **g,
            "ok": self._ok(g),
        }


def _host_rss(worker_pids: list[int]) -> int:
    import psutil

    total = 0
    for pid in [None, *worker_pids]:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return total


def _against_alone(gen, batch, results, alone: dict[tuple, list]) -> tuple[float, float, int]:
    """The largest and the largest mean difference of each prompt's rows from the prompt extracted alone (each
    prompt extracted alone once, kept in `alone`), and how many bytes the newly kept alone results hold."""
    worst = mean = 0.0
    held = 0
    for q, r in zip(batch, results, strict=True):
        key = tuple(q)
        if key not in alone:
            alone[key] = [h.clone() for h in gen.generate([q])[0]["hidden_states"]]
            held += sum(h.numel() * h.element_size() for h in alone[key])
        for a, h in zip(alone[key], r["hidden_states"], strict=True):
            d = (a.float() - h.float()).abs()
            worst, mean = max(worst, float(d.max())), max(mean, float(d.mean()))
    return worst, mean, held


def run(gen, p: Plan, bound, strict: bool = True) -> Soak:
    """Run the plan on `gen` (a HarnessGenerator); `bound(tensors)` is the alone-vs-batch tolerance, for the mean
    difference always and for the maximum when `strict`."""
    from harness.runtime.executor_view import worker_procs
    from harness.runtime.inputs import HarnessInputError

    workers = lambda: [proc.pid for _, proc in worker_procs(gen.real_executor)]  # noqa: E731
    out = Soak(p.seed, workers_before=workers(), strict=strict)
    alone: dict[tuple, list] = {}
    held = 0  # bytes of the alone results this check keeps: not the generator's memory, left out of the reading
    for i, batch in enumerate(p.calls):
        if i == p.refused_before:
            try:
                gen.generate([[0, gen.vocab_size]])
                out.failures.append("a token id outside the vocabulary was accepted")
            except HarnessInputError as exc:
                out.refused = str(exc).splitlines()[0]
        t0 = time.perf_counter()
        results = gen.generate(batch)
        seconds = time.perf_counter() - t0
        rows_ok = all(
            int(h.shape[0]) == len(q) for q, r in zip(batch, results, strict=True) for h in r["hidden_states"]
        )
        if not rows_ok or len(results) != len(batch):
            out.failures.append(f"call {i}: rows differ from tokens")
        worst, mean, kept = _against_alone(gen, batch, results, alone)
        held += kept
        tol = bound([h for r in results for h in r["hidden_states"]])
        out.bound = max(out.bound, tol)
        if mean > tol:
            out.failures.append(
                f"call {i}: a prompt's rows are not its own: mean difference from itself alone {mean:.3g} > {tol:.3g}"
            )
        elif strict and worst > tol:
            out.failures.append(f"call {i}: a prompt differs from itself extracted alone by {worst:.3g} > {tol:.3g}")
        device = gen.real_executor.collective_rpc("_harness_device_memory")
        out.calls.append(
            Call(
                len(batch),
                sum(map(len, batch)),
                seconds,
                rows_ok,
                worst,
                mean,
                _host_rss(out.workers_before) - held,
                list(device),
                max(map(len, batch)),
            )
        )
    out.workers_after = workers()
    if out.refused is None and p.refused_before < len(p.calls):
        out.failures.append("the refused call was not refused")
    return out

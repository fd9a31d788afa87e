"""Which module makes a model's states differ when the same batch runs twice.

The GPU tier asks for the same batch twice to give the same states bit for bit. When it does not, the states only say
that something in the forward is not deterministic; a report must say what. This records, in the worker, every call
of the token embedding and of each decoder layer's parts, down to the leaves (norms, projections, attention, the
MLP's router gate, routed and shared experts): a digest of the call's tensor inputs and its output. Two runs of the
same batch are then compared call by call: the first call whose inputs were equal but whose output was not is the
module that broke determinism (every later difference may only be its consequence).

The same comparison says why a prompt's states change with the rest of its batch: the prompt is run alone, then in
a batch, and only its rows are recorded (the embedding finds them by the prompt's token ids: a runner may place a
prompt anywhere in its batch); the first module whose rows changed on equal input rows is the one that made the
states depend on the batch. Inputs are digested before each call, outputs after it: a module that writes into its
inputs (vLLM's fused residual-add norms do) is judged on the inputs it was given.

    install(worker, rows=None, prompt=None) -> hooks on the model in that worker (through the generator's
                        `_harness_call` RPC); with `rows` or `prompt`, each row tensor is cut to those rows (`Window`)
    collect(worker)   -> the calls recorded since install kept in the worker, hooks removed; how many
    compare(worker)   -> first_divergence of the last two recordings, computed there (no tensors cross the RPC)
    first_divergence(a, b) -> the culprit (pure; unit-tested on CPU)
"""

from __future__ import annotations

import hashlib
from typing import Any

#: What makes a module a decoder layer (vLLM's names across model families); every part below one is recorded.
LAYER_PARTS = ("self_attn", "mlp")
#: The token embedding (vLLM's name across model families), watched too: its input ids say where a prompt's rows are
#: in each forward (`Window.locate`).
EMBEDDING = "embed_tokens"
#: Output tensors kept whole (on the host) for at most this many calls; later calls keep only their digest.
KEEP_TENSORS = 64


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def digest(value) -> str:
    """sha256 of every tensor's bytes in `value` (a tensor, or containers of them), with shapes and dtypes."""
    import torch

    h = hashlib.sha256()
    for t in _tensors(value):
        h.update(f"{tuple(t.shape)}{t.dtype};".encode())
        h.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def modules_to_watch(model) -> list[tuple[str, object]]:
    """(name, module) for each decoder layer's parts, down to the leaves (norms, projections, rotary embedding,
    attention, activation; the MLP's gate, experts and shared experts), so the module named is the innermost one:
    a norm between two blocks is watched, not only the blocks around it."""
    found = []
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == EMBEDDING:  # its input rows are the prompt's token ids: were they first?
            found.append((name, module))
        if not all(hasattr(module, part) for part in LAYER_PARTS):
            continue
        found += [(f"{name}.{sub}", child) for sub, child in module.named_modules() if sub and _called(child)]
    return found


def _called(module) -> bool:
    """A part the forward calls (containers such as ModuleList have no forward of their own)."""
    import torch

    return not isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict))


class Window:
    """Which rows of each forward are recorded: all of them; the first `rows`; or, given the prompt's token ids,
    wherever the token embedding finds them in the forward's input ids (a batch's runner may place a prompt
    anywhere among its rows). A forward whose ids do not hold the prompt is not recorded."""

    def __init__(self, rows: int | None = None, prompt: list[int] | None = None):
        self.prompt = list(prompt) if prompt is not None else None
        self.rows = len(self.prompt) if self.prompt is not None else rows
        self.start: int | None = 0
        self.tokens: int | None = None  # the forward's row count, where the embedding saw it

    def locate(self, ids) -> None:
        """(The embedding's pre-hook.) Where the prompt's ids start in this forward's `ids`; None where absent."""
        import torch

        if self.prompt is None or not isinstance(ids, torch.Tensor) or ids.dim() != 1:
            return
        self.tokens = ids.shape[0]
        n = len(self.prompt)
        if n > ids.shape[0]:
            self.start = None
            return
        pattern = torch.tensor(self.prompt, dtype=ids.dtype, device=ids.device)
        hits = (ids.unfold(0, n, 1) == pattern).all(dim=1).nonzero()
        self.start = int(hits[0]) if hits.numel() else None

    @property
    def recording(self) -> bool:
        return self.start is not None

    def cut(self, value):
        """`value` with each of its row tensors cut to the window (a tensor is a row tensor where its first dimension
        is the forward's row count, or, that unknown, at least the window's end)."""
        import torch

        if self.rows is None or self.start is None:
            return value
        if isinstance(value, torch.Tensor):
            end = self.start + self.rows
            rowed = value.dim() and (value.shape[0] == self.tokens if self.tokens else value.shape[0] >= end)
            return value[self.start : end] if rowed else value
        if isinstance(value, (list, tuple)):
            return [self.cut(v) for v in value]
        if isinstance(value, dict):
            return {k: self.cut(v) for k, v in value.items()}
        return value


def record_into(calls: list, name: str, module, window: Window | None = None):
    """Hooks that append (name, class, input digest, output digest, output kept or None) to `calls` for each call of
    `module`, of the window's rows only. The inputs are digested before the call: vLLM's fused norms write their
    result into their inputs, so digested after it they would look changed by the module itself."""
    window = window or Window()
    pending: list = []  # inputs' digests of the calls under way (a module may be re-entered)
    embedding = name.rsplit(".", 1)[-1] == EMBEDDING

    def before(mod, args, kwargs):
        if embedding and args:
            window.locate(args[0])
        pending.append(digest(window.cut((args, kwargs))) if window.recording else None)

    def after(mod, args, kwargs, output):
        inputs = pending.pop()
        if inputs is None:
            return
        outs = _tensors(window.cut(output))
        kept = [t.detach().float().cpu() for t in outs] if len(calls) < KEEP_TENSORS else None
        calls.append(
            {"module": name, "class": type(mod).__name__, "inputs": inputs, "output": digest(outs), "kept": kept}
        )

    return [
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after, with_kwargs=True),
    ]


def install(worker, rows: int | None = None, prompt: list[int] | None = None) -> int:
    """(Runs on a worker.) Hooks on its model's watched modules, recording the first `rows` rows, or the rows where
    the embedding finds `prompt`'s token ids; returns how many modules."""
    from harness.gpu.tier import loaded_model

    model = loaded_model(worker)
    calls: list = []
    window = Window(rows, prompt)
    watched = modules_to_watch(model)
    handles = [h for name, module in watched for h in record_into(calls, name, module, window)]
    worker._harness_determinism = (calls, handles)
    return len(watched)


def collect(worker) -> int:
    """(Runs on a worker.) The calls recorded since `install` kept as the worker's latest recording (the one before
    it kept too); the hooks are removed. Returns how many calls."""
    calls, handles = getattr(worker, "_harness_determinism", ([], []))
    for h in handles:
        h.remove()
    worker._harness_determinism = ([], [])
    worker._harness_recordings = (getattr(worker, "_harness_recordings", ([], []))[-1], list(calls))
    return len(calls)


def compare(worker, calls: int | None = None) -> dict:
    """(Runs on a worker.) `first_divergence` of its last two recordings (of their first `calls` calls); the
    recordings are dropped."""
    first, second = getattr(worker, "_harness_recordings", ([], []))
    worker._harness_recordings = ([], [])
    return first_divergence(first[:calls], second[:calls])


def first_divergence(first: list[dict], second: list[dict]) -> dict:
    """Compare two recordings of the same batch call by call: `culprit` is the first call with equal inputs and
    different outputs (None where every output matched or the runs made different calls), with how many calls
    were compared and how many differed."""
    out: dict[str, Any] = {
        "calls": min(len(first), len(second)),
        "same_calls": [c["module"] for c in first] == [c["module"] for c in second],
        "differing": 0,
        "culprit": None,
        "first_inputs_equal": bool(first and second and first[0]["inputs"] == second[0]["inputs"]),
    }
    for a, b in zip(first, second, strict=False):
        if a["output"] == b["output"]:
            continue
        out["differing"] += 1
        if "first_differing" not in out:  # where the difference is first seen, and whether it came in with the inputs
            out["first_differing"] = {
                "module": a["module"],
                "class": a["class"],
                "inputs_equal": a["inputs"] == b["inputs"],
            }
        if out["culprit"] is None and a["inputs"] == b["inputs"]:
            out["culprit"] = {"module": a["module"], "class": a["class"], "max_abs_diff": _kept_diff(a, b)}
    if out["culprit"] is None and out["differing"]:
        out["culprit_note"] = "outputs differ only where inputs already differed before the first recorded call"
    return out


def _kept_diff(a: dict, b: dict) -> float | None:
    if a["kept"] is None or b["kept"] is None:
        return None
    return max(
        (float((x - y).abs().max()) for x, y in zip(a["kept"], b["kept"], strict=False) if x.shape == y.shape),
        default=None,
    )


def diagnose(generator, prompts) -> dict:
    """Run `prompts` twice through the generator with the hooks on rank 0's model; `first_divergence` of the two."""
    view = generator.real_executor
    for _ in range(2):
        watched = view.collective_rpc("_harness_call", args=(install,))[0]
        try:
            generator.generate(prompts)
        finally:
            view.collective_rpc("_harness_call", args=(collect,))
    result = view.collective_rpc("_harness_call", args=(compare,))[0]
    result["watched_modules"] = watched
    return result


def alone_vs_batch(generator, prompt: list[int], others: list[list[int]]) -> dict:
    """Why `prompt`'s states change with its batch: it runs alone, then in `prompt + others`, with only its rows
    recorded in rank 0's model (found by its token ids in each forward), and `first_divergence` of the two first
    forwards that held it names the first module whose rows changed on equal input rows."""
    view = generator.real_executor
    rows = len(prompt)
    for batch in ([prompt], [prompt, *others]):
        watched = view.collective_rpc("_harness_call", args=(install, None, list(prompt)))[0]
        try:
            generator.generate(batch)
        finally:
            view.collective_rpc("_harness_call", args=(collect,))
    result = view.collective_rpc("_harness_call", args=(compare, watched))[0]  # each watched module once: one forward
    result.update(watched_modules=watched, prompt_tokens=rows, batch_prompts=1 + len(others))
    return result

"""Whose fault is a broken end-to-end cell? The same model through plain vLLM, without speculators.

Where the expectations say a vLLM build computes a tiny model wrongly (`e2e[model] = broken`), the harness
must show that the fault is vLLM's, not its shims': it runs the model through vLLM's public `LLM(...)`
(no speculators, no harness shims), asks for the prompt logprobs, and compares them with transformers'
float32 log-softmax over the same checkpoint. Plain vLLM wrong too -> the build computes the model
wrongly; plain vLLM right -> the shim path is at fault (a bug of ours). Plain vLLM not starting the model
is the build's failure as well, and says so with its error.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.contracts.base import Attempt, summarize

#: Prompt logprobs of a correct build agree with transformers' float32 ones to ~1e-5 on the tiny models;
#: a build that computes the model wrongly (hidden states off by ~1) is off by far more.
AGREE = 1e-3


@dataclasses.dataclass
class Verdict:
    started: Attempt
    max_abs_diff: float | None = None  # plain vLLM's prompt logprobs vs transformers'

    @property
    def fixture_refused(self) -> bool:
        """The start failed inside the harness's own tiny-model stand-in code (a limit of our fixture)."""
        from harness.subjects.models import TEXT_ONLY_REFUSAL

        return not self.started.ok and TEXT_ONLY_REFUSAL in (self.started.error or "")

    @property
    def vllm_wrong(self) -> bool:
        if self.fixture_refused:
            return False
        return not self.started.ok or (self.max_abs_diff is not None and self.max_abs_diff > AGREE)

    def says(self, architecture: str, speculators_cause: str | None = None) -> str:
        """Whose fault; `speculators_cause` is why speculators' own path gives no right states for this model (the
        admission's refusal, or the root row of a start that failed), read from that failure: then plain vLLM
        agreeing makes the cell speculators'."""
        import os

        how = (
            " (run with VLLM_MLA_DISABLE=1: this build cannot run MLA)"
            if os.environ.get("VLLM_MLA_DISABLE") == "1"
            else ""
        )
        if speculators_cause and self.started.ok and not self.vllm_wrong:
            return (
                f"speculators is at fault: plain vLLM (no speculators) agrees with transformers (eager attention) "
                f"on {architecture} ({self.max_abs_diff:.2g} in prompt logprobs), while {speculators_cause}"
            ) + how
        return self._says(architecture) + how

    def _says(self, architecture: str) -> str:
        if self.fixture_refused:
            return (
                f"the harness's tiny fixture is at fault: plain vLLM (no speculators) asks the fixture's text-only "
                f"stand-in processor about media while starting {architecture}, and the stand-in refuses "
                f"({self.started.text[:200]})"
            )
        if not self.started.ok:
            return f"plain vLLM (no speculators) does not start {architecture} either: {self.started.text[:300]}"
        if self.vllm_wrong:
            return (
                f"vLLM CPU build computes {architecture} wrongly: plain vLLM (no speculators) differs from "
                f"transformers by {self.max_abs_diff:.3g} in prompt logprobs (agreement bound {AGREE:g})"
            )
        return (
            f"plain vLLM (no speculators) agrees with transformers ({self.max_abs_diff:.2g} in prompt logprobs): "
            f"the harness's shim path is at fault"
        )


def _engine_kwargs(model, max_model_len: int) -> dict:
    """LLM(...) keywords for a tiny model, text-only for multimodal wrappers (as the harness's Options do)."""
    from vllm.engine.arg_utils import EngineArgs

    kwargs = dict(
        model=str(model.path),
        dtype="float32",
        max_model_len=max_model_len,
        enforce_eager=True,
        enable_prefix_caching=False,
        trust_remote_code=True,
        seed=0,
    )
    if (model.run_options or {}).get("language_model_only"):
        from harness.runtime.generator import text_only_kwargs

        kwargs.update(text_only_kwargs(EngineArgs))  # as the harness's own runs ask for it
    return kwargs


def plain_vllm_logprobs(model, prompts: list[list[int]], max_model_len: int = 512) -> list[list[float]]:
    """Per prompt, the logprob plain vLLM gives each prompt token after the first."""
    from vllm import LLM, SamplingParams

    from harness.scenarios.bench import shutdown

    llm = LLM(**_engine_kwargs(model, max_model_len))
    try:
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0),
            use_tqdm=False,
        )
    finally:
        shutdown(llm)
    return [
        [lp[tok].logprob for lp, tok in zip(o.prompt_logprobs[1:], p[1:], strict=True)]
        for o, p in zip(outs, prompts, strict=True)
    ]


def transformers_logprobs(model, prompts: list[list[int]]) -> list[list[float]]:
    import torch

    from harness.subjects import reference

    ref = reference.load(str(model.path))
    out = []
    with torch.no_grad():
        for p in prompts:
            logits = ref(torch.tensor([p])).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            out.append([float(lp[i, p[i + 1]]) for i in range(len(p) - 1)])
    return out


def _in_child(model, prompts: list[list[int]]) -> list[list[float]]:
    """plain_vllm_logprobs in a fresh interpreter (a failed engine start leaves nothing behind here); on failure
    the root cause the engine process logged, not only the driver's "initialization failed"."""
    import json
    import re
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logprobs.json"
        code = (
            "import json, sys\n"
            "from harness.subjects import models\nfrom harness.reporting.attribution import plain_vllm_logprobs\n"
            "if __name__ == '__main__':\n"
            f"    m = models.build({model.name!r})\n"
            f"    prompts = json.loads(open({str(out) + '.in'!r}).read())\n"
            f"    open({str(out)!r}, 'w').write(json.dumps(plain_vllm_logprobs(m, prompts)))\n"
        )
        Path(str(out) + ".in").write_text(json.dumps(prompts))
        # A child killed by a signal without an error of its own (vLLM 0.16's CPU build, now and then: SIGABRT) gets
        # up to two more tries; a child that reported an error never does. Python's fault handler writes where a
        # killed child was, so a death that repeats is reported with its place.
        tries = 0
        while tries < SIGNAL_TRIES:
            tries += 1
            cmd = [sys.executable, "-X", "faulthandler", "-c", code]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if proc.returncode == 0 and out.is_file():
                return json.loads(out.read_text())
            if proc.returncode >= 0 or re.search(r"(?:Error|Exception): ", proc.stdout + proc.stderr):
                break
    errors = [
        m.group(0).strip()
        for line in (proc.stdout + proc.stderr).splitlines()
        if (m := re.search(r"\b\w*(?:Error|Exception): .*", line))
    ]
    root = next((e for e in errors if "initialization failed" not in e), errors[-1] if errors else None)
    raise RuntimeError(summarize(root or killed(proc.returncode, proc.stderr, tries), 400))


#: Tries a plain-vLLM child gets when a signal kills it without an error of its own.
SIGNAL_TRIES = 3


def killed(returncode: int, stderr: str, tries: int = 1) -> str:
    """A child's death without an error message: the signal by name, and where the fault handler saw it."""
    import signal

    try:
        how = f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exit {returncode}"
    except ValueError:
        how = f"exit {returncode}"
    lines = stderr.splitlines()
    start = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("Fatal Python error")), None)
    where = [ln.strip() for ln in lines[start:] if ln.strip().startswith("File ")][:3] if start is not None else []
    return f"{how}" + (f" ({tries} tries)" if tries > 1 else "") + (f"; last at: {' <- '.join(where)}" if where else "")


def attribute(model, prompts: list[list[int]]) -> Verdict:
    started, theirs = Attempt.run(lambda: _in_child(model, prompts))
    if not started.ok:
        return Verdict(started)
    ours = transformers_logprobs(model, prompts)
    diff = max(abs(a - b) for x, y in zip(theirs, ours, strict=True) for a, b in zip(x, y, strict=True))
    return Verdict(started, diff)

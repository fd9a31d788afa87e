"""The matrix's build axis: the client cells observed on vLLM's CUDA build, from the GPU tier's reports.

Users train on CUDA; the matrix's env reports (reports/vllmXYZ.json) come from vLLM's CPU wheel. A cell therefore
says which build it was observed on (`cpu`, `cuda-sm90`: an H100 or H200) and which committed file holds the
evidence. Here, per vLLM release and client release, the CUDA cell, read from `reports/gpu/`:
- speculators 0.3.0 from the tier's reports (`harness-gpu-report/1`, TP=1): every check passed and every contract
  as expected on each model, through the shims it names;
- speculators >= 0.5 from the client reports (`harness.clients.server_check`: that release's own client against
  `vllm serve`, compared with ours), one per model.
For each vLLM release and model the newest report counts. A release none of these observed has no CUDA cell.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.gpu.tier import ALONE_CHECK
from harness.reporting import client_axis as ax
from harness.reporting.client_axis import CPU, CUDA  # noqa: F401 - the build names, for this module's readers
from harness.subjects.releases import CLIENT_MODELS

GPU_SCHEMA = "harness-gpu-report/1"


def _model(name: str) -> str:
    """`tiny-llama-bcfb99dbb241` -> `tiny-llama` (the fixture, without its weights' hash)."""
    return re.sub(r"-[0-9a-f]{12}$", "", name)


def _device(devices: list[str]) -> str:
    names = " ".join(devices)
    return "H200" if "H200" in names else "H100" if "H100" in names else (devices[0] if devices else "GPU")


def _newest(reports: list[tuple[str, Path, dict]]) -> dict[tuple[str, str], tuple[Path, dict]]:
    """(vLLM, model) -> the newest report (by date, then file name)."""
    out: dict[tuple[str, str], tuple[Path, dict]] = {}
    for key, path, rep in sorted(reports, key=lambda r: (r[2].get("date", ""), r[1].name)):
        out[(rep["_vllm"], key)] = (path, rep)
    return out


def read(gpu_dir: Path) -> tuple[dict, dict]:
    """The tier's and the clients' newest reports per (vLLM, model)."""
    tier, clients = [], []
    for path in sorted(Path(gpu_dir).glob("*.json")):
        try:
            rep = json.loads(path.read_text())
        except ValueError:
            continue
        if not isinstance(rep, dict):
            continue
        if rep.get("schema") == GPU_SCHEMA and (rep.get("config") or {}).get("tp") == 1 and rep.get("checks"):
            rep["_vllm"] = rep["versions"]["vllm"]
            tier.append((_model(rep["model"]), path, rep))
        elif isinstance(rep.get("clients"), dict) and rep.get("device_type") == "cuda" and rep.get("vllm"):
            rep["_vllm"] = rep["vllm"]
            clients.append((_model(rep["model"]), path, rep))
    return _newest(tier), _newest(clients)


def _evidence(report_dir: Path, paths: list[Path]) -> list[str]:
    return [f"reports/{p.resolve().relative_to(Path(report_dir).resolve()).as_posix()}" for p in paths]


def _tier_model(rep: dict) -> tuple[bool, str, list[str]]:
    """(passed, what failed or how, shims) of one tier report."""
    failed = [c["check"] for c in rep["checks"] if c.get("result") != "pass"]
    off = [k for k, c in (rep.get("contracts") or {}).items() if c.get("expected") not in (None, c.get("outcome"))]
    shims = sorted({k.split("[")[0] for k, c in (rep.get("contracts") or {}).items() if c.get("outcome") == "shimmed"})
    if failed or off:
        return (
            False,
            "; ".join([*(f"check failed: {c}" for c in failed), *(f"{k} not as expected" for k in off)]),
            shims,
        )
    return True, f"{len(rep['checks'])} checks passed", shims


def _tier_fault(models: dict) -> str:
    """Whose fault a failed tier run is: vLLM's, naming the module, where the tier's diagnosis found one whose output
    changed on equal inputs (harness.gpu.module_determinism); vLLM's where a prompt's states change with the rest of
    its batch (its kernels' batch variance: nothing of the harness runs between the captured layers), with the
    largest difference at each captured layer; else the tier report decides."""
    for m, (_p, rep) in sorted(models.items()):
        culprit = (rep.get("nondeterministic_module") or {}).get("culprit")
        if culprit:
            return f"vLLM: on {m}, {culprit['class']} ({culprit['module']}) differs on equal inputs"
    for m, (_p, rep) in sorted(models.items()):
        by_layer = rep.get("alone_vs_batch_by_layer")
        if by_layer and any(c["check"] == ALONE_CHECK and c.get("result") != "pass" for c in rep["checks"]):
            diffs = ", ".join(f"{k}: {v:.3g}" for k, v in sorted(by_layer.items(), key=lambda kv: int(kv[0])))
            return (
                f"vLLM: on {m}, a prompt's states change with the rest of its batch (largest difference by "
                f"captured layer: {diffs})"
            )
    return "see the tier report"


def _judged(rep: dict, release: str) -> dict:
    """One release's result on one model, judged by today's rule: it agrees only where every id the launcher asks
    for was exported, the last layer's output included (reports written before that rule said `agrees` for the ids
    that were compared and recorded the missing last layer beside it)."""
    result = dict(rep["clients"][release])
    if rep.get("last_layer_is_final_output") is False and result.get("agrees"):
        result["agrees"] = False
    return result


def cuda_cells(report_dir: Path, cell) -> dict[str, dict[str, dict]]:
    """{client release: {vLLM release: cell}} for what the GPU tier observed; `cell` makes a client_axis cell."""
    tier, clients = read(Path(report_dir) / "gpu")
    out: dict[str, dict[str, dict]] = {}
    for vllm in sorted({v for v, _m in tier}):
        models = {m: tier[(v, m)] for v, m in tier if v == vllm}
        out.setdefault("0.3.0", {})[vllm] = _generator_cell(report_dir, cell, vllm, models)
    for vllm in sorted({v for v, _m in clients}):
        models = {m: clients[(v, m)] for v, m in clients if v == vllm}
        for release in sorted({r for _p, rep in models.values() for r in rep["clients"]}):
            out.setdefault(release, {})[vllm] = _client_cell(report_dir, cell, vllm, models, release)
    return out


def _generator_cell(report_dir: Path, cell, vllm: str, models: dict) -> dict:
    """speculators 0.3.0's generator on one CUDA release: works (or shimmed) where every model's tier passed."""
    seen = {m: _tier_model(rep) for m, (_p, rep) in models.items()}
    device = " and ".join(sorted({_device(rep["device"].get("devices", [])) for _p, rep in models.values()}))
    ok = [m for m, (passed, _w, _s) in seen.items() if passed]
    shims = sorted({s for _p, _w, ss in seen.values() for s in ss})
    why = "; ".join(f"{m}: {w}" for m, (_p, w, _s) in sorted(seen.items())) + f" (vLLM {vllm} CUDA, {device})"
    verdict = (ax.SHIMMED if shims else ax.WORKS) if len(ok) == len(seen) else ax.PARTIAL if ok else ax.BROKEN
    return cell(
        verdict,
        why,
        shims if verdict != ax.BROKEN else [],
        models=ok if verdict == ax.PARTIAL else None,
        build=CUDA,
        evidence=_evidence(report_dir, [p for p, _r in models.values()]),
        fault=None if verdict in (ax.WORKS, ax.SHIMMED) else _tier_fault(models),
    )


def _client_cell(report_dir: Path, cell, vllm: str, models: dict, release: str) -> dict:
    """One speculators client release over `vllm serve` on one CUDA release: works where every model agreed, and
    incomplete where a model the client path is checked on has no CUDA report."""
    got = {m: _judged(rep, release) for m, (_p, rep) in models.items() if release in rep["clients"]}
    ok = sorted(m for m, c in got.items() if c["agrees"])
    why = "; ".join(f"{m}: {c.get('verdict', '')}" for m, c in sorted(got.items())) + f" (vLLM {vllm} CUDA)"
    verdict = ax.WORKS if len(ok) == len(got) else ax.PARTIAL if ok else ax.BROKEN
    unseen = [m for m in CLIENT_MODELS if m not in got]
    if unseen:
        why += f"; not observed on CUDA: {', '.join(unseen)}"
    return cell(
        verdict,
        why,
        models=ok if verdict == ax.PARTIAL else None,
        build=CUDA,
        complete=not unseen,
        evidence=_evidence(report_dir, [p for m, (p, _r) in models.items() if m in got]),
        fault=None if verdict == ax.WORKS else ax.fault_of(release, got),
    )

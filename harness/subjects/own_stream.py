"""The state a model's own forward carries from one decoder layer to the next, recorded from its own modules.

speculators 0.3.0 captures `hidden_states + residual` after each layer it is asked for. That sum is a convention, not
the model's: Cohere's layer adds its residual inside and returns (layer output, layer input), and the next layer
normalises the output alone, so the sum is wrong by a whole layer's input. A reference that forms the same sum
agrees with speculators on every model and cannot catch it. This module forms no sum. While the model's own
`forward` runs, it records what the model itself feeds on after layer k:

* where the module that comes next (decoder layer k + 1, or the stack's final norm after its last layer) is handed
  one floating-point tensor, that tensor (OLMo-2's and Granite's layers take `hidden_states` only);
* where it is handed several (a hidden state and a residual), the tensor its normalisation normalises: the final
  norm itself, or the first module the layer calls. Which tensor that is, is decided by running that normalisation
  again on each candidate alone -- the residual it returned beside its output (vLLM's fused add-and-norm returns
  the sum it formed), and each tensor it was handed -- and taking the one whose normalisation reproduces what the
  model normalised (`MATCH_ULPS`), clearly closer than any other (`SEPARATION`). The candidates differ by a whole
  layer's update; the kernels' noise is a few ulp.

Only a module with no submodules and only vector parameters (a LayerNorm or RMSNorm: a per-channel weight and
bias) is run again, so no attention or KV cache is touched. Where no candidate reproduces, or the first module is
not such a normalisation, the state is unknown (`StreamUnknown`) and nothing is handed over.
"""

from __future__ import annotations

import inspect

#: A candidate is the normalised tensor when normalising it alone reproduces the model's output within MATCH_ULPS
#: units in the last place of the output's dtype at its magnitude (a fused add-and-norm and the plain norm round
#: differently: 2 bfloat16 ulps seen on vLLM 0.16's CPU build), and every other distinct candidate is SEPARATION
#: times further off (a wrong candidate is off by a layer's update: 0.3-1.3 of the magnitude seen).
MATCH_ULPS = 16
SEPARATION = 4
FAILURE = "StreamUnknown"


class StreamUnknown(RuntimeError):
    """What the model feeds on after a layer could not be told from its own modules."""


def handed(module, args, kwargs) -> list[tuple[str, object]]:
    """The floating-point tensors a module is called with, by parameter name, copied (vLLM's fused norms
    overwrite their inputs in place)."""
    import torch

    return [
        (name, value.detach().clone())
        for name, value in named_arguments(module, args, kwargs)
        if isinstance(value, torch.Tensor) and value.is_floating_point()
    ]


def named_arguments(module, args, kwargs) -> list[tuple[str, object]]:
    """A call's arguments by the parameter names of the method that takes them (vLLM's custom ops take
    `*args` in `forward` and name them in `forward_native`)."""
    for method in (module.forward, getattr(module, "forward_native", None)):
        if method is None:
            continue
        try:
            sig = inspect.signature(method)
            bound = sig.bind(*args, **kwargs).arguments
        except (TypeError, ValueError):
            continue
        kinds = {name: sig.parameters[name].kind for name in bound}
        if any(kind is inspect.Parameter.VAR_POSITIONAL and bound[n] for n, kind in kinds.items()):
            continue  # unnamed positionals: the next method may name them
        named: list[tuple[str, object]] = []
        for name, value in bound.items():
            if kinds[name] is inspect.Parameter.VAR_KEYWORD:
                named += list(value.items())
            elif kinds[name] is not inspect.Parameter.VAR_POSITIONAL:
                named.append((name, value))
        return named
    return [(f"argument {i}", a) for i, a in enumerate(args)] + list(kwargs.items())


def outputs(out) -> list:
    import torch

    seq = out if isinstance(out, (tuple, list)) else (out,)
    return [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in seq]


def is_normalisation(module) -> bool:
    """A leaf module whose parameters are all vectors: safe to run again on a candidate (no state, no cache)."""
    params = list(module.parameters(recurse=False))
    return not list(module.children()) and bool(params) and all(p.dim() == 1 for p in params)


class Boundary:
    """Records, in one forward, what enters `entry` (decoder layer k + 1, or the final norm) and, where that is
    several tensors, the call of the normalisation that decides which one the model feeds on."""

    def __init__(self, entry, where: str, is_norm: bool):
        self.entry, self.where, self.is_norm = entry, where, is_norm
        self.fed: list | None = None
        self.norm: list | None = None  # [module, name, handed, outputs]
        self._hooks = [entry.register_forward_pre_hook(self._enter, with_kwargs=True)]
        if is_norm:
            self._hooks.append(entry.register_forward_hook(self._left(entry, "norm")))
        else:
            for name, child in entry.named_children():
                self._hooks.append(child.register_forward_pre_hook(self._child_in(child, name), with_kwargs=True))
                self._hooks.append(child.register_forward_hook(self._left(child, name)))

    def reset(self) -> None:
        self.fed, self.norm = None, None

    def _enter(self, module, args, kwargs):
        if self.fed is None:
            self.fed = handed(module, args, kwargs)
            if self.is_norm:
                self.norm = [module, "norm", self.fed, None]

    def _child_in(self, child, name):
        def record(module, args, kwargs):
            if self.fed is not None and self.norm is None:  # the first module the layer calls
                self.norm = [child, name, handed(module, args, kwargs), None]

        return record

    def _left(self, module, name):
        def record(mod, args, out):
            if self.norm is not None and self.norm[0] is module and self.norm[3] is None:
                self.norm[3] = outputs(out)

        return record

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()

    def state(self) -> tuple[object, str]:
        """(the tensor the model feeds on here, how it was told)."""
        if not self.fed:
            raise StreamUnknown(f"{FAILURE}: {self.where} was not handed a floating-point tensor in the own forward")
        if len(self.fed) == 1:
            return self.fed[0][1], f"{self.where} is handed {self.fed[0][0]} alone"
        if self.norm is None or self.norm[3] is None:
            raise StreamUnknown(f"{FAILURE}: {self.where} called no module with what it was handed")
        module, name, given, outs = self.norm
        if not is_normalisation(module):
            raise StreamUnknown(
                f"{FAILURE}: {self.where} is handed {', '.join(n for n, _ in self.fed)} and first calls {name} "
                f"({type(module).__name__}), not a normalisation: which of them it feeds on cannot be told"
            )
        return self._decided(module, name, given, outs)

    def _decided(self, module, name, given, outs) -> tuple[object, str]:
        import torch

        target = outs[0]
        candidates = [(f"the residual stream its {name} returns", outs[1])] if len(outs) > 1 else []
        candidates += [(f"the {n} its {name} is handed alone", t) for n, t in given]
        distinct: list = []  # (off by, label, tensor): one entry per distinct tensor, the first label kept
        for label, tensor in candidates:
            if not isinstance(tensor, torch.Tensor) or tensor.shape != target.shape:
                continue
            if any(torch.equal(tensor, t) for _, _, t in distinct):
                continue
            with torch.no_grad():
                again = outputs(module(tensor.clone()))[0]
            distinct.append((float((again.float() - target.float()).abs().max()), label, tensor))
        ranked = sorted(distinct, key=lambda c: c[0])
        bound = MATCH_ULPS * float(torch.finfo(target.dtype).eps) * max(1.0, float(target.float().abs().max()))
        if ranked and ranked[0][0] <= bound and all(c[0] > SEPARATION * max(ranked[0][0], 1e-30) for c in ranked[1:]):
            return ranked[0][2], f"{self.where} feeds on {self._named(ranked[0][1], ranked[0][2])}"
        raise StreamUnknown(
            f"{FAILURE}: no tensor {self.where}'s {name} was handed or returned reproduces its normalisation alone, "
            f"clearly apart from the others (bound {bound:.3g}; "
            + "; ".join(f"{label}: off by {off:.3g}" for off, label, _ in ranked or [(0.0, "no candidate", None)])
            + ")"
        )

    def _named(self, label: str, tensor) -> str:
        """The label, naming the tensor the layer was handed where the chosen one is exactly that (Cohere's norm
        returns the hidden state it was handed, not a sum)."""
        import torch

        for n, t in self.fed or ():
            if t.shape == tensor.shape and torch.equal(t, tensor):
                return f"the {n} it is handed alone (not summed with {self._others(n)})"
        return label

    def _others(self, name: str) -> str:
        return ", ".join(n for n, _ in self.fed or () if n != name) or "anything"


class Recorder:
    """Boundaries after each captured layer of a decoder stack (`stack.layers`, `start_layer`, `end_layer`, `norm`)."""

    def __init__(self, stack, layer_ids):
        layers = list(stack.layers)
        end = int(getattr(stack, "end_layer", len(layers)))
        self.ids = list(layer_ids)
        self.boundaries = {}
        for k in self.ids:
            if k + 1 < end:
                self.boundaries[k] = Boundary(layers[k + 1], f"layer {k + 1}", is_norm=False)
            else:
                self.boundaries[k] = Boundary(stack.norm, "the final norm", is_norm=True)

    def reset(self) -> None:
        for b in self.boundaries.values():
            b.reset()

    def states(self) -> tuple[list, dict]:
        """Per captured layer (in `layer_ids` order) the state the model feeds on, and how it was told."""
        told = {k: self.boundaries[k].state() for k in self.ids}
        return [told[k][0] for k in self.ids], {k: told[k][1] for k in self.ids}

    def remove(self) -> None:
        for b in self.boundaries.values():
            b.remove()

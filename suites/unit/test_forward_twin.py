"""C-forward's own pass and judgement on a plain torch stack (the mechanism, without vLLM: the suites run it on the
engine, where `captures_here` asks vLLM's tensor-parallel group).

A stack whose own forward is embed -> layers -> norm must come out equal to a speculators-style replacement loop,
bit for bit; one whose own forward scales the embeddings (as Gemma-2's does) must not, and the verdict must say
so; removing the own pass must leave speculators' loop installed as it was."""

from __future__ import annotations

import types

import pytest
import torch

from harness.contracts import forward


class Layer(torch.nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.randn(8, 8, generator=g) * 0.3)

    def forward(self, positions, hidden_states, residual):
        residual = hidden_states if residual is None else hidden_states + residual
        return torch.tanh(residual @ self.w), residual


class Stack(torch.nn.Module):
    scale = 1.0

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        torch.nn.init.normal_(self.embed.weight, generator=torch.Generator().manual_seed(0))
        self.layers = torch.nn.ModuleList(Layer(i) for i in range(4))
        self.start_layer, self.end_layer = 0, 4

    def get_input_embeddings(self, ids):
        return self.embed(ids)

    def norm(self, h, r):
        return h + r, None

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        h, r = self.get_input_embeddings(input_ids) * self.scale, None
        for layer in self.layers[self.start_layer : self.end_layer]:
            h, r = layer(positions=positions, hidden_states=h, residual=r)
        return self.norm(h, r)[0]


class Scaled(Stack):
    scale = 8.0**0.5  # as Gemma-2's forward multiplies by sqrt(hidden_size)


def replacement(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
    """speculators 0.3.0's loop, as its custom_worker runs it."""
    h, r = self.get_input_embeddings(input_ids), None
    for layer in self.layers[self.start_layer : self.end_layer]:
        h, r = layer(hidden_states=h, positions=positions, residual=r)
    return self.norm(h, r)[0]


def patched(cls):
    stack = cls()
    stack.forward = types.MethodType(replacement, stack)
    return stack


class Worker:
    """What the own pass reads of a vLLM worker: the loaded model, the layer ids, speculators' store."""

    def __init__(self, stack, layer_ids):
        self.model_runner = types.SimpleNamespace(model=types.SimpleNamespace(model=stack))
        self._layer_ids = frozenset(layer_ids)
        self.stored = []

    def _store_captured_states(self, states):
        self.stored.append(states)


def speculators_capture(stack, ids, pos, layer_ids):
    """What speculators' loop captures: hidden_states + residual after each wanted layer."""
    h, r, out = stack.get_input_embeddings(ids), None, []
    for k, layer in enumerate(stack.layers):
        h, r = layer(hidden_states=h, positions=pos, residual=r)
        if k in layer_ids:
            out.append(h + r)
    return out


@pytest.fixture
def rank0(monkeypatch):
    monkeypatch.setattr(forward, "captures_here", lambda: True)


@pytest.mark.parametrize("cls,holds", [(Stack, True), (Scaled, False)])
def test_the_own_pass_hands_over_the_own_forwards_states(cls, holds, rank0):
    stack, layer_ids = patched(cls), [0, 3]
    worker = Worker(stack, layer_ids)
    speculators_loop = stack.__dict__["forward"]
    ids, pos = torch.tensor([1, 5, 7, 9]), torch.arange(4)
    with torch.no_grad():
        where = forward.own_pass(worker, True)
        forward.entry_trace(worker, True)
        out = stack.forward(ids, pos)
        forward.own_pass(worker, False)
        fed_own = forward.entry_trace(worker, False)
        assert torch.equal(out, cls.forward(stack, ids, pos)), "the step's output is the own forward's"
        forward.entry_trace(worker, True)
        stack.forward(ids, pos)  # speculators' loop, put back
        fed_spec = forward.entry_trace(worker, False)
        spec = speculators_capture(stack, ids, pos, layer_ids)
    assert where["stack"] == cls.__name__ and where["own_forward"].endswith(".Stack.forward")
    assert stack.__dict__["forward"] == speculators_loop, "speculators' loop is back"
    assert not stack.layers[0]._forward_hooks and not stack.layers[0]._forward_pre_hooks, "no hook left behind"
    (own,) = worker.stored
    result = forward.judge(own, spec, layer_ids)
    assert result["held"] is holds
    if holds:
        assert result["max_abs_diff"] == 0.0
    else:
        assert result["max_abs_diff"] > 10 * result["bound"]
        result["entry_step"] = forward.entry_step(fed_own, fed_spec)
        said = forward.describe(result, cls.__name__)
        assert "its own forward scales the embeddings by 2.828 before the first layer" in said, said
    if holds:
        assert forward.entry_step(fed_own, fed_spec) is None


def test_an_entry_change_other_than_a_scale_is_named_as_such():
    base = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    assert forward.entry_step(base, base.clone()) is None
    assert "scales the embeddings by 3" in forward.entry_step(base * 3, base)
    assert "in a way speculators' loop does not" in forward.entry_step(base + 1, base)


def test_a_difference_of_shape_is_a_divergence():
    a, b = [torch.zeros(4, 8)], [torch.zeros(3, 8)]
    result = forward.judge(a, b, [2])
    assert not result["held"] and "shapes (4, 8) (own) and (3, 8)" in forward.describe(result, "S")


def test_the_bound_is_ulps_of_the_magnitude():
    big = torch.full((2, 4), 30.0)
    eps = torch.finfo(torch.float32).eps
    near = big + 3 * eps * 30  # 3 ulp at magnitude 30: inside the 4-ulp bound
    far = big + 6 * eps * 30
    assert forward.judge([big], [near], [0])["held"]
    assert not forward.judge([big], [far], [0])["held"]

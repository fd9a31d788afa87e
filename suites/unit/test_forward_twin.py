"""C-forward's own pass and judgement on plain torch stacks (the mechanism, without vLLM: the suites run it on the
engine, where `captures_here` asks vLLM's tensor-parallel group).

The stacks are built as vLLM builds its families: a Llama-like layer normalises with a fused add-and-norm that
overwrites its inputs and returns (normalised, sum); a Cohere-like layer adds its residual inside and returns
(output, input), its norm passing the residual through untouched; an OLMo-like layer takes the hidden state alone.
The own pass must hand over what each model feeds on (never a sum it forms itself): equal to speculators' loop for
the Llama-like stack bit for bit, different for the scaled and the Cohere-like ones with a verdict that says why;
removing the own pass must leave speculators' loop installed as it was."""

from __future__ import annotations

import types

import pytest
import torch

from harness.contracts import forward
from harness.subjects import own_stream


def normalise(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


class AddNorm(torch.nn.Module):
    """vLLM's RMSNorm: with a residual, the fused op adds it and normalises in place, returning (normalised, sum)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((8,), 1.5))

    def forward(self, x, residual=None):
        if residual is None:
            return normalise(x, self.weight)
        residual.add_(x)
        x.copy_(normalise(residual, self.weight))
        return x, residual


class PassNorm(AddNorm):
    """Cohere's LayerNorm: normalises its first argument and hands the residual back unchanged."""

    def forward(self, x, residuals=None):
        return normalise(x, self.weight), residuals


def weight(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(8, 8, generator=g) * 0.3)


class Layer(torch.nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        self.input_layernorm = AddNorm()
        self.w = weight(seed)

    def forward(self, positions, hidden_states, residual):
        if residual is None:
            residual = hidden_states.clone()
            h = self.input_layernorm(hidden_states)
        else:
            h, residual = self.input_layernorm(hidden_states, residual)
        return torch.tanh(h @ self.w), residual


class CohereLayer(Layer):
    def __init__(self, seed: int):
        super().__init__(seed)
        self.input_layernorm = PassNorm()

    def forward(self, positions, hidden_states, residual):
        residual = hidden_states
        h, residual = self.input_layernorm(hidden_states, residual)
        return residual + torch.tanh(h @ self.w), residual


class Stack(torch.nn.Module):
    scale = 1.0
    layer = Layer
    final = AddNorm

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        torch.nn.init.normal_(self.embed.weight, generator=torch.Generator().manual_seed(0))
        self.layers = torch.nn.ModuleList(self.layer(i) for i in range(4))
        self.norm = self.final()
        self.start_layer, self.end_layer = 0, 4

    def get_input_embeddings(self, ids):
        return self.embed(ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        h, r = self.get_input_embeddings(input_ids) * self.scale, None
        for layer in self.layers[self.start_layer : self.end_layer]:
            h, r = layer(positions, h, r)
        return self.norm(h, r)[0]


class Scaled(Stack):
    scale = 8.0**0.5  # as Gemma-2's forward multiplies by sqrt(hidden_size)


class Cohere(Stack):
    layer = CohereLayer
    final = PassNorm


class PostNormLayer(torch.nn.Module):
    """OLMo-2's kind: called with the hidden state alone, normalises after the update."""

    def __init__(self, seed: int):
        super().__init__()
        self.w = weight(seed)
        self.post_feedforward_layernorm = AddNorm()

    def forward(self, positions, hidden_states):
        return hidden_states + self.post_feedforward_layernorm(torch.tanh(hidden_states @ self.w))


class PostNorm(Stack):
    layer = PostNormLayer

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        h = self.get_input_embeddings(input_ids)
        for layer in self.layers[self.start_layer : self.end_layer]:
            h = layer(positions, h)
        return self.norm(h)


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


def own_and_speculators(cls, layer_ids):
    """The own pass's states and speculators' capture of one prompt, what the first layer was fed in each, and
    where the own pass said it ran."""
    stack = patched(cls)
    worker = Worker(stack, layer_ids)
    speculators_loop = stack.__dict__["forward"]
    ids, pos = torch.tensor([1, 5, 7, 9]), torch.arange(4)
    with torch.no_grad():
        where = forward.own_pass(worker, True)
        forward.entry_trace(worker, True)
        out = stack.forward(ids, pos)
        told = forward.own_pass(worker, False)["feeds_on"]
        fed_own = forward.entry_trace(worker, False)
        assert torch.equal(out, cls.forward(stack, ids, pos)), "the step's output is the own forward's"
        forward.entry_trace(worker, True)
        if cls is not PostNorm:
            stack.forward(ids, pos)  # speculators' loop, put back
        fed_spec = forward.entry_trace(worker, False)
        spec = speculators_capture(stack, ids, pos, layer_ids) if cls is not PostNorm else None
    assert stack.__dict__["forward"] == speculators_loop, "speculators' loop is back"
    for module in stack.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks, "no hook left behind"
    (own,) = worker.stored
    return own, spec, (fed_own, fed_spec), {**where, "feeds_on": told}


@pytest.mark.parametrize(
    "cls,says",
    [
        (Stack, None),
        (Scaled, "its own forward scales the embeddings by 2.828 before the first layer"),
        (Cohere, "layer 1 feeds on the hidden_states it is handed alone (not summed with residual), while "),
    ],
)
def test_the_own_pass_hands_over_what_the_model_feeds_on(cls, says, rank0):
    layer_ids = [0, 3]
    own, spec, (fed_own, fed_spec), where = own_and_speculators(cls, layer_ids)
    assert where["stack"] == cls.__name__ and where["own_forward"].endswith(".Stack.forward")
    result = forward.judge(own, spec, layer_ids)
    assert result["held"] is (says is None)
    if says is None:
        assert result["max_abs_diff"] == 0.0, "the model's own sum and speculators' are the same float32 additions"
        assert forward.entry_step(fed_own, fed_spec) is None
        assert "the residual stream its input_layernorm returns" in where["feeds_on"]["0"]
        return
    assert result["max_abs_diff"] > 10 * result["bound"]
    result["entry_step"] = forward.entry_step(fed_own, fed_spec)
    result["feeds_on"] = where["feeds_on"][str(result["layer"])]
    said = forward.describe(result, cls.__name__)
    assert says in said, said


def test_a_layer_handed_the_hidden_state_alone_is_recorded_as_handed(rank0):
    """OLMo-2's kind: the state after layer k is what layer k + 1 is handed (and the final norm, after the last)."""
    stack, layer_ids = PostNorm(), [0, 3]
    ids, pos = torch.tensor([1, 5, 7, 9]), torch.arange(4)
    with torch.no_grad():
        h, outs = stack.get_input_embeddings(ids), []
        for layer in stack.layers:
            h = layer(pos, h)
            outs.append(h)
        own, _, _, where = own_and_speculators(PostNorm, layer_ids)
    assert all(torch.equal(a, outs[k]) for a, k in zip(own, layer_ids, strict=True))
    assert where["feeds_on"] == {"0": "layer 1 is handed hidden_states alone", "3": "the final norm is handed x alone"}


class AttentionFirst(Layer):
    """A layer handed (hidden_states, residual) whose first call is not a normalisation: which one it feeds on cannot
    be told by running a module again (attention would touch the KV cache), so nothing is handed over."""

    def __init__(self, seed: int):
        super().__init__(seed)
        self.mix = torch.nn.Linear(8, 8)

    def forward(self, positions, hidden_states, residual):
        h = self.mix(hidden_states)
        return super().forward(positions, h, residual)


class Unknown(Stack):
    layer = AttentionFirst


def test_a_state_that_cannot_be_told_is_refused_not_guessed(rank0):
    with pytest.raises(own_stream.StreamUnknown, match="not a normalisation"):
        own_and_speculators(Unknown, [1])


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

"""The tier's diagnosis when the same batch twice is not bitwise (harness.gpu.module_determinism): recorded on real
torch modules shaped like a decoder layer, it names the first module whose output changed on unchanged inputs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.gpu import module_determinism as md

torch = pytest.importorskip("torch")


class RowLocal(torch.nn.Module):
    """A projection computed element by element (features rotated, scaled, shifted): a row's result is bitwise the
    same alone and in any batch on every CPU. A `torch.nn.Linear` is not: a GEMM's reduction order may follow the
    row count (an AMD EPYC's kernels gave other last digits for 3 rows than for 5), and these tests must hold on
    any x86 machine."""

    def __init__(self, width: int, out: int):
        super().__init__()
        self.out = out
        self.weight = torch.nn.Parameter(torch.randn(out))
        self.bias = torch.nn.Parameter(torch.randn(out))

    def forward(self, x):
        return x.roll(1, -1)[..., : self.out] * self.weight + self.bias


class Noisy(torch.nn.Module):
    """A module whose output is not a function of its input: fresh noise on every call."""

    def __init__(self, width: int, noisy: bool):
        super().__init__()
        self.proj, self.noisy = RowLocal(width, width), noisy

    def forward(self, x):
        out = self.proj(x)
        return out + 1e-3 * torch.randn_like(out) if self.noisy else out


class Mlp(torch.nn.Module):
    def __init__(self, width: int, noisy_experts: bool):
        super().__init__()
        self.gate = RowLocal(width, 4)
        self.experts = Noisy(width, noisy_experts)
        self.shared_experts = Noisy(width, False)

    def forward(self, x):
        return self.experts(x) * self.gate(x).sigmoid()[:, :1] + self.shared_experts(x)


class Layer(torch.nn.Module):
    def __init__(self, width: int, noisy_experts: bool):
        super().__init__()
        self.self_attn, self.mlp = Noisy(width, False), Mlp(width, noisy_experts)

    def forward(self, x):
        x = x + self.self_attn(x)
        return x + self.mlp(x)


def _run_twice(noisy_layer: int | None) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Layer(16, i == noisy_layer) for i in range(3)])
    worker = SimpleNamespace(model_runner=SimpleNamespace(model=model))
    x = torch.randn(5, 16)
    for _ in range(2):
        # per layer: attention and its projection, the MLP, its gate, experts and shared experts and their projections
        assert md.install(worker) == 3 * 8
        with torch.no_grad():
            model(x)
        assert md.collect(worker) == 3 * 8
    return md.compare(worker)


def test_a_deterministic_model_has_no_culprit():
    found = _run_twice(None)
    assert found["differing"] == 0 and found["culprit"] is None and found["same_calls"] and found["calls"] == 24


def test_the_first_module_changing_on_equal_inputs_is_named_not_its_consequences():
    found = _run_twice(1)
    assert found["culprit"]["module"] == "1.mlp.experts" and found["culprit"]["class"] == "Noisy"
    assert 0 < found["culprit"]["max_abs_diff"] < 0.1
    assert found["differing"] > 1  # the layer's MLP and everything after differ too, and are not blamed
    assert found["first_differing"] == {"module": "1.mlp.experts", "class": "Noisy", "inputs_equal": True}


def test_hooks_are_removed_after_collect():
    model = Layer(8, False)
    worker = SimpleNamespace(model_runner=SimpleNamespace(model=model))
    md.install(worker)
    md.collect(worker)
    assert not model.self_attn._forward_hooks and not model.mlp.experts._forward_hooks
    assert not model.self_attn._forward_pre_hooks


def test_the_canonical_marlin_order_is_one_layout_per_routing():
    """harness.contracts.moeorder.canonical_order (C-moeorder's shim): two legal layouts of the same routing (tokens
    placed in another order inside each expert's run of blocks) become the same one; each expert keeps its blocks,
    padding stays last."""
    from harness.contracts.moeorder import canonical_order

    pad = 99
    expert_ids = torch.tensor([0, 0, 2, 5], dtype=torch.int32)
    one = torch.tensor([7, 3, 9, 1, 4, 0, pad, pad, 8, 2, 6, 5, pad, pad, pad, pad], dtype=torch.int32)
    other = torch.tensor([1, 9, 4, 3, pad, 7, 0, pad, 6, 8, 2, 5, pad, pad, pad, pad], dtype=torch.int32)
    a, b = canonical_order(one.clone(), expert_ids, 4), canonical_order(other.clone(), expert_ids, 4)
    assert torch.equal(a, b)
    assert a[:8].tolist() == [0, 1, 3, 4, 7, 9, pad, pad] and a[8:12].tolist() == [2, 5, 6, 8]
    # 6 slots, blocks of 4: the last 2 untouched; ids order as unsigned and survive the round trip unchanged
    tail = torch.tensor([3, 1, -5, 2, 7, 7], dtype=torch.int32)
    assert canonical_order(tail, torch.tensor([1], dtype=torch.int32), 4).tolist() == [1, 2, 3, -5, 7, 7]


def _atomic_like_aligner(topk_ids, block_size, num_experts):
    """vLLM's aligner as its CUDA kernel behaves (vllm-project/vllm#52525): each expert's token slots in blocks of
    `block_size`, experts in order, padded with the slot count; within an expert, slots in whatever order the
    atomics happen to give (here: a fresh random order every call). The GPU proof runs vLLM's own kernel."""
    flat = topk_ids.view(-1).long()
    pad = flat.numel()
    ids, experts = [], []
    for e in range(num_experts):
        slots = (flat == e).nonzero().view(-1)
        slots = slots[torch.randperm(slots.numel())]
        padded = -(-slots.numel() // block_size) * block_size
        ids += slots.tolist() + [pad] * (padded - slots.numel())
        experts += [e] * (padded // block_size)
    return (
        torch.tensor(ids, dtype=torch.int32),
        torch.tensor(experts, dtype=torch.int32),
        torch.tensor([len(ids)], dtype=torch.int32),
    )


def test_the_probe_sees_layouts_that_differ_and_the_shim_makes_them_one():
    from harness.contracts import moeorder

    vllm_like = moeorder.layouts(_atomic_like_aligner, 16, 4, "cpu", canonical=False)
    shimmed = moeorder.layouts(_atomic_like_aligner, 16, 4, "cpu", canonical=True)
    assert moeorder._differing(vllm_like) == moeorder.CALLS - 1 and moeorder._differing(shimmed) == 0
    # the canonical layout is a legal one: the same slots per block's expert, as a set
    for block in range(len(shimmed[0]) // moeorder.BLOCK):
        part = slice(block * moeorder.BLOCK, (block + 1) * moeorder.BLOCK)
        assert sorted(shimmed[0][part].tolist()) == shimmed[0][part].tolist()


class BatchMean(torch.nn.Module):
    """A module whose output on a row depends on the other rows: what makes a prompt's states depend on its batch."""

    def forward(self, x):
        return x - 1e-3 * x.mean(0, keepdim=True)


def _alone_then_first_in_batch(dependent_layer: int | None, others: int) -> dict:
    torch.manual_seed(0)
    layers = [Layer(16, False) for _ in range(3)]
    if dependent_layer is not None:
        layers[dependent_layer].mlp.shared_experts = BatchMean()
    return _prompt_alone_then_first(torch.nn.Sequential(*layers), others)


def _prompt_alone_then_first(model, others: int = 3) -> dict:
    """A 4-row prompt through `model` alone, then first in a batch with `others` rows more, only its rows recorded."""
    worker = SimpleNamespace(model_runner=SimpleNamespace(model=model))
    prompt = torch.randn(4, 16)
    for batch in (prompt, torch.cat([prompt, torch.randn(others, 16)])):
        watched = md.install(worker, rows=len(prompt))
        with torch.no_grad():
            model(batch)
        md.collect(worker)
    return md.compare(worker, watched)


def test_the_prompts_rows_name_the_module_that_depends_on_the_batch():
    found = _alone_then_first_in_batch(2, others=3)
    assert found["first_inputs_equal"] and found["culprit"]["module"] == "2.mlp.shared_experts"
    assert found["culprit"]["class"] == "BatchMean" and found["culprit"]["max_abs_diff"] > 0
    # a model whose rows are independent of each other: the prompt's rows are the same alone and in the batch
    clean = _alone_then_first_in_batch(None, others=3)
    assert clean["first_inputs_equal"] and clean["differing"] == 0 and clean["culprit"] is None


def test_rows_cut_only_tensors_long_enough_and_keep_containers():
    x, short = torch.arange(12).reshape(6, 2), torch.arange(2)
    cut = md.Window(4).cut({"a": (x, short), "b": 3})
    assert torch.equal(cut["a"][0], x[:4]) and torch.equal(cut["a"][1], short) and cut["b"] == 3
    assert md.Window(None).cut(x) is x


def test_a_prompts_rows_are_found_by_its_token_ids_wherever_the_batch_puts_them():
    window = md.Window(prompt=[3, 4, 5])
    window.locate(torch.tensor([9, 3, 4, 9, 3, 4, 5, 1]))
    x = torch.arange(16).reshape(8, 2)
    assert window.recording and torch.equal(window.cut(x), x[4:7])
    assert torch.equal(window.cut(torch.arange(3)), torch.arange(3))  # not a row tensor of this forward: kept whole
    window.locate(torch.tensor([3, 4, 9, 9]))
    assert not window.recording


class NormedLayer(Layer):
    """A layer with a norm between its two blocks, as vLLM's decoder layers have."""

    def __init__(self, width: int, norm: torch.nn.Module):
        super().__init__(width, False)
        self.post_attention_layernorm = norm

    def forward(self, x):
        x = self.post_attention_layernorm(x + self.self_attn(x))
        return x + self.mlp(x)


class Embedded(torch.nn.Module):
    """A model with a token embedding before its layers, as vLLM's have."""

    def __init__(self, width: int):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(32, width)
        self.layers = torch.nn.Sequential(Layer(width, False))

    def forward(self, ids):
        return self.layers(self.embed_tokens(ids))


def test_the_prompt_is_compared_on_its_own_rows_wherever_it_sits_in_the_batch():
    torch.manual_seed(0)
    model = Embedded(16)
    worker = SimpleNamespace(model_runner=SimpleNamespace(model=model))
    prompt, other = torch.tensor([3, 4, 5]), torch.tensor([9, 9])
    for batch in (torch.cat([prompt, other]), torch.cat([other, prompt]), torch.cat([other, prompt, other])):
        for ids in (prompt, batch):
            watched = md.install(worker, prompt=prompt.tolist())
            with torch.no_grad():
                model(ids)
            md.collect(worker)
        found = md.compare(worker, watched)
        assert watched == 1 + 8 and found["calls"] == watched
        assert found["first_inputs_equal"] and found["differing"] == 0


def test_a_forward_without_the_prompt_is_not_recorded():
    model = Embedded(8)
    worker = SimpleNamespace(model_runner=SimpleNamespace(model=model))
    md.install(worker, prompt=[3, 4, 5])
    with torch.no_grad():
        model(torch.tensor([9, 9, 3, 4]))
    assert md.collect(worker) == 0


class InPlaceBatchNorm(torch.nn.Module):
    """Like vLLM's fused residual-add RMSNorm: writes its result into its inputs and returns them; here the result
    depends on the other rows too."""

    def forward(self, x, residual):
        residual.add_(x)
        x.copy_(residual - 1e-3 * residual.mean(0, keepdim=True))
        return x, residual


class FusedNormLayer(Layer):
    def __init__(self, width: int):
        super().__init__(width, False)
        self.post_attention_layernorm = InPlaceBatchNorm()

    def forward(self, x):
        h, residual = self.post_attention_layernorm(self.self_attn(x), x.clone())
        return residual + self.mlp(h)


def test_a_module_writing_into_its_inputs_is_judged_on_the_inputs_it_was_given():
    """Digested after the call, the fused norm's inputs would hold its own result and look 'already different':
    nothing would be named. Digested before it, the norm is named."""
    torch.manual_seed(0)
    found = _prompt_alone_then_first(torch.nn.Sequential(Layer(16, False), FusedNormLayer(16)))
    assert found["culprit"]["module"] == "1.post_attention_layernorm"
    assert found["culprit"]["class"] == "InPlaceBatchNorm" and found["culprit"]["max_abs_diff"] > 0


def test_a_norm_between_the_blocks_is_named_not_the_block_after_it():
    """The difference appears between the attention block's output and the MLP's input: the norm there is named,
    where watching the two blocks only would have said 'the MLP's inputs already differed'."""
    torch.manual_seed(0)
    found = _prompt_alone_then_first(torch.nn.Sequential(Layer(16, False), NormedLayer(16, BatchMean())))
    assert found["culprit"]["module"] == "1.post_attention_layernorm" and found["culprit"]["class"] == "BatchMean"
    assert found["first_differing"]["module"] == "1.post_attention_layernorm"

"""speculators' layer ids and vLLM's native ones, one decoder layer apart: the one place the shift lives."""

from __future__ import annotations

#: vLLM's native id of speculators' layer k is k + NATIVE_SHIFT (see map_layer_ids).
NATIVE_SHIFT = 1


def map_layer_ids(layer_ids, num_layers: int, *, to: str = "native") -> list[int]:
    """Translate layer ids between speculators' convention and vLLM's native one; order is kept.

    `to="native"`: speculators' id k (output of decoder layer k, 0 <= k < n) -> vLLM's id k + 1
    (input of layer k + 1; for k = n - 1 that is id n, the last layer's output before the final norm).
    `to="speculators"`: the inverse, vLLM's id j (1 <= j <= n) -> j - 1. vLLM's id 0 (the embeddings,
    the input of layer 0) has no speculators id: speculators never captures the embeddings.

    Ids outside the valid range raise ValueError instead of wrapping around silently: an id that
    is off by one is exactly the mistake this function exists to prevent.
    """
    n = int(num_layers)
    ids = [int(i) for i in layer_ids]
    if to == "native":
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"speculators layer ids {bad} out of range 0..{n - 1} (the model has {n} decoder layers)")
        return [i + NATIVE_SHIFT for i in ids]
    if to == "speculators":
        bad = [i for i in ids if not NATIVE_SHIFT <= i <= n]
        if bad:
            raise ValueError(
                f"vLLM native layer ids {bad} have no speculators equivalent: valid 1..{n} "
                f"(native 0 is the embeddings; the model has {n} decoder layers)"
            )
        return [i - NATIVE_SHIFT for i in ids]
    raise ValueError(f"to must be 'native' or 'speculators', not {to!r}")

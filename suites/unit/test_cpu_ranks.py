"""N ranks on vLLM's CPU build (harness.runtime.cpu_ranks): the thread binding, the swap space and the memory check,
decided from the machine's cores and memory before anything starts. (The run itself is suites/e2e/
test_tensor_parallel.py, on the installed vLLM.)"""

from __future__ import annotations

import inspect

import pytest

from harness.runtime import cpu_ranks


def test_ranks_get_contiguous_cores_or_share_them_round_robin():
    assert cpu_ranks.binding(2, [0, 1]) == "0|1"
    assert cpu_ranks.binding(2, [0, 1, 2, 3]) == "0,1|2,3"
    assert cpu_ranks.binding(4, [0, 1]) == "0|1|0|1"
    assert cpu_ranks.binding(8, [4, 5]) == "4|5|4|5|4|5|4|5", "the cores this process may use, not 0..n"


def test_swap_space_is_vllm_s_default_where_it_fits_and_a_share_where_it_does_not():
    assert cpu_ranks.swap_gib(2, 23.4) is None  # 8 GiB of 23.4: under vLLM's 40 % warning line
    per = cpu_ranks.swap_gib(8, 23.4)  # 32 GiB of 23.4: vLLM refuses ("Too large swap space")
    assert per is not None and 8 * per <= 0.4 * 23.4 and per == 1.0


def test_a_machine_that_cannot_hold_the_ranks_is_refused_in_one_line(monkeypatch):
    monkeypatch.delenv(cpu_ranks.BIND, raising=False)
    ok = cpu_ranks.plan(2, [0, 1], total_gib=23.4, available_gib=20.0, kv_gib=1.0)
    assert ok == cpu_ranks.Ranks(2, "0|1", None)
    with pytest.raises(cpu_ranks.CannotHold) as refused:
        cpu_ranks.plan(8, [0, 1], total_gib=23.4, available_gib=12.0, kv_gib=1.0)
    assert "\n" not in str(refused.value) and "12.0 GiB is available" in str(refused.value)


def test_a_binding_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv(cpu_ranks.BIND, "0-1|0-1")
    assert cpu_ranks.plan(2, [0, 1], 23.4, 20.0, 1.0).bind is None
    with cpu_ranks.binding_set(cpu_ranks.Ranks(2, None, None)):
        import os

        assert os.environ[cpu_ranks.BIND] == "0-1|0-1"


def test_the_binding_is_set_for_the_start_only_and_swap_only_where_the_config_takes_it(monkeypatch):
    import os

    monkeypatch.delenv(cpu_ranks.BIND, raising=False)
    with cpu_ranks.binding_set(cpu_ranks.Ranks(2, "0|1", None)):
        assert os.environ[cpu_ranks.BIND] == "0|1"
    assert cpu_ranks.BIND not in os.environ

    def with_swap(block_size=16, swap_space=4.0):
        return swap_space

    def without_swap(block_size=16):
        return None

    ranks = cpu_ranks.Ranks(8, "0|1", 1.0)
    assert cpu_ranks.cache_kwargs(ranks, with_swap) == {"swap_space": 1.0}
    assert cpu_ranks.cache_kwargs(ranks, without_swap) == {}
    assert "swap_space" in inspect.signature(with_swap).parameters

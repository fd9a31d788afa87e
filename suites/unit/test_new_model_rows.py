"""`expectations --add-model`: a new fixture's rows written into every CPU expectations file from what a run observed
(harness.reporting.new_model). The files here are made in a temporary folder; the committed ones are checked by
test_expectations (every row present and valid) and observed by the env runs."""

from __future__ import annotations

import pytest

from harness.reporting import expectations, new_model

OTHERS = ("tiny-a", "tiny-b")


def rows_text(version: str, per_model: dict[str, dict[str, str]]) -> str:
    lines = [f'vllm = "{version}"', 'platform = "cpu"', "", "[contracts]"]
    for model, rows in per_model.items():
        for cid, outcome in rows.items():
            lines.append(f'"{cid}[{model}]" = {{ outcome = "{outcome}", reason = "as written" }}')
    return "\n".join(lines) + "\n"


@pytest.fixture
def folder(tmp_path):
    """Two builds: on 0.16 no native export (n/a), on 0.17 the other models' native rows are native."""
    old = {"forward": "native", "embed": "shimmed", "native": "n/a"}
    new = {"forward": "native", "embed": "shimmed", "native": "native"}
    (tmp_path / "vllm-0.16.0-cpu.toml").write_text(rows_text("0.16.0", dict.fromkeys(OTHERS, old)))
    (tmp_path / "vllm-0.17.0-cpu.toml").write_text(rows_text("0.17.0", dict.fromkeys(OTHERS, new)))
    return tmp_path


def report(version: str, rows: dict[str, tuple[str, str]], e2e_failed: str | None = None) -> dict:
    return {
        "versions": {"vllm": version},
        "platform": {"device_type": "cpu"},
        "contracts": [{"contract": k, "outcome": o, "reason": r} for k, (o, r) in rows.items()],
        "e2e": [{"model": "tiny-new", "check": "states handed over", "result": "fail", "measured": e2e_failed}]
        if e2e_failed
        else [],
    }


OBSERVED = {
    "forward[tiny-new]": ("broken", "its layers return (output, input)"),
    "embed[tiny-new]": ("shimmed", "renamed"),
    "native[tiny-new]": ("n/a", "no export before 0.17"),
}


def test_observed_rows_are_written_as_observed_and_the_rest_predicted_by_rule(folder):
    written = new_model.write("tiny-new", [report("0.16.0", OBSERVED, "refused")], "a test family", base=folder)
    assert {p.name: (o, pr) for p, o, pr in written} == {
        "vllm-0.16.0-cpu.toml": (4, 0),
        "vllm-0.17.0-cpu.toml": (0, 4),
    }
    seen = expectations.load_file(folder / "vllm-0.16.0-cpu.toml")
    assert seen["forward[tiny-new]"].reason == "its layers return (output, input)", "the model's own reason"
    assert seen["e2e[tiny-new]"].outcome.value == "broken" and "refused" in seen["e2e[tiny-new]"].reason
    later = expectations.load_file(folder / "vllm-0.17.0-cpu.toml")
    # a break of the model's own stays broken; a row every other model moved (n/a -> native) moves with them
    assert later["forward[tiny-new]"].outcome.value == "broken"
    assert (
        later["native[tiny-new]"].outcome.value == "native"
        and "move from n/a to native" in later["native[tiny-new]"].reason
    )
    assert later["embed[tiny-new]"].outcome.value == "shimmed" and "stay shimmed" in later["embed[tiny-new]"].reason
    assert all(later[k].reason.startswith("PREDICTED") for k in later if k.endswith("[tiny-new]"))
    assert "observed on vLLM 0.16.0: broken (its layers return (output, input))" in later["forward[tiny-new]"].reason


def test_writing_again_replaces_the_models_rows_and_keeps_every_other(folder):
    first = report("0.16.0", OBSERVED)
    new_model.write("tiny-new", [first], "a test family", base=folder)
    again = {**OBSERVED, "forward[tiny-new]": ("native", "fixed")}
    new_model.write("tiny-new", [report("0.16.0", again), report("0.17.0", again)], "a test family", base=folder)
    for name in ("vllm-0.16.0-cpu.toml", "vllm-0.17.0-cpu.toml"):
        text = (folder / name).read_text()
        assert text.count('"forward[tiny-new]"') == 1 and text.count("# tiny-new: ") == 1
        table = expectations.load_file(folder / name)
        assert table["forward[tiny-new]"].outcome.value == "native" and "e2e[tiny-new]" not in table
        assert all(f"forward[{m}]" in table for m in OTHERS)


@pytest.mark.parametrize(
    "reports,says",
    [
        ([], "at least one report"),
        ([report("0.99.0", OBSERVED)], "no CPU expectations file"),
        ([report("0.16.0", {"forward[tiny-other]": ("native", "x")})], "observed no row of tiny-new"),
    ],
)
def test_a_report_that_cannot_give_the_rows_is_refused_and_nothing_is_written(folder, reports, says):
    before = {p.name: p.read_text() for p in folder.iterdir()}
    with pytest.raises(new_model.AddModelError, match=says):
        new_model.write("tiny-new", reports, "a test family", base=folder)
    assert {p.name: p.read_text() for p in folder.iterdir()} == before


def test_rows_that_assume_supports_eagle3_follow_the_class_mark_in_each_builds_sources():
    """C-eagle3 and native-eagle3 hold where vLLM marks the model's class SupportsEagle3, so a new model's rows on an
    unobserved build follow its own class's mark there, not what most other models did (which predicted Cohere's
    and Gemma-3's native-eagle3 rows native on 0.25, where a run showed them broken). The marks are read from the
    released sources (downloaded like the gate's), through vLLM's model registry."""
    from harness.reporting import class_marks

    assert class_marks.implements("0.25.0", "LlamaForCausalLM") is True
    assert class_marks.implements("0.25.0", "CohereForCausalLM") is False
    assert class_marks.implements("0.16.0", "DeepseekV3ForCausalLM") is False  # gained in 0.18
    assert class_marks.implements("0.25.0", "DeepseekV3ForCausalLM") is True
    from harness.envs import sources

    olmo2 = class_marks.registered(sources.ensure("0.32.0").root, "Olmo2ForCausalLM")
    assert olmo2 == ("vllm.model_executor.models.transformers", "TransformersForCausalLM"), olmo2
    assert class_marks.implements("0.25.0", "NoSuchModelForCausalLM") is None
    # native-eagle3 is the class check itself: where the export exists, the mark decides; before it, no say
    assert class_marks.predicted("native-eagle3", "n/a", True, False, False)[0] == "broken"
    assert class_marks.predicted("native-eagle3", "broken", True, False, True)[0] == "native"
    assert class_marks.predicted("native-eagle3", "n/a", False, False, True) is None
    # C-eagle3: the same mark keeps what was observed, a mark gained makes it native; a break of its own persists
    assert class_marks.predicted("eagle3", "shimmed", True, False, False)[0] == "shimmed"
    assert class_marks.predicted("eagle3", "shimmed", True, False, True)[0] == "native"
    assert class_marks.predicted("eagle3", "broken", True, False, True) is None
    assert class_marks.predicted("embed", "shimmed", True, False, True) is None  # not a marked row
    assert class_marks.predicted("eagle3", "shimmed", True, None, True) is None  # unknown: no say


def test_the_written_prediction_says_it_came_from_the_class_mark(tmp_path):
    """On 0.17 the other models' native-eagle3 rows are native (the export exists there): a model whose class lacks
    the mark there is predicted broken, saying why, not native as most moved."""
    old = dict.fromkeys(OTHERS, {"native-eagle3": "n/a"})
    (tmp_path / "vllm-0.16.0-cpu.toml").write_text(rows_text("0.16.0", old))
    (tmp_path / "vllm-0.17.0-cpu.toml").write_text(
        rows_text("0.17.0", dict.fromkeys(OTHERS, {"native-eagle3": "native"}))
    )
    rows = {"native-eagle3[tiny-new]": ("n/a", "no export before 0.17")}
    new_model.write("tiny-new", [report("0.16.0", rows)], "a test family", base=tmp_path, marked=lambda v: False)
    row = expectations.load_file(tmp_path / "vllm-0.17.0-cpu.toml")["native-eagle3[tiny-new]"]
    assert row.outcome.value == "broken" and "lacks SupportsEagle3" in row.reason, row
    new_model.write(
        "tiny-new", [report("0.16.0", rows)], "a test family", base=tmp_path, marked=lambda v: v != "0.16.0"
    )
    row = expectations.load_file(tmp_path / "vllm-0.17.0-cpu.toml")["native-eagle3[tiny-new]"]
    assert row.outcome.value == "native" and "carries SupportsEagle3" in row.reason, row

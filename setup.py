"""Packages of the wheel: `harness` and its subpackages, plus the data the installed harness reads (the tiny-model
fixtures, vLLM env pins, expectations, gate surfaces and allow-list) as `harness._fixtures`, and the conformance
suites as `harness/suites` (`harness run` runs them from there), each mapped from the checkout's folder so that the
checkout keeps one copy. Metadata lives in pyproject.toml."""

from setuptools import find_packages, setup

DATA = {"harness._fixtures": "fixtures", "harness.suites": "suites"}

setup(
    packages=find_packages(include=["harness", "harness.*"]) + list(DATA),
    package_dir=DATA,
    package_data={
        **{name: ["**/*.toml", "**/*.json", "**/*.txt", "**/*.py", "**/*.sh"] for name in DATA},
        "harness.reporting": ["templates/*.j2"],
        "harness.gpu": ["*.sh"],
    },
)

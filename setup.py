"""Packages of the wheel: `harness` and its subpackages, plus the data the installed harness reads (the tiny-model
fixtures, vLLM env pins, expectations, gate surfaces and allow-list) as `harness._fixtures`, mapped from the
checkout's fixtures/ folder so that the checkout keeps one copy. Metadata lives in pyproject.toml."""

from setuptools import find_packages, setup

DATA = {"harness._fixtures": "fixtures"}

setup(
    packages=find_packages(include=["harness", "harness.*"]) + list(DATA),
    package_dir=DATA,
    package_data={**{name: ["**/*.toml", "**/*.json", "**/*.txt", "**/*.py"] for name in DATA},
                  "harness.reporting": ["templates/*.j2"], "harness.gpu": ["*.sh"]},
)

"""Rerun the extraction-vs-prefill throughput benchmark in the current environment (needs vLLM).

    python benchmarks/extraction_vs_prefill.py [--model tiny-llama] [--repeats 3] [--env NAME]

Same as `python -m harness bench`: the shimmed speculators generator and LLM.generate(max_tokens=1)
on the same prompts and model, best of N each; prints tokens/s and the ratio, and writes
reports/<env>.bench.json (which the matrix report shows).
"""

import sys

from harness.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", *sys.argv[1:]]))

"""`python -m harness.gate.pin` as earlier docs and workflows run it: the module is harness.gate.obtain.pin."""

from harness.gate.obtain.pin import main, newest, pins, read  # noqa: F401 - the names it offered

if __name__ == "__main__":
    raise SystemExit(main())

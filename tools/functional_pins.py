"""Write tests/data/functional_pins.json: memlib's prediction for every functional test it expresses, to the byte.

Usage: ``PYTHONPATH=. python tools/functional_pins.py``.  tests/data/test_functional_tests.py compares memlib with this
file: a change of the model changes the pins, and the change must be looked at against the measured values (the
test prints the cases whose error moved).  Nothing here is tuned to the measurements.
"""
from __future__ import annotations

import json
from pathlib import Path

from memlib.scenarios.functional import validation

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "functional_pins.json"


def pins() -> dict:
    ok, no = validation()
    return {"expressed": {f"{c.golden.key}/{c.golden.file}": c.predicted for c in ok},
            "not_expressed": sorted(f"{n.golden.key}/{n.golden.file}" for n in no)}


if __name__ == "__main__":
    OUT.write_text(json.dumps(pins(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(OUT)

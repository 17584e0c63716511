"""The counts docs/design.md states about the code are the code's: the converter zoo's size
(and the tracer table's denominators) and the optimizer table's rows. The functional table's
"every function" is tests/test_nn_functional.py's own test."""

import re
from pathlib import Path

from convert_zoo import ZOO
from optim_table import CASES

DESIGN = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()


def _one(pattern: str) -> re.Match:
    found = list(re.finditer(pattern, DESIGN))
    assert len(found) == 1, f"docs/design.md: expected one sentence matching {pattern!r}, found {len(found)}"
    return found[0]


def test_the_tracer_measurement_covers_the_whole_zoo():
    stated = _one(r"\(`python benchmarks/tracers\.py`, (\d+) models of tests/convert_zoo\.py\)")
    assert int(stated[1]) == len(ZOO), (
        f"docs/design.md says {stated[1]} zoo models, tests/convert_zoo.py has {len(ZOO)}")
    table = DESIGN[stated.end():].split("\n\n", 2)[1]
    fractions = re.findall(r"\| (\d+)/(\d+) \|", table)
    assert len(fractions) == 3, table
    for traced, total in fractions:
        assert int(total) == len(ZOO) and int(traced) <= len(ZOO), (
            f"the tracer table says {traced}/{total}; the zoo has {len(ZOO)} models: "
            "rerun python benchmarks/tracers.py")


def test_the_optimizer_table_row_count():
    stated = _one(r"The table test trains (\d+) optimizer/scheduler/group rows")
    assert int(stated[1]) == len(CASES), f"docs/design.md says {stated[1]} rows, tests/optim_table.py has {len(CASES)}"

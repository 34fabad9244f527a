"""A finished run's report: plots, report.html, gates and the benchmark log (`va-bench report`)."""

from pathlib import Path

# The gates file this project keeps for its reference box, shipped as an example for users to copy
EXAMPLE_GATES = Path(__file__).resolve().parent / "gates_example.yaml"

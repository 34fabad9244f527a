"""The shape of the code, read from the code itself (its AST): layers, cycles, where files are written and read.

The layer order is written once, here (docs/design.md describes each layer): a module may import its own package
and any package on a lower layer, never a package on its own layer or above. Imports inside functions count too.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "harness"

# Top to bottom. A unit is `harness.<name>` (a package or a module); "" is the package's own __init__.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__",),
    ("cli", "bench"),
    ("views",),
    ("fleet",),
    ("run",),
    ("report", "pipeline"),
    ("backends", "models"),
    ("detector",),
    ("results",),
    ("measure",),
    ("data", "config", "eval"),
    ("storage",),
    ("records", "hardware", "catalogue", "files", "process_exit", "collector", "build_info", "figures", "json_stream",
     "locks", "shell", ""),
    ("errors",),
)
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(HARNESS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_files() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(HARNESS.rglob("*.py"))}


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The harness modules `path` imports (anywhere in the file): `from a.b import c` is a.b.c when that is a
    module, else a.b."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "harness")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "harness":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m != name}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(path, modules) for name, path in modules.items()}


def test_every_unit_has_a_layer():
    units = {unit_of(m) for m in module_files()}
    assert units <= set(LAYER_OF), f"give these a layer in LAYERS (and docs/design.md): {sorted(units - set(LAYER_OF))}"


def test_no_import_climbs_a_layer_or_crosses_to_a_peer():
    wrong = []
    for module, targets in import_graph().items():
        unit = unit_of(module)
        for target in targets:
            other = unit_of(target)
            if other != unit and LAYER_OF[other] <= LAYER_OF[unit]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports against the layer order:\n" + "\n".join(sorted(wrong))


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    # a package's __init__ importing its own submodules and back is Python's package mechanism, not a cycle of design
    cycles = [c for c in cycles if not all(unit_of(m) == unit_of(c.split(" -> ")[0]) for m in c.split(" -> "))
              or not any(m.count(".") == 1 and (HARNESS / m.split(".")[1] / "__init__.py").exists()
                         for m in c.split(" -> "))]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                yield node, f"{func.value.id}.{func.attr}"
            elif isinstance(func, ast.Name):
                yield node, func.id
            if isinstance(func, ast.Attribute) and func.attr == "rename":  # a Path's too: `(dir / "x").rename(...)`
                yield node, ".rename"


ATOMIC_WRITE_CALLS = {"os.replace", "os.rename", ".rename", "shutil.move", "tempfile.mkstemp",
                      "tempfile.NamedTemporaryFile", "mkstemp", "NamedTemporaryFile"}


def test_renames_and_temporary_files_are_written_in_the_files_module_only():
    """Every final file appears by one rename of a complete temp file: that logic lives in harness/files.py."""
    wrong = []
    for name, path in module_files().items():
        if name == "harness.files":
            continue
        for node, call in _calls(ast.parse(path.read_text())):
            if call in ATOMIC_WRITE_CALLS:
                wrong.append(f"{path.relative_to(HARNESS.parent)}:{node.lineno}: {call}")
    assert not wrong, "write through harness/files.py instead:\n" + "\n".join(wrong)


# The names of what a finished run or a submissions folder holds: only the reader opens them.
RESULT_FILE_NAMES = {"run.json", "submissions", "RUN_FILE", "SUBMISSIONS_DIR", "CAMPAIGN_FILE", "campaign.json"}


def test_run_folders_and_submissions_are_read_in_the_reader_only():
    """Finished runs and submission files are read through harness/results/reader.py (one idea of a cell, one
    "latest wins", one set of size caps); writers name them too, so only reads are checked."""
    allowed = {"harness.results.reader"}
    wrong = []
    for name, path in module_files().items():
        if name in allowed:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "read_text", "read_bytes", "glob", "rglob", "iterdir", "open"):
                text = ast.unparse(node.func.value)
                if any(f'"{n}"' in text or f"'{n}'" in text or n in text.split() or f"/ {n}" in text
                       for n in RESULT_FILE_NAMES):
                    wrong.append(f"{path.relative_to(HARNESS.parent)}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not wrong, "read these through harness/results/reader.py:\n" + "\n".join(wrong)


# The process state a module may rebind (`global`), each a fact of the process, never a run's option: whether the
# built-in backends are registered, whether this process connected Ray, TF32 as the process found it.
PROCESS_GLOBALS = {("harness.backends", "_builtins_loaded"), ("harness.fleet.driver", "_CONNECTED_HERE"),
                   ("harness.measure.env", "_TF32_AS_FOUND")}


def test_no_module_level_mutable_options_state():
    """Options travel as values: no module rebinds a global other than the process state above, and no
    module-level name holds options or a configuration."""
    wrong = []
    for name, path in module_files().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                wrong.extend(f"{name}: global {n}" for n in node.names if (name, n) not in PROCESS_GLOBALS)
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Name) and not target.id.isupper() and any(
                        word in target.id.lower() for word in ("option", "config")):
                    wrong.append(f"{name}: {target.id} = ...")
    assert not wrong, "options as module state:\n" + "\n".join(wrong)


@pytest.mark.parametrize("unit", ["backends", "models"])
def test_families_and_backends_meet_only_in_the_detector_contract(unit):
    other = {"backends": "models", "models": "backends"}[unit]
    wrong = [f"{m} -> {t}" for m, targets in import_graph().items() if unit_of(m) == unit
             for t in targets if unit_of(t) == other]
    assert not wrong, "\n".join(wrong)


def test_every_data_file_of_the_package_is_installed_with_it():
    """A file the harness reads beside its code (catalogues, schemas, id lists) ships in the wheel: each is matched
    by pyproject's package-data, and no module reads such a file from the checkout outside the package."""
    pyproject = (HARNESS.parent / "pyproject.toml").read_text()  # tomllib is 3.11+; the project runs on 3.10
    listed = re.search(r"\[tool\.setuptools\.package-data\]\nharness = \[(.*?)\]", pyproject, re.S)[1]
    patterns = re.findall(r'"([^"]+)"', listed)
    data = [p.relative_to(HARNESS).as_posix() for p in HARNESS.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert data, "expected the catalogues among the package's files"
    missing = [d for d in data if not any(fnmatch.fnmatch(d, pattern) for pattern in patterns)]
    assert not missing, f"add to [tool.setuptools.package-data] in pyproject.toml: {missing}"
    outside = []
    for name, path in module_files().items():
        if name == "harness.build_info":  # the one module that knows the checkout (and says when there is none)
            continue
        file_paths = r"Path\(__file__\)(?:\.resolve\(\))?((?:\.parent(?!s))*)(?:\.parents\[(\d+)\])?"
        for parents, index in re.findall(file_paths, path.read_text()):
            folder = path
            for _ in range(parents.count(".parent")):
                folder = folder.parent
            folder = folder.parents[int(index)] if index else folder
            if not folder.is_relative_to(HARNESS):
                outside.append(f"{name}: {folder}")
    assert not outside, "read data files from inside harness/ (the package), not the checkout (harness.build_info " \
                        "says where that is, when there is one):\n" + "\n".join(outside)


def test_the_glibc_settings_a_run_advises_are_the_makefiles():
    from harness.measure.env import RECOMMENDED_GLIBC_TUNABLES

    makefile = (HARNESS.parent / "Makefile").read_text()
    assert f"export GLIBC_TUNABLES ?= {RECOMMENDED_GLIBC_TUNABLES}\n" in makefile


def test_every_runtime_that_needs_packages_names_an_extra_that_installs_them():
    """A missing runtime package's line says `pip install 'va-bench[EXTRA]'`: that extra exists and lists them."""
    from harness.backends.support import BUILTINS

    pyproject = (HARNESS.parent / "pyproject.toml").read_text()
    extras = dict(re.findall(r"^([a-z]+) = \[(.*?)\]", pyproject.split("[project.optional-dependencies]")[1]
                             .split("\n[")[0], re.M | re.S))
    for name, entry in BUILTINS.items():
        if entry.packages:
            assert entry.extra in extras, f"{name}: extra {entry.extra!r} not in pyproject.toml"
            listed = extras[entry.extra].replace("-", "_").lower()
            assert all(p.lower() in listed for p in entry.packages), (name, entry.packages, listed)
    runtimes = [p.strip() for extra in ("openvino", "ncnn", "litert") for p in extras[extra].split(",")]
    assert [p.strip() for p in extras["edge"].split(",")] == runtimes  # `edge` is the three, nothing else

"""The layout's rules (docs/architecture.md), read from the source: the library never imports the command line, its
modules import each other in no circle, the config leaves load without torch, and the library reads no TFCLI_*
variable but its documented test hook."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tfcli"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every tfcli module and the tfcli modules it imports, at its top or inside a function."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)  # `from tfcli import checkpoint`
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_no_library_module_imports_the_command_line():
    for name, deps in _imports().items():
        if not name.startswith("tfcli.cli") and name != "tfcli.__main__":  # `python -m tfcli` is the command line
            assert not any(d.startswith("tfcli.cli") for d in deps), name


def test_the_modules_import_each_other_in_no_circle():
    """One arrow runs back up on purpose: `tfcli/__init__.py` loads tfcli.api lazily (`tfcli.load`), and so does
    every package's __init__ that only hands names on: those are left out."""
    graph = {name: {d for d in deps if d != "tfcli"} for name, deps in _imports().items() if name != "tfcli"}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                raise AssertionError(" -> ".join(path[path.index(dep):] + [dep]) if dep in path else dep)
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_config_leaves_and_the_checkpoint_format_load_without_torch():
    leaves = ["tfcli.model.config", "tfcli.data.config", "tfcli.train.config", "tfcli.generate.config",
              "tfcli.evaluate.config", "tfcli.checkpoint_meta", "tfcli.cli"]
    code = f"import sys\nfor m in {leaves!r}: __import__(m)\nprint(sorted(x for x in ('torch', 'sacrebleu') if x in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_library_reads_no_tfcli_variable_but_its_test_hook():
    for path in PACKAGE.rglob("*.py"):
        if "cli" in path.relative_to(PACKAGE).parts[:1]:
            continue  # the command line's own: TFCLI_DEBUG
        names = set(re.findall(r"TFCLI_[A-Z_]+", path.read_text(encoding="utf-8")))
        assert names <= {"TFCLI_FAIL_AT"}, (path, names)


def test_no_library_function_is_longer_than_60_lines():
    """Each function of the library reads in one sitting: at most 60 lines of body (docstring excluded); a longer
    one is several steps that want names of their own."""
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body[1:] if ast.get_docstring(node) is not None else node.body
                if body and node.end_lineno - body[0].lineno + 1 > 60:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert not long, long


def test_benchmark_results_hold_current_figures_without_machine_paths():
    """benchmarks/results holds each benchmark's current figure, the one README and docs cite: no folders of
    before/after snapshots (a comparison goes in the commit message), and no absolute path of the machine that
    wrote it (benchmarks/common.portable, which write_results applies)."""
    results = PACKAGE.parent / "benchmarks" / "results"
    machine_path = re.compile(r"(?<![\w.~-])/(work|tmp|home|root|mnt|opt|srv|scratch|Users)/")
    for path in results.iterdir():
        assert path.is_file(), f"{path}: a folder in benchmarks/results"
        assert not re.search(r"_(before|after|compare)\d*\.", path.name), f"{path}: a before/after snapshot"
        text = path.read_text(encoding="utf-8")
        found = machine_path.search(text)
        assert found is None, f"{path}: a machine path at {text[found.start():found.start() + 60]!r}"


# What tools beside the library (benchmarks/) may import: the Python API, and the named entry points below, each
# handed out by its package (docs/architecture.md, "Entry points"); the rest of the library may change shape freely.
ENTRY_POINTS = {
    "tfcli": {"load", "score", "Translator", "Generator", "Translation", "Score"},
    "tfcli.runtime": {"tune_process", "keep_freed_memory"},
    "tfcli.model": {"ModelConfig", "preset", "build_model", "count_parameters"},
    "tfcli.checkpoint": {"save", "load", "tokenizer"},
    "tfcli.checkpoint_meta": {"resolve", "read_meta", "model_config"},
    "tfcli.interop": {"export", "import_model"},
    "tfcli.data": {"load_tokenizer", "encode_batch", "decode_batch", "source_ids", "pad", "token_batches",
                   "collate_seq2seq", "PreparedData"},
    "tfcli.train": {"Objective", "Batch", "ParallelData", "new_profiler", "op_table", "gpu_peak_flops"},
    "tfcli.specials": {"BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "SPECIAL_TOKENS"},
    "tfcli.errors": {"TfcliError"},
    "tfcli.io": {"atomic_write_text"},
    "tfcli.formats": {"read_xml", "read_html", "Markup", "placeholder_pattern"},
}
# switches a benchmark flips in a process of its own (`python -c "import tfcli.x as m; m.NAME = ...; <the command>"`)
# to measure what the choice behind each buys
SWITCHES = {
    "tfcli.runtime": {"keep_freed_memory"},
    "tfcli.train.trainer": {"fused_adamw"},
    "tfcli.model.linear": {"CPU_BF16_ROWS"},
    "tfcli.generate.native": {"fp32_kernel"},
}


def _uses(path: Path) -> set[tuple[str, str | None]]:
    """(module, name) for each tfcli name a file imports, (module, None) for a module imported whole. In code run in
    a subprocess (`python -c "import tfcli.x as m; m.NAME = ..."`), (module, NAME) for each switch it flips."""
    source = path.read_text(encoding="utf-8")
    trees = [ast.parse(source)]
    found = set()
    for code in re.findall(r'"((?:import|from) [\w.]+[ ,;][^"]*tfcli[^"]*)"', source):
        try:
            tree = ast.parse(code.replace("; ", "\n"))
        except SyntaxError:  # words, not code
            continue
        switched = {a.asname: a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names if a.asname}
        found.update((switched[n.value.id], n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                     and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name) and n.value.id in switched)
        trees.append(ast.Module([n for n in tree.body if not (isinstance(n, ast.Import) and n.names[0].asname)], []))
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.Import):
            found.update((a.name, None) for a in node.names if a.name.split(".")[0] == "tfcli")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tfcli":
            for a in node.names:  # `from tfcli import checkpoint` imports a module whole
                whole = node.module == "tfcli" and f"tfcli.{a.name}" in ENTRY_POINTS
                found.add((f"tfcli.{a.name}", None) if whole else (node.module, a.name))
    return found


def test_benchmarks_use_only_the_api_and_the_named_entry_points():
    """The benchmarks are users: they measure what the API and the entry points give, so that the library's inside
    changes without them (and they never import the command line's modules)."""
    benchmarks = PACKAGE.parent / "benchmarks"
    wrong = []
    for path in sorted(benchmarks.glob("*.py")):
        for module, name in _uses(path):
            allowed = ENTRY_POINTS.get(module, set()) | SWITCHES.get(module, set())
            if not allowed or (name is not None and name not in allowed) or (name is None and module in SWITCHES):
                wrong.append(f"{path.name}: {module}" + (f".{name}" if name else ""))
    assert not wrong, wrong
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    for module, names in ENTRY_POINTS.items():  # each is there and documented
        loaded = __import__(module, fromlist=["_"])
        assert all(hasattr(loaded, n) for n in names) and f"`{module}`" in doc, module
        assert all(f"`{n}`" in doc for n in names), module
    for module, names in SWITCHES.items():
        loaded = __import__(module, fromlist=["_"])
        assert all(hasattr(loaded, n) and f"`{module}.{n}`" in doc for n in names), module


def test_the_api_uses_the_library_through_public_names_only():
    """tfcli/api.py is a face on the library, as the command line is: it imports no private name (`_x`) of it."""
    private = []
    for node in ast.walk(ast.parse((PACKAGE / "api.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfcli"):
            private += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not private, private

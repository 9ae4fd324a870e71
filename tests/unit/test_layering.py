"""ARCHITECTURE §2: imports point down. Parses every import under gcache/ with ast."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "gcache"
BANNED = {
    "server": ("gcache.sdk", "gcache.kv", "gcache.master", "gcache.cli", "gcache_sglang",
               "gcache_vllm", "torch"),
    "master": ("gcache.sdk", "gcache.kv", "gcache.server", "gcache.transport", "gcache.cli"),
    "sdk": ("gcache.server", "gcache.master", "gcache.kv", "gcache.cli", "gcache_sglang",
            "gcache_vllm"),
    "transport": ("gcache.server", "gcache.master", "gcache.sdk", "gcache.kv", "gcache.cli"),
    "kv": ("gcache.server", "gcache.master", "gcache.router", "gcache.cli", "gcache.transport",
           "gcache_sglang", "gcache_vllm"),
    # the command line drives every layer, but never an engine's plugin or torch at import,
    # and runs servers only as processes (what it shares with them lives below both)
    "cli": ("gcache.server", "gcache_sglang", "gcache_vllm", "torch"),
    "router": ("gcache.server", "gcache.master", "gcache.transport", "gcache.cli",
               "gcache_sglang", "gcache_vllm"),
    "files": ("gcache.server", "gcache.master", "gcache.transport", "gcache.kv",
              "gcache.router", "gcache.cli", "gcache_sglang", "gcache_vllm"),
    "mm": ("gcache.server", "gcache.master", "gcache.transport", "gcache.kv", "gcache.files",
           "gcache.router", "gcache.cli", "gcache_sglang", "gcache_vllm"),
}
# ``gcache/__init__.py`` re-exports the SDK lazily (importing a lower layer must not import it)
PACKAGE_INIT_ALLOWED = ("typing",)
TOP_LEVEL_ALLOWED = ("gcache.config", "gcache.config_loader", "gcache.errors", "gcache.keys",
                     "gcache.documents", "gcache.frame", "gcache.buffer", "gcache.outcomes",
                     "gcache.placement", "gcache.master_client", "gcache.proto",
                     "gcache.eviction", "gcache.record_layout")


def imports(path: pathlib.Path, *, top_level_only: bool = False):
    """(line, module) of every import in ``path``; a relative import reads as ".": none is
    allowed, so that every import names the layer it reaches."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, "." if node.level else node.module


def test_packages_import_only_downwards():
    bad = []
    for package, banned in BANNED.items():
        for path in (ROOT / package).rglob("*.py"):
            bad += [f"{path}:{line} imports {name}" for line, name in imports(path)
                    if any(name == b or name.startswith(b + ".") for b in banned)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", sorted(p.name for p in ROOT.glob("*.py")
                                         if p.name != "__init__.py"))
def test_top_level_modules_import_only_each_other(path):
    bad = [f"{path}:{line} imports {name}" for line, name in imports(ROOT / path)
           if name.startswith("gcache") and not any(name == a or name.startswith(a + ".")
                                                    for a in TOP_LEVEL_ALLOWED)]
    assert not bad, bad


def test_no_relative_imports():
    bad = [f"{path}:{line}" for path in ROOT.rglob("*.py") for line, name in imports(path)
           if name == "."]
    assert not bad, bad


def test_the_package_init_imports_nothing_of_gcache_at_import_time():
    bad = [f"__init__.py:{line} imports {name}"
           for line, name in imports(ROOT / "__init__.py", top_level_only=True)
           if name not in PACKAGE_INIT_ALLOWED and name != "__future__"]
    assert not bad, bad


def test_importing_the_server_does_not_import_the_sdk():
    import subprocess
    import sys
    code = "import sys, gcache.server; print('gcache.sdk' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


CONNECTORS = pathlib.Path(__file__).resolve().parents[2] / "connectors"


def test_connectors_use_only_the_public_names_of_gcache_kv():
    """ARCHITECTURE §2: a connector translates engine calls into gcache.kv calls (and, for the
    vLLM model loader of issue 24, gcache.files calls; for encoder outputs, gcache.mm calls); it
    reaches nothing else of GCache, and only the names those packages export."""
    import gcache.files
    import gcache.kv
    import gcache.mm
    public = {"gcache.kv": set(gcache.kv.__all__), "gcache.files": set(gcache.files.__all__),
              "gcache.mm": set(gcache.mm.__all__)}
    bad = []
    packages = [p for p in CONNECTORS.glob("*/gcache_*") if p.is_dir()]
    assert packages, "no connector package found"
    for package in packages:
        for path in package.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    bad += [f"{path}:{node.lineno} imports {a.name}" for a in node.names
                            if a.name.startswith("gcache.") or a.name == "gcache"]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                        and (node.module == "gcache" or node.module.startswith("gcache.")):
                    if node.module not in public:
                        bad.append(f"{path}:{node.lineno} imports {node.module}")
                        continue
                    bad += [f"{path}:{node.lineno} imports {node.module}.{a.name} (not "
                            "exported)" for a in node.names if a.name not in public[node.module]]
    assert not bad, "\n".join(bad)

"""The wheel ships the kernels as `oscar_sgl.kernels` and never a top-level `triton_kernels`
(SGLang imports the real package of that name for MoE), and the CPU-serving `sgl_kernel` stand-in
only under `oscar_sgl/_cpu_stand_in/`, never as a top-level `sgl_kernel`."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel CI installed (OSCAR_SGL_WHEEL), else one built now with maturin."""
    env = os.environ.get("OSCAR_SGL_WHEEL")
    if env:
        return Path(env)
    out = tmp_path_factory.mktemp("wheel")
    maturin = Path(sys.executable).with_name("maturin")
    subprocess.run([str(maturin), "build", "--release", "--quiet", "-o", str(out)], cwd=ROOT, check=True, timeout=900)
    return next(out.glob("oscar_sgl-*.whl"))


def test_kernel_sources_have_no_package_marker_at_top_level():
    # Without __init__.py a stray `triton_kernels` folder on sys.path can never shadow the real
    # (regular) package: Python prefers a regular package found anywhere on the path.
    assert not (ROOT / "triton_kernels" / "__init__.py").exists()


def test_every_kernel_module_is_linked_into_the_package():
    sources = sorted(p.name for p in (ROOT / "triton_kernels").glob("*.py"))
    assert sources, "no kernel sources"
    pkg = ROOT / "python" / "oscar_sgl" / "kernels"
    for name in sources:
        link = pkg / name
        assert link.is_symlink(), f"{link} must be a symlink to triton_kernels/{name}"
        assert link.resolve() == (ROOT / "triton_kernels" / name).resolve()
    assert (pkg / "__init__.py").is_file() and not (pkg / "__init__.py").is_symlink()


def test_wheel_layout(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"oscar_sgl", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    assert not any(n.startswith(("triton_kernels", "sgl_kernel")) for n in names)
    # The stand-in folder is no package (no __init__.py): only `oscar-sgl serve` puts it on a path.
    assert "oscar_sgl/_cpu_stand_in/sgl_kernel/__init__.py" in names
    assert not any(n.startswith("oscar_sgl/_cpu_stand_in/") and n.count("/") < 3 for n in names)
    assert "oscar_sgl/serve.py" in names
    for src in (ROOT / "triton_kernels").glob("*.py"):
        assert f"oscar_sgl/kernels/{src.name}" in names
    assert "oscar_sgl/data/emma_opening.txt" in names
    assert any(n.startswith("oscar_sgl/_core") for n in names)


def test_installed_wheel_imports_kernels_but_no_top_level_triton_kernels_or_sgl_kernel(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(target), str(wheel)],
                   check=True, timeout=300)
    code = (
        "import importlib.util, sys, oscar_sgl, oscar_sgl.kernels, oscar_sgl._core, oscar_sgl.serve;"
        f"assert oscar_sgl.__file__.startswith({str(target)!r}), oscar_sgl.__file__;"
        f"assert str(oscar_sgl.serve.STAND_IN_ROOT).startswith({str(target)!r});"
        "assert (oscar_sgl.serve.STAND_IN_ROOT / 'sgl_kernel' / '__init__.py').is_file();"
        "specs = [importlib.util.find_spec(n) for n in ('triton_kernels', 'sgl_kernel')];"
        f"assert not any(s and str(s.origin or list(s.submodule_search_locations or [])).startswith({str(target)!r}) for s in specs), specs;"
        "print('ok', specs)"
    )
    # A neutral working directory: the checkout is not on sys.path, only the installed wheel.
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(target)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")


def test_import_needs_neither_sglang_nor_transformers():
    code = (
        "import sys\n"
        "for name in ('sglang', 'transformers', 'triton'):\n"
        "    sys.modules[name] = None  # any import of them now raises ImportError\n"
        "import oscar_sgl\n"
        "from oscar_sgl import OscarConfig, reference\n"
        "print(OscarConfig(bits=4).effective_bits(8, 128))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "5.015625"


def _module_level_imports(root: Path) -> dict[str, set[str]]:
    """The package's modules and, for each, the package modules it imports at module level (imports
    inside functions and under ``if TYPE_CHECKING:`` run later or never, so they cannot cycle)."""
    import ast

    files = {".".join(f.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): f
             for f in root.rglob("*.py")}  # fmt: skip
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        pkg = name if f.stem == "__init__" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                continue
            for n in node.body if isinstance(node, ast.If) else [node]:
                if isinstance(n, ast.ImportFrom):
                    base = pkg.split(".")[: len(pkg.split(".")) - n.level + 1] if n.level else []
                    mod = ".".join(base + ([n.module] if n.module else []))
                    deps |= {f"{mod}.{a.name}" if f"{mod}.{a.name}" in files else mod for a in n.names}
                elif isinstance(n, ast.Import):
                    deps |= {a.name for a in n.names}
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def test_no_import_cycle():
    """No module of ``oscar_sgl`` (the kernels included) imports, at module level, a module that
    imports it back (directly or through others)."""
    graph = _module_level_imports(ROOT / "python" / "oscar_sgl")
    assert "oscar_sgl.kernels.decode" in graph and "oscar_sgl.sglang.pool" in graph
    assert "oscar_sgl.kernels.common" in graph["oscar_sgl.kernels.decode"]  # the parser sees relative imports
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            assert state.get(d) != 1, f"import cycle: {' -> '.join([*path[path.index(d):], m, d])}"
            if d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])

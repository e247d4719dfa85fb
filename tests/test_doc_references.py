"""Every `docs/<page>.md` a source file, test, bench or script cites exists, and so does every
section it names (`§4`, `§2.4` = item 4 of section 2, `section 3`)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ["python", "triton_kernels", "rust", "tests", "benches", "scripts", "README.md"]
CITATION = re.compile(r"docs/([\w-]+\.md)((?:[ ,\-]*(?:§ ?|section )\d+(?:\.\d+)?)*)")
SECTION = re.compile(r"(?:§ ?|section )(\d+)(?:\.(\d+))?")


def _sources() -> list[Path]:
    files = []
    for name in SCANNED:
        top = ROOT / name
        for path in [top] if top.is_file() else top.rglob("*"):
            if path.suffix in {".py", ".pyi", ".rs", ".sh", ".md", ".toml"} and "target" not in path.parts:
                files.append(path)
    return files


def _sections(page: Path) -> dict[int, str]:
    """Section number -> its text, from the `## N. Title` headings."""
    parts = re.split(r"^#+ (\d+)\. .*$", page.read_text(), flags=re.M)
    return {int(num): body for num, body in zip(parts[1::2], parts[2::2])}


def test_cited_docs_and_sections_exist():
    bad, cited = [], 0
    for path in _sources():
        for m in CITATION.finditer(path.read_text(errors="replace")):
            cited += 1
            where = f"{path.relative_to(ROOT)}: docs/{m.group(1)}{m.group(2)}"
            page = ROOT / "docs" / m.group(1)
            if not page.is_file():
                bad.append(f"{where} (no such page)")
                continue
            sections = _sections(page)
            for sec, item in SECTION.findall(m.group(2)):
                body = sections.get(int(sec))
                if body is None or (item and not re.search(rf"^\s*{item}\. ", body, flags=re.M)):
                    bad.append(f"{where} (no §{sec}{'.' + item if item else ''})")
    assert cited > 20, "the scan found (almost) no citations: is the pattern still right?"
    assert not bad, "\n".join(bad)

"""Every code block of README.md and docs/*.md runs, as a reader would run it.

Each fenced block is one test:

- ```python: in a fresh interpreter (this venv's), in a temporary folder, against a temporary
  SQLite MLflow store (``MLFLOW_TRACKING_URI``), strict mode on: exit 0;
- ```bash: ``bash -euo pipefail`` in the same kind of folder, with this venv's ``bin`` first
  on ``PATH`` (``python``, ``mlflow``, ``neuron-mlflow``): exit 0;
- ```yaml: a ``ProfilerConfig`` file, loaded and validated;
- ```text or a bare fence: output, layouts and usage synopses, not code: not run.

A block that cannot run here (a Trainium host, the package index, a benchmark) carries a
visible marker on the line before its fence, ``<!-- not run: <reason> -->``, and is reported
as skipped with that reason. Any other language is an error, so no block goes untested.

The temporary folder looks like the checkout's root for what the blocks use (``recipes/``,
``MLproject``, ``python_env.yaml`` linked in) and holds ``trace.json.gz``, a real trace from
``tests/data/traces`` (docs/cli.md's examples read it); whatever a block writes stays there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TRACE = ROOT / "tests" / "data" / "traces" / "cuda_alexnet_benchmark.json.gz"
LINKED = ("recipes", "MLproject", "python_env.yaml")  # what the blocks read from the checkout
TIMEOUT_S = 600

_FENCE = re.compile(r"^```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>.+?)\s*-->\s*$")
_RUN = {"python", "bash"}
_CHECKED = {"yaml"}
_NOT_CODE = {"", "text"}
# what makes a block slow here: Lightning's fit, the recipes, `mlflow run`
_SLOW = re.compile(r"\blightning\b|\brecipes/|\bmlflow run\b")


@dataclass(frozen=True)
class Block:
    document: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_run: str | None  # the marker's reason

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def blocks_in(document: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of ``document`` (or of ``text``, read as that document)."""
    if text is None:
        text = document.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _NOT_RUN.match(before)
        found.append(
            Block(
                document=document,
                line=line,
                lang=match["lang"],
                text=match["body"],
                not_run=marker["reason"] if marker else None,
            )
        )
    return found


BLOCKS = [block for document in DOCUMENTS for block in blocks_in(document)]


def _param(block: Block) -> object:
    marks = []
    if block.not_run is not None:
        marks.append(pytest.mark.skip(reason=f"{block.where}: not run: {block.not_run}"))
    elif _SLOW.search(block.text):
        marks.append(pytest.mark.slow)
    return pytest.param(block, id=block.where, marks=marks)


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    for name in LINKED:
        (work / name).symlink_to(ROOT / name)
    shutil.copy(TRACE, work / "trace.json.gz")
    return work


def _env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MLFLOW_", "NEURON_MLFLOW_", "PYTEST_"))
    }
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env["NEURON_MLFLOW_STRICT"] = "1"  # our own failures raise instead of warning
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing written into the linked recipes/
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _tail(output: str, chars: int) -> str:
    """The end of ``output``, without progress bars (MLflow's "Downloading artifacts")."""
    lines = [line for line in output.splitlines() if "\r" not in line and "it/s]" not in line]
    return "\n".join(lines)[-chars:]


def _failure(block: Block, result: subprocess.CompletedProcess[str]) -> str:
    return (
        f"the {block.lang} block at {block.where} exited {result.returncode}\n"
        f"--- block ---\n{block.text}"
        f"--- stdout (end) ---\n{_tail(result.stdout, 3000)}\n"
        f"--- stderr (end) ---\n{_tail(result.stderr, 6000)}"
    )


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if b.lang not in _NOT_CODE])
def test_code_block_runs(block: Block, tmp_path: Path) -> None:
    if block.lang == "yaml":
        data = yaml.safe_load(block.text)
        from neuron_mlflow import ProfilerConfig

        ProfilerConfig(**data)  # raises ConfigError naming what is wrong
        return
    assert block.lang in _RUN, (
        f"{block.where}: a ```{block.lang} block: neither run nor marked "
        f"'<!-- not run: <reason> -->'\n{block.text}"
    )
    work = _workdir(tmp_path)
    if block.lang == "python":
        (work / "block.py").write_text(block.text, encoding="utf-8")
        command = [sys.executable, "block.py"]
    else:
        command = ["bash", "-euo", "pipefail", "-c", block.text]
    try:
        result = subprocess.run(
            command,
            cwd=work,
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the block at {block.where} ran past {TIMEOUT_S} s\n{block.text}\n{exc}")
    assert result.returncode == 0, _failure(block, result)


def test_every_block_is_run_or_says_why_not() -> None:
    """Each document has blocks; a marker sits right before a fence; every language is known."""
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        fences = {b.line for b in blocks_in(document)}
        for number, line in enumerate(text.splitlines(), 1):
            if _NOT_RUN.match(line):
                assert number + 1 in fences, (
                    f"{document.relative_to(ROOT)}:{number}: a 'not run' marker that is not "
                    "right before a code block"
                )
    for block in BLOCKS:
        known = _RUN | _CHECKED | _NOT_CODE
        assert block.lang in known, f"{block.where}: unknown block language {block.lang!r}"
        if block.not_run is not None:
            assert block.lang in _RUN, f"{block.where}: only code is marked 'not run'"
    readme = [b for b in BLOCKS if b.document.name == "README.md"]
    assert sum(b.lang == "python" and b.not_run is None for b in readme) >= 3


def test_blocks_are_found() -> None:
    text = "x\n<!-- not run: no host -->\n```bash\nfalse\n```\n\n```python\nprint(1)\n```\n"
    found = [(b.lang, b.text, b.not_run, b.line) for b in blocks_in(ROOT / "README.md", text)]
    assert found == [("bash", "false\n", "no host", 3), ("python", "print(1)\n", None, 7)]


# Markdown links between the documents: the file exists, and so does the #anchor (GitHub's
# slugs: lowercase, punctuation dropped, spaces to hyphens).
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def _slug(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(document: Path) -> set[str]:
    text = _FENCE.sub("", document.read_text(encoding="utf-8"))
    return {_slug(m[1]) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_between_documents_resolve(document: Path) -> None:
    text = _FENCE.sub("", document.read_text(encoding="utf-8"))
    broken = []
    for match in _LINK.finditer(text):
        target = match["target"]
        if re.match(r"^[a-z]+:", target):  # http(s), mailto: not checked here
            continue
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert broken == [], f"{document.relative_to(ROOT)}: {broken}"

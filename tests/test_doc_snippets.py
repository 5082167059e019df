"""Every code block of README.md and docs/*.md runs (or says why not), so that the
documentation cannot drift from the code.

- ```python blocks run as programs: alone, or as 2 ranks under ``ringreduce launch -n 2``
  when they join a job (call ``init(`` or ``init_process_group(``). A block that imports
  an optional package (torch, jax, lightning, accelerate, torchft, ...) is skipped
  without it. A block whose first line is ``# NAME.py`` is also written to NAME.py, for
  the commands of its page to run.
- ```bash blocks: every command is either run (RUN: cheap and local, such as
  ``ringreduce --help`` or ``ringreduce model ...``) or listed in NOT_RUN with the reason.
  A command that is neither fails `test_every_command_is_run_or_excused`.
- ```console blocks: each ``$ command`` is a bash command that must be in RUN, and every
  line after it but ``...`` must appear in what it prints.
- ```text blocks are output and messages; MyST directives (```{toctree}) are not code.

Markers, on the lines just above a fence, in an HTML comment (invisible on GitHub and
in the Sphinx pages)::

    <!-- snippet: ranks=4 -->           run as 4 ranks (ranks=1: alone)
    <!-- snippet: needs=cuda -->        skipped unless a CUDA device is usable
    <!-- snippet: extended -->          run with --extended only (a slow block)
    <!-- snippet: skip: REASON -->      not run, for REASON (keep these few)
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PAGES = ["README.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
)

# Seconds one snippet or command may take (a rank group start, torch's import, ...).
TIMEOUT = 180

# What a command must look like to be run here (fullmatch, after its comment is
# stripped). The launch rule only runs programs written out on the same page.
RUN = [
    r"ringreduce (--version|--help|-h|info)",
    r"ringreduce (launch|bench|model) (-h|--help)",
    r"ringreduce model (?!.*--probe).*",  # arithmetic only; --probe times local ranks
    r"ringreduce launch -n \d+ -- python (?P<page_file>[\w-]+\.py)",
]

# Commands in the documentation that this test does not run, and why (re.search; the
# first that matches counts). Every entry must still match some command.
NOT_RUN = [
    (r"\bpip install\b", "installs packages: changes this environment and needs the network"),
    (r"\btrain\.py\b", "train.py stands for the reader's own program"),
    (
        r"\bexamples/",
        "the examples run in tests/test_usability.py, tests/test_trainers.py, "
        "tests/test_jax.py, tests/test_torch_init.py, tests/test_torchft.py and "
        "tests/test_elastic.py",
    ),
    (r"^(mpirun|srun) ", "needs mpirun or Slurm; tests/test_mpi*.py run programs under mpirun"),
    (r"^ringreduce bench ", "a benchmark: minutes on 2 cores; tests/test_bench.py runs it small"),
    (r"^(bash|python) bench/", "benchmarks and emulated hosts: minutes, and root for netns"),
    (r"^export ", "sets variables for the shell's later commands"),
    (r"^python -m pytest\b", "the test suite itself"),
]

# Imported name -> what must be installed for a block that uses it.
OPTIONAL = {
    "torch": "torch",
    "ringreduce.torch": "torch",
    "rr.torch": "torch",
    "jax": "jax",
    "lightning": "lightning",
    "accelerate": "accelerate",
    "torchft": "torchft",
    "ringreduce.torchft": "torchft",
    "rr.torchft": "torchft",
    "mpi4py": "mpi4py",
    "cupy": "cupy",
    "ml_dtypes": "ml_dtypes",
    "matplotlib": "matplotlib",
}

# Variables of a launcher this test may itself run under, which would make a snippet
# think it is one rank of that job.
_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
)


@dataclasses.dataclass
class Block:
    page: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: dict

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


_FENCE = re.compile(r"^(`{3,}|~{3,})\s*(\S*)")
_MARKER = re.compile(r"^<!--\s*snippet:\s*(.*?)\s*-->$")
_FILE_LINE = re.compile(r"#\s*([\w-]+\.py)\s*$")


def _parse_marker(text: str, where: str) -> dict:
    """'ranks=2 extended' -> {'ranks': '2', 'extended': True}; 'skip: why' -> {'skip': 'why'}."""
    if text.startswith("skip:"):
        reason = text[len("skip:") :].strip()
        assert reason, f"{where}: a skip marker needs a reason"
        return {"skip": reason}
    marker: dict = {}
    for word in text.split():
        key, _, value = word.partition("=")
        assert key in ("ranks", "needs", "extended"), f"{where}: marker {word!r}"
        marker[key] = value or True
    return marker


def blocks(page: str) -> list[Block]:
    """The fenced code blocks of a page, with their markers."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        lines = f.read().splitlines()
    found = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        marker: dict = {}
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        while j >= 0 and _MARKER.match(lines[j].strip()):
            marker.update(_parse_marker(_MARKER.match(lines[j].strip()).group(1), page))
            j -= 1
        found.append(Block(page, start + 1, lang, "\n".join(body) + "\n", marker))
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]


def page_files(page: str) -> dict:
    """The python blocks of a page that name a file (``# hello.py``): name -> code."""
    files = {}
    for b in ALL_BLOCKS:
        if b.page == page and b.lang == "python":
            m = _FILE_LINE.fullmatch(b.code.splitlines()[0]) if b.code.strip() else None
            if m:
                files[m.group(1)] = b.code
    return files


# ---- python blocks -------------------------------------------------------------


@dataclasses.dataclass
class Program:
    where: list  # every place the same program appears
    code: str
    ranks: int
    marker: dict


def programs() -> list[Program]:
    """One program per distinct python block (README and docs repeat a few)."""
    found: dict = {}
    for b in ALL_BLOCKS:
        if b.lang != "python":
            continue
        joins = re.search(r"\binit\(|\binit_process_group\(", b.code)
        ranks = int(b.marker.get("ranks", 2 if joins else 1))
        key = (b.code, ranks)
        if key in found:
            found[key].where.append(b.where)
        else:
            found[key] = Program([b.where], b.code, ranks, b.marker)
    return list(found.values())


def _requirements(code: str) -> list:
    """The optional packages a block needs: from its imports and ``rr.torch`` uses."""
    names = set(re.findall(r"^\s*(?:import|from)\s+([\w.]+)", code, re.M))
    names |= set(re.findall(r"\b(rr\.torch|rr\.torchft)\b", code))
    needed = set()
    for name in names:
        for candidate in (name, name.split(".")[0], ".".join(name.split(".")[:2])):
            if candidate in OPTIONAL:
                needed.add(OPTIONAL[candidate])
    return sorted(needed)


def _skip_if_missing(code: str) -> None:
    for module in _requirements(code):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module}: pip install {module}")


def _env() -> dict:
    return {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCHER_VARS and not k.startswith("RINGREDUCE_")
    }


def _run(argv: list, cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


def _params(items: list, ident) -> list:
    params = []
    for item in items:
        marks = []
        marker = item.marker if hasattr(item, "marker") else {}
        if marker.get("extended"):
            marks.append(pytest.mark.extended)
        params.append(pytest.param(item, id=ident(item), marks=marks))
    return params


@pytest.mark.parametrize("program", _params(programs(), lambda p: p.where[0]))
def test_python_block_runs(program: Program, tmp_path):
    if "skip" in program.marker:
        pytest.skip(program.marker["skip"])
    _skip_if_missing(program.code)
    if program.marker.get("needs") == "cuda":
        import ringreduce as rr

        if not rr.cuda_available():
            pytest.skip("needs a CUDA device")
    path = tmp_path / "snippet.py"
    path.write_text(program.code)
    argv = [sys.executable, str(path)]
    if program.ranks > 1:
        argv = [sys.executable, "-m", "ringreduce", "launch", "-n", str(program.ranks), "--"]
        argv += [sys.executable, str(path)]
    r = _run(argv, str(tmp_path))
    places = ", ".join(program.where)
    assert r.returncode == 0, f"{places}:\n{program.code}\n--- output:\n{r.stdout}\n{r.stderr}"


# ---- shell blocks --------------------------------------------------------------


@dataclasses.dataclass
class Command:
    block: Block
    text: str  # the command, its comment stripped
    expected: list  # console blocks: lines it must print
    marker: dict = dataclasses.field(default_factory=dict)


def _split(line: str) -> list:
    """The commands of one line: its ``# comment`` dropped (a # that starts a word,
    outside quotes), cut at ``&&`` and ``;``."""
    parts, quote, start = [], "", 0
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            line = line[:i]
            break
        elif ch == ";" or line.startswith("&&", i):
            parts.append(line[start:i])
            start = i + (2 if ch == "&" else 1)
    parts.append(line[start:])
    return [p.strip() for p in parts if p.strip()]


def commands() -> list[Command]:
    found = []
    for b in ALL_BLOCKS:
        if b.lang == "bash":
            logical = b.code.replace("\\\n", " ").splitlines()
            for line in logical:
                found += [Command(b, text, [], b.marker) for text in _split(line)]
        elif b.lang == "console":
            for line in b.code.splitlines():
                if line.startswith("$ "):
                    found += [Command(b, text, [], b.marker) for text in _split(line[2:])]
                elif line.strip() and line.strip() != "..." and found and found[-1].block is b:
                    found[-1].expected.append(" ".join(line.split()))
    return found


def classify(command: Command) -> tuple:
    """("run", None), ("not run", reason), or (None, None) for a command nobody decided on."""
    for pattern in RUN:
        m = re.fullmatch(pattern, command.text)
        if m and m.groupdict().get("page_file", "") in ("", *page_files(command.block.page)):
            return "run", None
    for pattern, reason in NOT_RUN:
        if re.search(pattern, command.text):
            return "not run", reason
    return None, None


def test_every_command_is_run_or_excused():
    undecided = [f"{c.block.where}: {c.text}" for c in commands() if classify(c)[0] is None]
    assert not undecided, (
        "commands in the documentation that this test neither runs (RUN) nor excuses "
        "(NOT_RUN, with the reason):\n" + "\n".join(undecided)
    )
    consoles = [c for c in commands() if c.block.lang == "console"]
    not_run = [f"{c.block.where}: {c.text}" for c in consoles if classify(c)[0] != "run"]
    assert not not_run, "console blocks show output, so their commands must run:\n" + "\n".join(
        not_run
    )


def test_every_excuse_is_still_needed():
    texts = [c.text for c in commands()]
    stale = [p for p, _ in NOT_RUN if not any(re.search(p, t) for t in texts)]
    assert not stale, f"NOT_RUN entries that match no command any more: {stale}"


def _argv(text: str) -> list:
    argv = shlex.split(text)
    if argv[0] == "ringreduce":
        argv[:1] = [sys.executable, "-m", "ringreduce"]
    return [sys.executable if a == "python" else a for a in argv]


def commands_to_run() -> list[Command]:
    """The commands that run, each once (README and docs repeat a few)."""
    found: dict = {}
    for c in commands():
        if classify(c)[0] == "run":
            files = tuple(sorted(page_files(c.block.page).items()))
            found.setdefault((c.text, tuple(c.expected), files), c)
    return list(found.values())


@pytest.mark.parametrize(
    "command", _params(commands_to_run(), lambda c: f"{c.block.where}: {c.text}")
)
def test_command_runs(command: Command, tmp_path):
    if "skip" in command.marker:
        pytest.skip(command.marker["skip"])
    for name, code in page_files(command.block.page).items():
        _skip_if_missing(code)
        (tmp_path / name).write_text(code)
    r = _run(_argv(command.text), str(tmp_path))
    assert r.returncode == 0, f"{command.block.where}: {command.text}\n{r.stdout}\n{r.stderr}"
    printed = {" ".join(line.split()) for line in (r.stdout + r.stderr).splitlines()}
    missing = [line for line in command.expected if line not in printed]
    assert not missing, (
        f"{command.block.where}: `{command.text}` no longer prints {missing}; it prints:\n"
        + r.stdout
    )


# ---- the pages themselves ------------------------------------------------------


def test_code_blocks_are_known_kinds():
    kinds = {"python", "bash", "console", "text"}
    odd = [
        f"{b.where}: ```{b.lang}"
        for b in ALL_BLOCKS
        if b.lang not in kinds and not b.lang.startswith("{")
    ]
    assert not odd, "code blocks this test does not know how to check:\n" + "\n".join(odd)


_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _relative_links(page: str) -> list:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"^(`{3,}).*?^\1", "", text, flags=re.M | re.S)  # not in code blocks
    targets = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#")[0])
    return targets


def test_relative_links_resolve():
    broken = []
    for page in PAGES:
        for target in _relative_links(page):
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target))
            if not os.path.exists(path):
                broken.append(f"{page}: {target}")
    assert not broken, "relative links to files that are not there:\n" + "\n".join(broken)


def test_readme_is_short():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        n = len(f.read().splitlines())
    assert n <= 300, f"README.md has {n} lines: reference material belongs in docs/"


def test_skips_are_few():
    skipped = [f"{b.where}: {b.marker['skip']}" for b in ALL_BLOCKS if "skip" in b.marker]
    assert len(skipped) <= 3, "blocks marked skip (run them instead):\n" + "\n".join(skipped)

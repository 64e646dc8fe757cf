"""The shell examples of a Markdown page, found and run in the order written (issue 12
item 2 for the README; issue 20 item 6 for every page under docs/). Shared by
tests/test_readme_examples.py and tests/test_docs_examples.py.

What counts as an example (docs/architecture.md, "Docs examples"):

- every line of a ```` ```bash ```` (or ``sh``) block; ``\\`` continues a line;
  ``for V in A B; do`` ... ``done`` runs its body once per word;
- a ``$ ``-prompted line in any other fenced block, or in a 4-space indented block; the
  lines after it, up to the next ``$ `` line, are its output. When that output holds
  ``moesim CMD: error: ...``, the example must exit with status 2 and print that line;
  otherwise it must exit 0;
- a fenced block whose info string names a file (```` ```yaml file=bad.yaml ````) is
  written to that file when reached (an input of a later example).

``a && b`` runs ``a`` then ``b``. ``moesim ...`` runs in-process (:func:`moesim.cli.main`);
``python benchmarks/X.py ...`` and other commands (``cp``, ``gzip``, ...) run in a
subprocess. Not run, each saying why: ``pip install`` (the reader's set-up),
``python -m pytest`` (the suite itself), an example marked ``# needs torch`` when torch
is missing, and one marked ``# needs the DeepSeek profile`` (that trace lives outside the
repository; the reader gives its path as ``PATH``), and a benchmark marked
``# takes minutes`` unless ``MOESIM_DOCS_HEAVY=1`` (the suite must stay under 15 minutes
on 2 cores; ``python benchmarks/regenerate_docs.py`` runs them). ``moesim record`` and
``record_sweep_study.py`` must carry the torch mark and ``PATH/`` the profile mark.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHELL_LANGS = {"bash", "sh", "shell"}
ERROR_LINE = re.compile(r"^moesim [\w-]+: error: .*")
TORCH_MARK = "needs torch"
PROFILE_MARK = "needs the DeepSeek profile"
HEAVY_MARK = "takes minutes"
GPU_MARK = "needs torch and a GPU"
HEAVY_ENV = "MOESIM_DOCS_HEAVY"
TORCH_REASON = "needs torch (pip install -e '.[torch]')"
PROFILE_REASON = ("needs DeepSeek's profile (train.json, outside the repository; the "
                  "reader gives its path as PATH)")


@dataclass
class Example:
    """One command of a page: ``line`` is where it starts (1-based); ``expect_error`` the
    documented error line (then exit status 2), else exit 0; ``file`` set for a block
    that writes an input file (``command`` is then its text)."""
    page: str
    line: int
    command: str
    expect_error: str | None = None
    file: str | None = None

    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def skip_reason(self) -> str | None:
        if self.file is not None:
            return None
        c = self.command
        reasons = {_part_skip(p) for p in c.split("&&")}
        if None not in reasons:
            return reasons.pop()
        if PROFILE_MARK in c:
            return PROFILE_REASON
        if TORCH_MARK in c and importlib.util.find_spec("torch") is None:
            return TORCH_REASON
        if GPU_MARK in c and not _cuda():
            return "needs torch with CUDA and a GPU"
        if HEAVY_MARK in c and not os.environ.get(HEAVY_ENV):
            return (f"a benchmark of minutes of CPU, beyond the suite's budget (run it, or "
                    f"set {HEAVY_ENV}=1)")
        return None

    def unmarked(self) -> str | None:
        """What mark this example lacks, if it needs one."""
        c = self.command
        if self.file is not None:
            return None
        if ("PATH/" in c or " PATH " in c) and PROFILE_MARK not in c:
            return f"'# {PROFILE_MARK}'"
        if (re.search(r"\bmoesim record\b", c) or "record_sweep_study" in c) \
                and TORCH_MARK not in c:
            return f"'# {TORCH_MARK}'"
        return None


def _cuda() -> bool:
    import torch  # only reached where torch is installed

    return bool(torch.cuda.is_available())


def _part_skip(part: str) -> str | None:
    """Why one part of ``a && b`` is not run (installing, or the suite itself)."""
    words = part.split()
    if words[:2] == ["pip", "install"] or words[:4] == ["python", "-m", "pip", "install"]:
        return "installs packages (the reader's set-up; the suite runs installed)"
    if words[:3] == ["python", "-m", "pytest"]:
        return "runs the test suite itself"
    return None


def _join_continued(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    cont = False
    for no, text in lines:
        if cont:
            out[-1] = (out[-1][0], out[-1][1][:-1].rstrip() + " " + text.strip())
        else:
            out.append((no, text))
        cont = out[-1][1].rstrip().endswith("\\")
    return out


def _expand_loops(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        no, text = lines[i]
        m = re.match(r"\s*for (\w+) in (.+?); do\s*$", text)
        if not m:
            out.append((no, text))
            i += 1
            continue
        var, words = m.group(1), shlex.split(m.group(2))
        j = next(k for k in range(i + 1, len(lines)) if lines[k][1].strip() == "done")
        for w in words:
            for bno, body in lines[i + 1:j]:
                out.append((bno, re.sub(r"\$\{?" + var + r"\}?\b", w, body.strip())))
        i = j + 1
    return out


def page_examples(path: Path) -> list[Example]:
    """The examples of one Markdown page, in order."""
    page = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    lines = path.read_text().splitlines()
    examples: list[Example] = []
    i = 0
    prev_blank = True
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):   # a fence, also one indented in a list item
            info = line.lstrip()[3:].strip().split()
            lang = info[0] if info else ""
            attrs = dict(a.split("=", 1) for a in info[1:] if "=" in a)
            j = next(k for k in range(i + 1, len(lines)) if lines[k].lstrip().startswith("```"))
            body = [(k + 1, lines[k]) for k in range(i + 1, j)]
            if "file" in attrs:
                examples.append(Example(page, i + 1, "\n".join(t for _, t in body) + "\n",
                                        file=attrs["file"]))
            elif lang in SHELL_LANGS:
                cmds = _expand_loops(_join_continued(
                    [(n, t) for n, t in body if t.strip() and not t.lstrip().startswith("#")]))
                examples += [Example(page, n, t.strip()) for n, t in cmds]
            else:
                indent = len(line) - len(line.lstrip())
                examples += _prompted(page, body, strip=indent)
            i = j + 1
            prev_blank = False
            continue
        if prev_blank and line.startswith("    ") and line.strip():
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            examples += _prompted(page, [(k + 1, lines[k]) for k in range(i, j)], strip=4)
            i = j
            prev_blank = False
            continue
        prev_blank = not line.strip()
        i += 1
    return examples


def _prompted(page: str, body: list[tuple[int, str]], strip: int) -> list[Example]:
    out: list[Example] = []
    body = [(n, t[strip:] if t[:strip].strip() == "" else t) for n, t in body]
    k = 0
    while k < len(body):
        n, t = body[k]
        if not t.startswith("$ "):
            k += 1
            continue
        cmd = t[2:]
        k += 1
        while cmd.rstrip().endswith("\\") and k < len(body):
            cmd = cmd.rstrip()[:-1].rstrip() + " " + body[k][1].strip()
            k += 1
        output = []
        while k < len(body) and not body[k][1].startswith("$ "):
            output.append(body[k][1].strip())
            k += 1
        err = next((o for o in output if ERROR_LINE.match(o)), None)
        out.append(Example(page, n, cmd.strip(), expect_error=err))
    return out


def fresh_folder(tmp: Path) -> Path:
    """A folder as a reader's clone has it: the shipped scenarios, topologies and
    benchmarks (linked) and a copy of traces/ (examples write next to recordings)."""
    for d in ("scenarios", "topologies", "benchmarks"):
        (tmp / d).symlink_to(ROOT / d, target_is_directory=True)
    shutil.copytree(ROOT / "traces", tmp / "traces")
    return tmp


@dataclass
class Ran:
    """One command run: its words, exit status and output."""
    argv: list[str]
    rc: int
    out: str
    err: str


def run_example(ex: Example, folder: Path, capsys) -> list[Ran]:
    """Run one example in ``folder`` (the current directory) and check its exit status
    and documented error line; return each command's result."""
    if ex.file is not None:
        (folder / ex.file).write_text(ex.command)
        return []
    ran = []
    for part in ex.command.split("&&"):
        words = shlex.split(part, comments=True)
        if not words or _part_skip(part):
            continue
        ran.append(_run_words(words, part, folder, capsys))
        r = ran[-1]
        want = 2 if ex.expect_error else 0
        assert r.rc == want, (f"{ex.where()}: {shlex.join(words)} -> exit {r.rc}, expected "
                              f"{want}: {(r.err or r.out).strip()[-800:]}")
    if ex.expect_error:
        # a shipped scenario named from another folder shows as ROOT/scenarios/...: the
        # page shows it as the reader sees it from the repository root
        err = ran[-1].err.replace(str(ROOT) + os.sep, "")
        got = [ln.strip() for ln in err.splitlines() if ERROR_LINE.match(ln.strip())]
        assert got == [ex.expect_error], (f"{ex.where()}: the page says\n  {ex.expect_error}\n"
                                          f"moesim printed\n  {got}")
    return ran


def _run_words(words: list[str], part: str, folder: Path, capsys) -> Ran:
    if words[0] == "moesim":
        from moesim.cli import main
        capsys.readouterr()
        rc = main(words[1:])
        out, err = capsys.readouterr()
        return Ran(words, rc, out, err)
    # anything else runs in bash, `python` being this interpreter
    env = dict(os.environ, MPLBACKEND="Agg",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(["bash", "-c", shlex.join(words) if words[0] == "python" else part],
                       cwd=folder, env=env, capture_output=True, text=True,
                       timeout=1800)   # catches a hang only
    return Ran(words, p.returncode, p.stdout, p.stderr)


PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b|\[")


def hidden_commands(path: Path) -> list[int]:
    """Lines of fenced blocks that look like a moesim command a reader would copy but that
    the runner would not run: not in a bash block, no ``$ `` prompt, not output
    (``moesim CMD: ...``) and not a synopsis (``FILE``-style placeholders or ``[...]``)."""
    lines = path.read_text().splitlines()
    found, in_block, lang, attrs = [], False, "", {}
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            info = line.lstrip()[3:].strip().split()
            lang = info[0] if info else ""
            attrs = dict(a.split("=", 1) for a in info[1:] if "=" in a)
            continue
        if not in_block or lang in SHELL_LANGS or lang in ("python", "yaml", "json") \
                or "file" in attrs:
            continue
        s = line.strip()
        m = re.match(r"(moesim [\w-]+|python benchmarks/\S+)(\s|$)", s)
        if m and not s.startswith("$ ") and not m.group(1).endswith(":") \
                and not re.match(r"moesim [\w-]+ [\w-]+:", s) \
                and not PLACEHOLDER.search(s.split("#")[0]):
            found.append(n)
    return found

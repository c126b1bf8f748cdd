"""The ``flashspec`` command line.

``generate`` checks its options (with :func:`flashspec_core.config.check_generation`, the
bounds a config and ``Pipeline.generate`` apply too), its prompt and the plugin-free part
of its config file before torch, transformers or triton is imported, so a bad input is one
line naming it as typed (``--top-p``) without waiting for torch. Component names and keys
are checked then too, against the plugins' light keys modules
(:func:`flashspec_core.registry.build_catalogue`), and a CUDA device or the triton verifier
on a machine certainly without CUDA (:mod:`flashspec_core.machine`); what those cannot tell
(a name only a plugin without one may provide, another device this machine lacks) is checked
once the plugins are loaded, still before any model is. That import takes seconds (far more on a first
run), so it is announced (:class:`_Pending`) without ever adding a line to an error found
while it lasts.

Files it writes (``--log-json``) are written beside their target under a temporary name
and renamed over it when the run succeeds (or, with ``--append``, added to its end then),
so a failed or interrupted run leaves an existing file as it was. A target that is also
an input (the config file) is refused before anything runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys
import tempfile
import time
import typing
import uuid
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata, resources
from pathlib import Path
from typing import IO, Any

from flashspec_core.config import (
    GENERATION_KEYS,
    check_components,
    check_config_file,
    check_generation,
    check_prompt_text,
)
from flashspec_core.registry import build_catalogue

DEFAULT_CONFIG = "default.toml"
GPU_CONFIG = "gpu.toml"
LOADING = "loading torch and transformers (first run takes longer)"


def bundled_config(name: str) -> Path:
    """Path of a config shipped with FlashSpec (``default.toml``, ``smollm2.toml``)."""
    return Path(str(resources.files("flashspec_core") / "configs" / name))


def default_config_name(driver: Path = Path("/proc/driver/nvidia/gpus")) -> str:
    """The bundled config a run without ``--config`` gets: :data:`GPU_CONFIG` (the fast
    back-end, CUDA graphs) where an NVIDIA GPU is usable
    (:func:`flashspec_models.precision.nvidia_gpu_usable`, decided without importing torch,
    so that argument and config errors still come first), else :data:`DEFAULT_CONFIG` (the
    hf back-end, which the CPU measurements chose)."""
    from flashspec_models.precision import nvidia_gpu_usable

    return GPU_CONFIG if nvidia_gpu_usable(driver) else DEFAULT_CONFIG


def _say(msg: str) -> None:
    print(f"[flashspec] {msg}", file=sys.stderr, flush=True)


class _Pending:
    """The progress line of the wait before the first load line: the torch and transformers import,
    and the config's component keys, which need the plugins and so that import.

    A mistake found in that wait must still be the run's only line. On a terminal the line shows
    while the wait lasts and is erased if an error ends it; elsewhere (a pipe, a log file) it is
    written when the wait ends well, with its length. ``with _Pending(text) as say``: ``say`` is
    the progress callback whose first call ends the wait.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.tty = _is_terminal(sys.stderr)
        self.start = time.monotonic()
        self.waiting = False

    def __enter__(self) -> Callable[[str], None]:
        self.start, self.waiting = time.monotonic(), True
        if self.tty:
            sys.stderr.write(f"[flashspec] {self.text}")
            sys.stderr.flush()
        return self.say

    def say(self, msg: str) -> None:
        self._settle()
        _say(msg)

    def _settle(self) -> None:
        if not self.waiting:
            return
        self.waiting = False
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
        else:
            _say(f"{self.text}: done in {time.monotonic() - self.start:.1f} s")

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self._settle()
        elif self.waiting and self.tty:
            self.waiting = False
            sys.stderr.write("\r\033[K")  # the error line takes its place
            sys.stderr.flush()


class UsageError(ValueError):
    """A command-line argument is unusable; the message names the option as typed."""


def _output_target(option: str, path: str, inputs: Sequence[Path]) -> Path:
    """Where ``option``'s file really goes (links followed), refused if it is a directory,
    lacks its directory, or is one of ``inputs``."""
    given = Path(path)
    if given.exists() and not given.is_file() and not given.is_dir():
        return given  # a device or pipe (/dev/stdout's link may resolve to no path at all), written as it is
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise UsageError(f"{option} {path}: is a directory")
    if not target.parent.is_dir():
        raise UsageError(f"{option} {path}: directory {target.parent} does not exist")
    for source in inputs:
        if target == Path(os.path.realpath(source)):
            raise UsageError(f"{option} {path}: is the input file {source}; refusing to overwrite it")
    return target


@contextlib.contextmanager
def _output(option: str, target: Path, append: bool) -> Iterator[IO[str]]:
    """A file beside ``target`` that replaces it (or is added to its end) only if the block ends well."""
    # A device or pipe (/dev/null, /dev/stdout, a FIFO) cannot be replaced by a rename (as root
    # that would turn /dev/null into a plain file): its lines wait in a temporary file, then go to it.
    special = target.exists() and not target.is_file()
    if special:
        fd, name = tempfile.mkstemp(prefix="flashspec-log-", suffix=".tmp")
        tmp = Path(name)
    else:
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as exc:
            raise UsageError(f"{option} {target}: cannot write in {target.parent} ({exc.strerror})") from None
    try:
        with open(fd, "w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        _commit_output(tmp, target, append or special)
    finally:
        tmp.unlink(missing_ok=True)


def _commit_output(tmp: Path, target: Path, append: bool) -> None:
    if append:
        with tmp.open("rb") as src, target.open("ab") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
            dst.flush()
            if target.is_file():  # a pipe or a device has nothing to sync
                os.fsync(dst.fileno())
        return
    if target.exists():
        os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
    os.replace(tmp, target)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _option(key: str) -> str:
    return "--" + key.replace("_", "-")


def _number(text: str) -> int | float | str:
    """The number an option's text spells (an int if it can be); other text as is, for the check to name."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _generate(args: argparse.Namespace) -> int:
    given = {key: _number(value) for key in GENERATION_KEYS if (value := getattr(args, key)) is not None}
    overrides = check_generation(given, _option)
    check_prompt_text(args.prompt)
    name = None if args.config else default_config_name()
    config = Path(args.config) if args.config else bundled_config(name or DEFAULT_CONFIG)
    if name == GPU_CONFIG:
        _say(f"config: the bundled {GPU_CONFIG} (an NVIDIA GPU and a CUDA build of torch are here; --config for another)")
    check_components(check_config_file(config), build_catalogue(), str(config), base_dir=config.parent)
    if args.append and not args.log_json:
        raise UsageError("--append needs --log-json FILE")
    log_target = _output_target("--log-json", args.log_json, [config]) if args.log_json else None
    with contextlib.ExitStack() as stack:
        log_file = stack.enter_context(_output("--log-json", log_target, args.append)) if log_target else None
        from flashspec_core import logs  # structlog: not needed to refuse a bad input

        stack.enter_context(logs.configured("info" if args.verbose else "warning", log_file))
        with _Pending(LOADING) as say:
            from flashspec_core.build import load_pipeline

            pipeline = load_pipeline(config, progress=say)
        gen = pipeline.config.generation
        opts = {key: overrides.get(key, getattr(gen, key)) for key in GENERATION_KEYS}
        if not getattr(pipeline.verifier, "exact", True):  # a timing stand-in such as "synthetic"
            _say(f"warning: verifier {pipeline.config.verifier.use!r} is not exact (timing studies only): "
                 "the text below is not what the target would generate")
        _say("generating")
        # -v on a terminal: step lines and streamed text would share its lines, so the text comes whole at the end
        held = args.verbose and _same_terminal(sys.stdout, sys.stderr)
        stream = _Streamer(pipeline.target.decode, sys.stdout, hold=held)
        result = pipeline.generate([args.prompt], on_tokens=stream, **opts)
        stream.finish()
        _print_summary(result.summary, sys.stderr)
    return 0


def _same_terminal(a: IO[str], b: IO[str]) -> bool:
    return _is_terminal(a) and _is_terminal(b)


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fileno-less stream
        return False


class _Streamer:
    """Print text as tokens are accepted (decode the whole row, print the new suffix);
    ``hold``: print it all in :meth:`finish` instead."""

    def __init__(self, decode: Callable[[Sequence[int]], str], out: IO[str], hold: bool = False) -> None:
        self.decode, self.out, self.hold = decode, out, hold
        self.ids: list[int] = []
        self.shown = ""

    def __call__(self, row: int, new: list[int]) -> None:
        self.ids.extend(new)
        if self.hold:
            return
        text = self.decode(self.ids)
        if text.startswith(self.shown) and not text.endswith("\ufffd"):
            self.out.write(text[len(self.shown) :])
            self.out.flush()
            self.shown = text

    def finish(self) -> None:
        text = self.decode(self.ids)
        if text.startswith(self.shown):
            self.out.write(text[len(self.shown) :])
        self.out.write("\n")
        self.out.flush()


def _print_summary(summary: dict[str, Any], out: IO[str]) -> None:
    print(
        f"\n{summary['new_tokens']} tokens in {summary['wall_s']:.2f} s "
        f"({summary['tokens_per_s']:.1f} tokens/s), {summary['steps']} steps, "
        f"mean accepted length {summary['mean_accepted_length']:.2f}"
        + ("" if summary.get("vs_plain") is None else
           f", about {summary['vs_plain']:.2f}x plain decoding (step times against its {summary['plain_steps']} "
           "plain steps)"),
        file=out,
    )
    for name, arm in summary["arms"].items():
        rate = "-" if arm["acceptance_rate"] is None else f"{arm['acceptance_rate']:.2f}"
        print(f"  arm {name:<24} steps {arm['steps']:>5}  acceptance {rate:>5}", file=out)


def _plugins(args: argparse.Namespace) -> int:
    from flashspec_core.registry import build_registry

    registry = build_registry()
    rows = [(kind, p.spec.name, f"{p.distribution} {p.version}", p.plugin, p.spec.description) for kind, p in registry.all()]
    if args.json:
        keys = ("kind", "name", "distribution", "plugin", "description")
        print(json.dumps([dict(zip(keys, r, strict=True)) for r in rows], indent=2))
        return 0
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4])
    return 0


COMMANDS = "flashspec.commands"  # entry-point group: name = "module:main", main(argv) -> exit status


def commands() -> dict[str, metadata.EntryPoint]:
    """The subcommands installed distributions add (``bench``, ``bandit-sim``), by name; none is imported."""
    return {ep.name: ep for ep in metadata.entry_points(group=COMMANDS)}


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


DISTRIBUTION = "flashspec-engine"


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose ``generate`` errors say how to pass a prompt that starts with '-'
    (argparse reads ``-hello`` as ``-h ello`` and says 'ignored explicit argument')."""

    def error(self, message: str) -> typing.NoReturn:
        if self.prog.endswith(" generate") and any(w in message for w in ("prompt", "explicit argument", "unrecognized")):
            message += "; a prompt that starts with '-' goes after '--': flashspec generate [options] -- '-text'"
        super().error(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="flashspec", description="Adaptive speculative decoding with exact output.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for one prompt, streaming it as it is accepted")
    g.add_argument("prompt")
    g.add_argument("--config", help=f"pipeline TOML (default: the bundled {DEFAULT_CONFIG}: Qwen2.5-Coder 1.5B + 0.5B; "
                                     f"{GPU_CONFIG}, the fast back-end, where an NVIDIA GPU and a CUDA torch are there)")
    # Parsed as text and checked by check_generation, so every bad value reads the same way.
    g.add_argument("--max-new-tokens", metavar="N", help="an integer >= 1")
    g.add_argument("--temperature", metavar="T", help="a finite number >= 0; 0 = greedy")
    g.add_argument("--top-k", metavar="K", help="an integer >= 0; 0 = off")
    g.add_argument("--top-p", metavar="P", help="a number in (0, 1]; 1 = off")
    g.add_argument("--seed", metavar="S", help="an integer in [0, 2**64)")
    g.add_argument(
        "--log-json", metavar="FILE",
        help="write every log line (one per step) as JSON to FILE when the run succeeds; a failed run leaves FILE as it was",
    )
    g.add_argument("--append", action="store_true", help="add the --log-json lines to the end of FILE instead of replacing it")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="print the per-step log lines on stderr (on a terminal the text then comes whole at the end)")
    g.set_defaults(run=_generate)
    pl = sub.add_parser("plugins", help="list every component and the plugin that provides it")
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(run=_plugins)
    for name, ep in commands().items():
        # Parsed by the command itself (see main): listed here for --help.
        sub.add_parser(name, help=f"{ep.value} (its own --help)", add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        found = commands().get(argv[0]) if argv else None
        if found is not None:  # its own parser sees every option
            return int(found.load()(argv[1:]) or 0)
        args = parser().parse_args(argv)
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except (ValueError, KeyError, OSError, RuntimeError, ImportError) as exc:
        if os.environ.get("FLASHSPEC_DEBUG"):
            raise
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"flashspec: error: {msg}", file=sys.stderr)
        return 2
    except Exception as exc:  # nobody named it (torch's AssertionError for a CUDA device on a CPU build)
        if os.environ.get("FLASHSPEC_DEBUG"):
            raise
        print(f"flashspec: error: {type(exc).__name__}: {exc} (FLASHSPEC_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

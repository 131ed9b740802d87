"""kfit's command line.

``kfit inspect PATH [--json]``: what a checkpoint holds (the clock, where the run stood: running, complete
or stopped and why, hyperparameters, the optimizer and the options set on it, last metrics, every variable with its
shape), its format version, and whether its checksums hold. The exit status is 0 for an intact file, 1 for a damaged
or unreadable one.

``kfit runs DIR [--json]``: every checkpoint file under ``DIR`` (a run's output folder), one line each: its
clock, the run's status and whether the file is intact. Exit status 1 when one of them is damaged. A checkpoint
that is a link is shown with its target, and the numbered files beside that target follow it, wherever they are.

``kfit plot HISTORY.csv -o OUT.png``: plots a CSV history written by ``kfit.callbacks.CSVHistory``.

The command line imports neither Keras nor a backend (a checkpoint is read with h5py and NumPy), so it
answers in a fraction of a second. Text read from files (paths, names, error messages) is printed with
control characters escaped, so a crafted file cannot move the cursor or rewrite the terminal.

Example:
    >>> from kfit.cli import main
    >>> # main(["inspect", "runs/model.ckpt", "--json"])
    >>> # main(["runs", "runs/mnist-tensorflow"])
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def printable(text: Any) -> str:
    """``text`` with control characters (and other unprintable ones) escaped as Python writes them.

    Example:
        >>> printable("runs/a\\x1b[2Jb\\n")
        'runs/a\\\\x1b[2Jb\\\\n'
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _format_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


_LAST_STEP = " (the last step's)"


def _set_options(options: dict[str, Any]) -> str:
    """The optimizer's options that are set, short: ``clipnorm=1, weight_decay=0.004``. Without Keras there are no
    class defaults to compare with, so an option left None or False is left out, as is the EMA's momentum without
    ``use_ema`` and the learning rate (shown above); ``--json`` has them all."""
    shown = []
    for key, value in sorted(options.items()):
        if (value is None or value is False or key == "learning_rate" or isinstance(value, (dict, list))
                or (key.startswith("ema_") and not options.get("use_ema"))):
            continue
        text = repr(value)  # as written in code: CNTK's beta_2=0.9999986111120757 is not 0.999999
        shown.append(f"{printable(key)}={printable(text)}")
    return ", ".join(shown)


def _text(info) -> str:
    p = printable
    lines = [f"checkpoint:      {p(info.path)}"]
    lines.append(f"format version:  {info.format_version} (kfit {p(info.kfit_version)}, Keras {p(info.keras_version)}, "
                 f"backend {p(info.backend)}, written {p(info.created)})")
    lines.append("checksum:        " + ("ok" if info.checksum_ok else f"FAILED: {p(info.problem)}"))
    lines.append(f"run status:      {p(info.status_text())}")
    if info.samples is not None:
        epoch = f"{info.epoch}" + (f" (+{info.samples_in_epoch} samples)" if info.samples_in_epoch else "")
        lines.append(f"samples:         {info.samples}")
        lines.append(f"epoch:           {epoch} of {info.epoch_size} samples")
        lines.append(f"minibatches:     {info.minibatches}")
        lines.append(f"minibatch size:  {info.minibatch_size if info.minibatch_size is not None else '-'}"
                     + _LAST_STEP * (info.minibatch_size is not None))
    # (the values the last step trained with: an epoch's shortened last minibatch, and the rate and momentum of
    # a per-sample schedule for its size, not the schedule's values for the next step)
    hyper, schedule = info.hyperparameters, info.learning_rate_schedule
    function = info.optimizer_options.get("learning_rate")
    if schedule:  # (a Keras LearningRateSchedule: its rate at the optimizer's step count, as Keras reads it)
        lines.append(f"learning rate:   {p(schedule['class'])} at step {schedule['step']}: "
                     f"{_number(schedule['value'])} (the next step's)")
    elif "learning_rate" not in hyper and isinstance(function, str) and function.startswith("<function "):
        lines.append(f"learning rate:   {p(function[10:-1])} (a Python function, called before each step: its "
                     "values are not recorded)")
    else:
        lines.append(f"learning rate:   {_number(hyper.get('learning_rate'))}" + _LAST_STEP * ("learning_rate" in hyper))
    if "momentum" in hyper:
        lines.append(f"momentum:        {_number(hyper['momentum'])}{_LAST_STEP}")
    others = {k: v for k, v in hyper.items() if k not in ("learning_rate", "momentum", "minibatch_size")}
    if others:
        lines.append("hyperparameters: " + ", ".join(f"{p(k)} = {_number(v)}" for k, v in sorted(others.items())))
    inner = f"({p(info.inner_optimizer)})" if info.inner_optimizer else ""
    lines.append(f"optimizer:       {p(info.optimizer or '-')}{inner}")
    options = _set_options(info.optimizer_options)
    if options:
        lines.append(f"options:         {options}")
    metrics = ", ".join(f"{p(k)} = {_number(v)}" for k, v in info.last_metrics.items()) or "-"
    lines.append(f"last metrics:    {metrics}")
    lines.append(f"resume:          {'exact (saved by kfit.fit)' if info.kfit_fit else 'from the epoch start (saved under model.fit)'}")
    lines.append(f"variables:       {len(info.variables)}")
    width = max((len(p(v.path)) for v in info.variables), default=0)
    for v in info.variables:
        lines.append(f"  {v.group:<9} {p(v.path):<{width}}  {_format_shape(v.shape):<14} {p(v.dtype)}")
    return "\n".join(lines)


def _inspect(args: argparse.Namespace) -> int:
    from kfit.checkpoint import CheckpointError, read_checkpoint_info

    try:
        info = read_checkpoint_info(args.path)
    except CheckpointError as error:
        if args.json:
            print(_json({"path": args.path, "checksum_ok": False, "problem": str(error)}))
        print(f"kfit inspect: {printable(error)}", file=sys.stderr)
        return 1
    print(_json(info.as_dict()) if args.json else _text(info))
    return 0 if info.checksum_ok else 1


def _json(value: Any) -> str:
    """``value`` as strict JSON: a float that is not finite (a diverged loss) as the string ``"NaN"``,
    ``"Infinity"`` or ``"-Infinity"``, which ``float()`` reads back (Python's ``json`` writes them bare, which other
    JSON readers refuse)."""
    def strict(item: Any) -> Any:
        if isinstance(item, float) and not math.isfinite(item):
            return "NaN" if math.isnan(item) else "Infinity" if item > 0 else "-Infinity"
        if isinstance(item, dict):
            return {key: strict(v) for key, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [strict(v) for v in item]
        return item

    return json.dumps(strict(value), indent=2, allow_nan=False)


# -- kfit runs ---------------------------------------------------------------------------------------
_CHECKPOINT_SUFFIXES = (".ckpt", ".h5", ".hdf5")


def _is_candidate(path: str, names: set[str]) -> bool:
    """True when ``path`` is a kfit checkpoint, or was one: it begins with kfit's header, or is an HDF5 file with
    kfit's format attribute (format 1), or, its first bytes damaged, is named as kfit names them (``*.ckpt``,
    ``*.h5``, ``*.hdf5``, or a numbered twin ``PATH.<samples>`` of such a name or of a file ``PATH`` in
    ``names``). HDF5 files that kfit did not write (a Keras weights file, a dataset) are not listed."""
    from kfit.checkpoint._format import MAGIC, is_kfit_hdf5

    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    if head == MAGIC:
        return True
    if head == _HDF5_SIGNATURE:  # (asked in a child process: HDF5 can hang or crash on a damaged file)
        return is_kfit_hdf5(path)
    stem, _, suffix = os.path.basename(path).rpartition(".")
    return path.endswith(_CHECKPOINT_SUFFIXES) or (suffix.isdigit() and (stem in names
                                                                          or stem.endswith(_CHECKPOINT_SUFFIXES)))


def find_checkpoints(directory: str) -> list[str]:
    """The kfit checkpoint candidates under ``directory`` (see :func:`_is_candidate`), not the temporaries of a
    write in progress.

    Sorted by path, numbered twins (``PATH.<samples>``) by their sample count after ``PATH``.
    """
    from kfit.checkpoint import _format

    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        names = set(files)
        for name in files:
            if _format.TEMP_INFIX in name:
                continue
            path = os.path.join(root, name)
            if os.path.isfile(path) and _is_candidate(path, names):
                found.append(path)

    # The numbered twins of a PATH that is a link lie beside its target (kfit writes them there), which may be
    # outside ``directory``: listed after the link, by their own paths.
    twins: dict[str, tuple] = {}
    seen = {os.path.realpath(path) for path in found}
    for link in [path for path in found if os.path.islink(path)]:
        for samples, file in _format.numbered_files(link):
            if os.path.realpath(file) not in seen and os.path.isfile(file):
                seen.add(os.path.realpath(file))
                twins[file] = (link, 1, samples)

    def key(path: str) -> tuple:
        stem, _, suffix = path.rpartition(".")
        if path in twins:
            return twins[path]
        if suffix.isdigit():  # PATH.<samples>, after PATH (listed or not), by its number
            return (stem, 1, int(suffix))
        return (path, 0, 0)

    return sorted(found + list(twins), key=key)


def _run_row(path: str, verify: bool) -> dict[str, Any]:
    from kfit.checkpoint import CheckpointError, read_checkpoint_info

    try:
        info = read_checkpoint_info(path, verify=verify)
    except CheckpointError as error:
        return {"path": path, "samples": None, "epoch": None, "status": None, "status_text": "-",
                "created": None, "intact": False, "problem": str(error)}
    return {"path": path, "samples": info.samples, "epoch": info.epoch, "status": info.status,
            "status_reason": info.status_reason, "status_text": info.status_text(), "created": info.created,
            "intact": info.checksum_ok, "problem": info.problem}


def _shown(path: str, directory: str) -> str:
    """``path`` as ``kfit runs`` prints it: relative to ``directory`` when under it, else absolute; a link with
    the file it points to (``run.ckpt -> /data/run.ckpt``)."""
    inside = os.path.commonpath([os.path.abspath(path), os.path.abspath(directory)]) == os.path.abspath(directory)
    shown = os.path.relpath(path, directory) if inside else os.path.abspath(path)
    return printable(shown + (f" -> {os.path.realpath(path)}" if os.path.islink(path) else ""))


def _runs(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.directory):
        print(f"kfit runs: {printable(args.directory)!s} is not a directory.", file=sys.stderr)
        return 2
    rows = [_run_row(path, verify=not args.quick) for path in find_checkpoints(args.directory)]
    damaged = any(row["intact"] is False for row in rows)
    if args.json:
        print(_json(rows))
        return 1 if damaged else 0
    if not rows:
        print(f"No kfit checkpoints under {printable(args.directory)}.")
        return 0
    table = [("FILE", "SAMPLES", "EPOCH", "STATUS", "INTEGRITY", "WRITTEN")]
    for row in rows:
        intact = {True: "ok", False: "DAMAGED", None: "not checked"}[row["intact"]]
        table.append((
            _shown(row["path"], args.directory),
            "-" if row["samples"] is None else str(row["samples"]),
            "-" if row["epoch"] is None else str(row["epoch"]),
            printable(row["status_text"]), intact, printable(row["created"] or "-"),
        ))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(r, widths)).rstrip())
    for row in rows:
        if row["problem"]:
            print(f"{_shown(row['path'], args.directory)}: {printable(row['problem'])}", file=sys.stderr)
    return 1 if damaged else 0


# -- kfit plot ---------------------------------------------------------------------------------------
def _plot(args: argparse.Namespace) -> int:
    from kfit.plotting import plot_history

    try:
        out = plot_history(args.history, args.output)
    except (OSError, ValueError, ImportError) as error:
        if isinstance(error, FileNotFoundError) and error.filename is not None:
            message = f"no such file: {error.filename}"
        elif isinstance(error, OSError) and error.filename is not None:
            message = f"{error.filename}: {error.strerror or error}"
        else:
            message = str(error)
        print(f"kfit plot: {printable(message)}", file=sys.stderr)
        return 1
    print(f"wrote {printable(out)}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kfit", description="kfit: CNTK-style training for Keras 3.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect = commands.add_parser("inspect", help="show what a checkpoint holds and whether it is intact")
    inspect.add_argument("path", help="the checkpoint file")
    inspect.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    inspect.set_defaults(run=_inspect)
    runs = commands.add_parser("runs", help="list the checkpoints in a run directory: clock, status, integrity")
    runs.add_argument("directory", help="the run's output folder (searched recursively)")
    runs.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    runs.add_argument("--quick", action="store_true", help="read only the metadata (skip the checksums of the arrays)")
    runs.set_defaults(run=_runs)
    plot = commands.add_parser("plot", help="plot a CSV training history")
    plot.add_argument("history", help="the CSV history (kfit.callbacks.CSVHistory)")
    plot.add_argument("-o", "--output", required=True, help="the image to write (e.g. history.png)")
    plot.set_defaults(run=_plot)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``kfit`` command line.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 for a damaged or unreadable checkpoint or a failed plot, 2 for bad usage.
    """
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # `kfit inspect ... | head`: the reader has gone, which is fine
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # python -m kfit.cli
    sys.exit(main())

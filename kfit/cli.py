"""kfit's command line.

``kfit inspect PATH [--json]``: what a checkpoint holds (the clock, hyperparameters, last metrics, every
variable with its shape), its format version, and whether its checksum holds. The exit status is 0 for an
intact file, 1 for a damaged or unreadable one.

``kfit plot HISTORY.csv -o OUT.png``: plots a CSV history written by ``kfit.callbacks.CSVHistory``.

Example:
    >>> from kfit.cli import main
    >>> # main(["inspect", "runs/model.ckpt", "--json"])
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _format_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _text(info) -> str:
    lines = [f"checkpoint:      {info.path}"]
    lines.append(f"format version:  {info.format_version} (kfit {info.kfit_version}, Keras {info.keras_version}, "
                 f"backend {info.backend}, written {info.created})")
    lines.append("checksum:        " + ("ok" if info.checksum_ok else f"FAILED: {info.problem}"))
    if info.samples is not None:
        epoch = f"{info.epoch}" + (f" (+{info.samples_in_epoch} samples)" if info.samples_in_epoch else "")
        lines.append(f"samples:         {info.samples}")
        lines.append(f"epoch:           {epoch} of {info.epoch_size} samples")
        lines.append(f"minibatches:     {info.minibatches}")
        lines.append(f"minibatch size:  {info.minibatch_size if info.minibatch_size is not None else '-'}")
    hyper = info.hyperparameters
    lines.append(f"learning rate:   {_number(hyper.get('learning_rate'))}")
    if "momentum" in hyper:
        lines.append(f"momentum:        {_number(hyper['momentum'])}")
    others = {k: v for k, v in hyper.items() if k not in ("learning_rate", "momentum", "minibatch_size")}
    if others:
        lines.append("hyperparameters: " + ", ".join(f"{k} = {_number(v)}" for k, v in sorted(others.items())))
    lines.append(f"optimizer:       {info.optimizer or '-'}")
    metrics = ", ".join(f"{k} = {_number(v)}" for k, v in info.last_metrics.items()) or "-"
    lines.append(f"last metrics:    {metrics}")
    lines.append(f"resume:          {'exact (saved by kfit.fit)' if info.kfit_fit else 'from the epoch start (saved under model.fit)'}")
    lines.append(f"variables:       {len(info.variables)}")
    width = max((len(v.path) for v in info.variables), default=0)
    for v in info.variables:
        lines.append(f"  {v.group:<9} {v.path:<{width}}  {_format_shape(v.shape):<14} {v.dtype}")
    return "\n".join(lines)


def _inspect(args: argparse.Namespace) -> int:
    from kfit.checkpoint import CheckpointError, read_checkpoint_info

    try:
        info = read_checkpoint_info(args.path)
    except CheckpointError as error:
        if args.json:
            print(json.dumps({"path": args.path, "checksum_ok": False, "problem": str(error)}, indent=2))
        print(f"kfit inspect: {error}", file=sys.stderr)
        return 1
    print(json.dumps(info.as_dict(), indent=2) if args.json else _text(info))
    return 0 if info.checksum_ok else 1


def _plot(args: argparse.Namespace) -> int:
    from kfit.plotting import plot_history

    plot_history(args.history, args.output)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kfit", description="kfit: CNTK-style training for Keras 3.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect = commands.add_parser("inspect", help="show what a checkpoint holds and whether it is intact")
    inspect.add_argument("path", help="the checkpoint file")
    inspect.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    inspect.set_defaults(run=_inspect)
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
        The exit status: 0 on success, 1 for a damaged or unreadable checkpoint, 2 for bad usage.
    """
    args = _parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":  # python -m kfit.cli
    sys.exit(main())

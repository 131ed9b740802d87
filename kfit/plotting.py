"""Training curves from a :class:`kfit.callbacks.CSVHistory` file, against samples seen (``kfit plot``)."""

from __future__ import annotations

import csv
import math
import os
import pathlib

from kfit import _files

_NOT_METRICS = {
    "kind", "epoch", "samples", "minibatches", "lr", "momentum", "minibatch_size", "time",
    "val_samples", "val_minibatches", "val_index", "test_samples", "test_minibatches",
}  # fmt: skip


def _read(csv_path: str | os.PathLike) -> tuple[list[str], list[dict[str, str]]]:
    try:
        with open(csv_path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            columns = list(reader.fieldnames or [])
            rows = list(reader)
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{os.fspath(csv_path)} is not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset {error.start}): "
            "expected a CSV written by kfit.callbacks.CSVHistory."
        ) from None
    except csv.Error as error:
        raise ValueError(f"{os.fspath(csv_path)} is not a readable CSV ({error}): expected a CSV written by kfit.callbacks.CSVHistory.") from None
    if not columns:
        raise ValueError(f"{os.fspath(csv_path)} is empty: expected a CSV written by kfit.callbacks.CSVHistory.")
    if "samples" not in columns:
        raise ValueError(
            f"{os.fspath(csv_path)} has no `samples` column (columns: {columns}): expected a CSV written by "
            "kfit.callbacks.CSVHistory."
        )
    return columns, rows


def _series(rows: list[dict[str, str]], column: str, kinds: tuple[str, ...] | None = None) -> tuple[list, list]:
    xs, ys = [], []
    for row in rows:
        if kinds is not None and row.get("kind") not in kinds:
            continue
        try:
            x, y = float(row["samples"]), float(row.get(column) or "nan")
        except (TypeError, ValueError):  # (a row cut short, as a killed run or a full disk may leave the last one)
            continue
        if not math.isnan(y) and not (xs and xs[-1] == x and ys[-1] == y):  # a CV result repeated in its epoch row
            xs.append(x)
            ys.append(y)
    return xs, ys


def _plot_results(ax, rows: list[dict[str, str]], columns: list[str], title: str) -> None:
    for column in columns:
        if column.startswith(("val_", "test_")):
            xs, ys = _series(rows, column)
            style = {"marker": "o" if column.startswith("val_") else "*", "linestyle": "--" if column.startswith("val_") else ""}
        else:
            xs, ys = _series(rows, column, kinds=("epoch",))
            style = {"marker": "."}
        if xs:
            ax.plot(xs, ys, label=column, **style)
    ax.set_title(title)
    if ax.lines:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def _plot_step(ax, rows: list[dict[str, str]], column: str, title: str, log: bool = False) -> None:
    xs, ys = _series(rows, column)
    if xs:
        # A row holds the value used up to its clock reading: draw it over the interval before.
        if xs[0] > 0:
            xs, ys = [0.0, *xs], [ys[0], *ys]
        ax.step(xs, ys, where="pre", marker=".")
        if log and all(y > 0 for y in ys):
            ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title)


def plot_history(csv_path: str | os.PathLike, output_path: str | os.PathLike) -> pathlib.Path:
    """Draws loss, metrics, learning rate and minibatch size against samples seen, in one picture.

    Four panels: the training loss (epoch rows) with ``val_loss`` and ``test_loss``; the other metrics,
    training and validation; the learning rate per minibatch (log scale); the minibatch size. Drawn with
    matplotlib's Agg renderer (no display needed); the format follows ``output_path``'s suffix (``.png``,
    ``.pdf``, ``.svg``).

    Args:
        csv_path: a CSV written by :class:`kfit.callbacks.CSVHistory`.
        output_path: the picture to write (its directory is created if missing); ``.png`` is added to a name
            without a suffix.

    Returns:
        The path written, as a ``pathlib.Path``.

    Raises:
        FileNotFoundError: if ``csv_path`` does not exist.
        ValueError: if the file is empty, not UTF-8 text, not a CSV, or has no ``samples`` column; if
            ``output_path`` is a directory.
        ImportError: if matplotlib is not installed (``pip install kfit[plot]``).
        OSError: if the picture cannot be written (a full disk, a read-only folder), naming it; a picture there
            before is left as it was.

    Example:
        >>> from kfit.plotting import plot_history
        >>> # plot_history("runs/history.csv", "runs/curves.png")
    """
    columns, rows = _read(csv_path)
    output = pathlib.Path(output_path)
    if output.is_dir():
        raise ValueError(f"{os.fspath(output)} is a directory: give the picture's file name, e.g. "
                         f"{os.fspath(output / 'curves.png')}.")
    if not output.suffix:
        output = output.with_name(output.name + ".png")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("kfit plot needs matplotlib: pip install 'kfit[plot]'") from error

    results = [c for c in columns if c not in _NOT_METRICS]
    losses = [c for c in results if c == "loss" or c.endswith("_loss")]
    metrics = [c for c in results if c not in losses]

    figure = Figure(figsize=(12, 8), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 2, sharex=True)
    _plot_results(axes[0][0], rows, losses, "loss")
    _plot_results(axes[0][1], rows, metrics, "metrics")
    _plot_step(axes[1][0], rows, "lr", "learning rate (per minibatch)", log=True)
    _plot_step(axes[1][1], rows, "minibatch_size", "minibatch size")
    for ax in axes[1]:
        ax.set_xlabel("samples seen")
    for ax in (a for row in axes for a in row):
        ax.grid(True, alpha=0.3)
    figure.suptitle(os.path.basename(os.fspath(csv_path)))
    figure.tight_layout()

    output.parent.mkdir(parents=True, exist_ok=True)
    # Beside it, then renamed over it: a full disk leaves the previous picture as it was, and no cut file.
    _files.replace(os.fspath(output), lambda temporary: figure.savefig(temporary, format=output.suffix[1:]),
                   "the picture", "A picture there before is as it was.")
    return output

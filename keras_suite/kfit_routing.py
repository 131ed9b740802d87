"""A pytest plugin that routes ``keras.Model.fit`` through ``kfit.fit(model, ..., seed=0)``.

Used by ``scripts/keras_suite.sh`` to run Keras's own trainer and callback tests through kfit's own training
path (``seed=`` is a kfit-only argument, so ``kfit.fit`` does not take its plain ``model.fit``
pass-through): every test that passes under plain Keras must pass routed.

Options:
    --kfit-route            route ``fit`` through ``kfit.fit(..., seed=0)`` (without it: plain Keras, to know
                            which tests pass there);
    --kfit-timeout=SECONDS  fail a test that runs longer (default 300; 0: none): a hang is a failure, not a stuck
                            CI run (SIGALRM in the main thread, with every thread's stack printed first);
    --kfit-results=PATH     write a JSON object ``{nodeid: {"outcome", "error", "routed"}}``: the outcome of each
                            test, the first line of its error, and how many ``fit`` calls went through kfit.

Under pytest-xdist (``-n N``) each worker routes its own tests; the count of routed ``fit`` calls travels to the
controller with the test's report (``user_properties``), and the controller alone writes the results file.

How the routing avoids recursion: ``kfit.fit`` itself trains by calling ``model.fit(adapter, ...)``. The
patched ``fit`` calls ``kfit.fit`` only when no ``kfit.fit`` call routed by this plugin is running (a
context variable set while it runs); inside one, it calls Keras's original ``fit``.

Where it patches: ``Model.fit`` is defined by the backend's trainer class (``JAXTrainer.fit``,
``TensorFlowTrainer.fit``, ``TorchTrainer.fit``), found as the first class of ``keras.Model``'s MRO that
defines ``fit``; the patch replaces it there, so every model class that does not define its own ``fit``
(Sequential, functional, subclassed) is routed.
"""

from __future__ import annotations

import contextvars
import faulthandler
import functools
import json
import signal
import sys

import pytest

_inside_kfit = contextvars.ContextVar("kfit_routing_inside_kfit", default=False)
_routed_calls = 0
_patched: tuple | None = None  # (owner class, original fit)
_results: dict = {}


def pytest_addoption(parser):
    group = parser.getgroup("kfit routing")
    group.addoption("--kfit-route", action="store_true", help="route keras.Model.fit through kfit.fit(..., seed=0)")
    group.addoption("--kfit-results", default=None, help="write each test's outcome to this JSON file")
    group.addoption("--kfit-timeout", type=float, default=300.0, help="seconds a test may run (0: no limit)")


class TestTimeout(Exception):
    """A test ran longer than --kfit-timeout."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    limit = item.config.getoption("--kfit-timeout")
    if not limit:
        yield
        return

    def expire(signum, frame):
        raise TestTimeout(f"test ran longer than {limit:g} s (--kfit-timeout)")

    previous = signal.signal(signal.SIGALRM, expire)
    faulthandler.dump_traceback_later(max(limit - 1, 1), file=sys.stderr)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


def _fit_owner():
    import keras

    for cls in keras.Model.__mro__:
        if "fit" in cls.__dict__:
            return cls
    raise RuntimeError("keras.Model has no fit")


def _install():
    global _patched
    import kfit

    owner = _fit_owner()
    original = owner.__dict__["fit"]

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        global _routed_calls
        if _inside_kfit.get():
            return original(self, *args, **kwargs)
        _routed_calls += 1
        token = _inside_kfit.set(True)
        try:
            return kfit.fit(self, *args, seed=0, **kwargs)
        finally:
            _inside_kfit.reset(token)

    fit.__kfit_routed__ = True
    owner.fit = fit
    _patched = (owner, original)


def _is_xdist_controller(config) -> bool:
    """True in the pytest-xdist process that hands tests to workers (it runs none itself)."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def _writes_results(config) -> bool:
    return not hasattr(config, "workerinput")  # a worker's reports reach the controller, which writes the file


def pytest_configure(config):
    if config.getoption("--kfit-route") and not _is_xdist_controller(config):
        _install()


def pytest_unconfigure(config):
    global _patched
    if _patched is not None:
        owner, original = _patched
        owner.fit = original
        _patched = None
    path = config.getoption("--kfit-results")
    if path and _writes_results(config):
        with open(path, "w") as f:
            json.dump(_results, f, indent=1, sort_keys=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _routed_calls
    _routed_calls = 0
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "teardown":  # the teardown report carries the test's count of routed fit calls
        item.user_properties.append(("kfit_routed", _routed_calls))
    yield


def _first_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return (text.strip().splitlines() or [""])[0][:300]


def pytest_runtest_logreport(report):
    entry = _results.setdefault(report.nodeid, {"outcome": "passed", "error": "", "routed": 0, "seconds": 0.0})
    entry["seconds"] = round(entry["seconds"] + report.duration, 2)
    if report.when == "teardown":
        entry["routed"] = dict(report.user_properties).get("kfit_routed", 0)
    if report.failed and entry["outcome"] != "failed":
        entry["outcome"] = "failed" if report.when == "call" else f"error ({report.when})"
        entry["error"] = _first_line(report)
    elif report.skipped and report.when in ("setup", "call") and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
    elif report.when == "call" and report.outcome == "passed" and entry["outcome"] == "passed":
        entry["outcome"] = "passed"


def pytest_collectreport(report):
    if report.failed:
        _results[report.nodeid] = {"outcome": "error (collect)", "error": _first_line(report), "routed": 0}

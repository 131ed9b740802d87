"""SIGINT and SIGTERM while a checkpoint writer is active: finish the write, or save first, then stop.

Schedulers preempt a job with SIGTERM (SLURM, Kubernetes; SIGKILL follows after a grace period) and a
user stops one with Ctrl-C (SIGINT). Python's default for SIGTERM ends the process at once, abandoning a
checkpoint being written on a background thread. A :class:`SignalGuard` installed for the time of a
training run sees the signal first: its owner may finish its write or defer the signal (to save at the
next step boundary), then the signal goes on to the handler that was there before (Ctrl-C raises
``KeyboardInterrupt``; SIGTERM's default ends the process, with the usual "killed by SIGTERM" status).
Handlers can only be set in the main thread: elsewhere the guard does nothing. A signal that the process
ignores (``SIG_IGN``: a job started with ``&`` from a script ignores SIGINT) is left ignored; a handler of the
program's own may let training go on (:meth:`SignalGuard.call_program_handler`).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SignalGuard:
    """Puts ``on_signal`` before the handlers of SIGINT and SIGTERM while installed.

    Args:
        on_signal: called with the signal number in the main thread; returns True when it takes care of
            the signal later (it then calls :meth:`deliver`), False to pass it on now.
    """

    def __init__(self, on_signal: Callable[[int], bool]):
        self._on_signal = on_signal
        self._previous: dict[int, Any] = {}
        self._handling = False
        self._frame: Any = None  # the frame the signal being handled interrupted

    def install(self) -> None:
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            self._previous[signum] = previous = signal.getsignal(signum)
            if previous != signal.SIG_IGN:  # a signal the process ignores (nohup'd, or `cmd &`) stays ignored
                signal.signal(signum, self._handle)

    def goes_to_program(self, signum: int) -> bool:
        """Whether the handler the signal goes on to is one of the program's own (a Python function other than
        Python's Ctrl-C handler): it may let training go on."""
        previous = self._previous.get(signum)
        return callable(previous) and previous is not signal.default_int_handler

    def call_program_handler(self, signum: int) -> None:
        """Calls the program's own handler of the signal being handled, the guard staying installed: if the handler
        returns, training goes on, guarded as before."""
        self._previous[signum](signum, self._frame)

    def raises_keyboard_interrupt(self, signum: int) -> bool:
        """Whether the handler the signal goes on to is Python's own Ctrl-C handler (it raises ``KeyboardInterrupt``;
        a handler of the program's own may let training go on, as it chooses)."""
        return self._previous.get(signum) is signal.default_int_handler

    def uninstall(self) -> None:
        """Puts the previous handlers back (leaving any handler set since by someone else)."""
        previous, self._previous = self._previous, {}
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def _handle(self, signum: int, frame: Any) -> None:
        if self._handling:  # the same signal again while the owner finishes a write: pass it on at once
            self.deliver(signum, frame)
            return
        self._handling, self._frame = True, frame
        try:
            deferred = self._on_signal(signum)
        finally:
            self._handling, self._frame = False, None
        if not deferred:
            self.deliver(signum, frame)

    def deliver(self, signum: int, frame: Any = None) -> None:
        """Uninstalls the guard and passes the signal to the handler that was there before it."""
        previous = self._previous.get(signum, signal.SIG_DFL)
        self.uninstall()
        if callable(previous):
            previous(signum, frame)  # Python's SIGINT handler raises KeyboardInterrupt here
        elif previous != signal.SIG_IGN:
            signal.raise_signal(signum)  # the default action: SIGTERM ends the process

"""math-verify as a second opinion, with a hard time bound that also holds inside Ray workers.

math-verify's own timeouts use signals, which only work in a process's main thread; verl calls
reward functions from worker threads. So the check runs in one long-lived child process per
reward process: a call that overruns its deadline kills the child (the next call starts a fresh
one) and is reported as ``None``, "unverified", never as a hang.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from multiprocessing.connection import Connection

MAX_ANSWER_CHARS = 2_000  # a longer "answer" is not a math answer: not worth sympy's time
STARTUP_GRACE_S = 20.0  # a fresh child imports sympy and math-verify before its first answer


def _serve(conn: Connection) -> None:
    from math_verify import parse, verify

    while True:
        try:
            gold, answer = conn.recv()
        except EOFError:  # the parent went away or killed us: nothing to answer
            return
        try:
            ok = verify(
                parse(f"${gold}$", parsing_timeout=None),
                parse(f"${answer}$", parsing_timeout=None),
                timeout_seconds=None,
            )
        except Exception:
            ok = False
        conn.send(bool(ok))


class BoundedVerifier:
    def __init__(self, timeout_s: float = 5.0, serve=_serve):
        self.timeout_s = timeout_s
        self._serve = serve  # the child's loop; tests pass one that hangs on purpose
        self._lock = threading.Lock()
        self._process: mp.Process | None = None
        self._conn: Connection | None = None
        self._warm = False
        self._warned = False

    def _start(self) -> None:
        parent, child = mp.get_context("spawn").Pipe()
        self._process = mp.get_context("spawn").Process(target=self._serve, args=(child,), daemon=True)
        self._process.start()
        self._conn = parent
        self._warm = False

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(timeout=5)
        self._process, self._conn = None, None

    def equivalent(self, gold: str, answer: str) -> bool | None:
        """True / False from math-verify, or None when it did not finish within the deadline."""
        if len(answer) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
            return None
        with self._lock:  # one question in flight per child
            try:
                if self._process is None or not self._process.is_alive():
                    self._start()
                self._conn.send((gold, answer))
                if self._conn.poll(self.timeout_s + (0.0 if self._warm else STARTUP_GRACE_S)):
                    self._warm = True
                    return self._conn.recv()
            except Exception as error:  # noqa: BLE001 - whatever breaks, the answer is "unverified"
                # no child possible here (e.g. inside a daemonic process) or it died mid-answer:
                # unverified, never an exception in the reward loop
                if not self._warned:
                    self._warned = True
                    print(f"[stapo.reward] math-verify unavailable ({type(error).__name__}: {error}); "
                          "answers it would check count as unverified", flush=True)
            self._stop()
            return None


_DEFAULT: BoundedVerifier | None = None


def default_verifier(timeout_s: float = 5.0) -> BoundedVerifier:
    global _DEFAULT
    if _DEFAULT is None or _DEFAULT.timeout_s != timeout_s:
        _DEFAULT = BoundedVerifier(timeout_s)
    return _DEFAULT

"""``lockserver --processes N``: one command starts N independent shard processes and stops
them together. What this module owns: starting the shards, reporting their addresses, watching
them, stopping them.

Rules kept (docs/configuration.md, "Several processes"):
- Each shard is a normal ``lockserver`` process with the same settings: the command line it
  was given plus ``--processes 1 --port P`` (a flag beats the environment and the file, so
  nothing else can change). Shard *i* listens on ``port + i``; with ``--port 0`` each shard
  asks the OS for a free port of its own (not consecutive).
- Once every shard listens, stdout gets one ``lockserver listening on HOST:PORT`` line per
  shard (shard order), then ``lockserver shards: LIST`` in the client's server-list syntax
  (``HOST:FIRST-LAST`` for consecutive ports, else comma-separated), each flushed.
- SIGINT / SIGTERM: SIGTERM to every shard (each drains as a single server does), SIGKILL to
  one still running after :data:`STOP_GRACE`; exit 0.
- A shard that stops on its own (crash, OOM kill, a signal sent to it alone) stops the set:
  logged with its number, address, pid and exit status, the others get SIGTERM, exit 1. A
  supervisor (systemd, Kubernetes) then restarts the whole set; the restarted shard has lost
  its locks, which its clients learn from its uptime (the reliability contract). Restarting one
  shard here instead would hide the loss from the operator.
- A shard that cannot start (port taken, unreadable TLS file) has printed its own one-line
  error; the others are stopped and the command exits with that shard's code (1 or 2).

Theory of operation: plain processes and one synchronous loop (``selectors`` over the shards'
stdout and a signal wake-up pipe, with a short timeout to notice exits); no event loop, since
the supervisor serves no clients. The shards run in process groups of their own, so a terminal's
Ctrl-C reaches only the supervisor, which stops them in order (otherwise a shard stopping on
that same SIGINT could look like a crash). On Linux each shard also gets SIGTERM should the
supervisor itself be killed (``PR_SET_PDEATHSIG``): no orphaned shards.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import IO

import attrs

from ._config import ServerConfig

__all__ = ["STOP_GRACE", "START_TIMEOUT", "server_list", "supervise"]

log = logging.getLogger("lockserver")

#: Seconds every shard has to print its listening line.
START_TIMEOUT = 30.0
#: Seconds a shard has to exit after SIGTERM before it is killed (a shard drains in ~0.6 s).
STOP_GRACE = 5.0
#: How often the loop looks for a shard that exited (an exit makes no byte to select on).
_POLL = 0.1
_LISTENING = re.compile(r"^lockserver listening on (\S+)$")
#: The directory holding the ``lockserver`` package, first on the shards' PYTHONPATH so they
#: run the same code as the supervisor whether installed or run from a checkout.
_PACKAGES_ROOT = Path(__file__).resolve().parents[1]


@attrs.define
class _Shard:
    """One shard process and what is known of it."""

    index: int
    proc: subprocess.Popen[bytes]
    address: str | None = None
    pending: bytes = b""  # stdout read but not yet a whole line

    @property
    def stdout(self) -> IO[bytes]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def describe(self) -> str:
        where = f" ({self.address})" if self.address else ""
        return f"shard {self.index}{where}, pid {self.proc.pid}"


def server_list(addresses: Sequence[str]) -> str:
    """The shards' addresses in the client's server-list syntax (PROTOCOL.md §12):
    ``HOST:FIRST-LAST`` when they share a host and their ports run consecutively upwards,
    else the ``HOST:PORT`` texts separated by commas."""
    split = [a.rpartition(":") for a in addresses]
    hosts = {host for host, _, _ in split}
    ports = [int(port) for _, _, port in split]
    consecutive = ports == list(range(ports[0], ports[0] + len(ports)))
    if len(addresses) > 1 and len(hosts) == 1 and consecutive:
        return f"{split[0][0]}:{ports[0]}-{ports[-1]}"
    return ",".join(addresses)


def _exit_status(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """In the shard, before exec: ask Linux for SIGTERM when the supervisor dies."""
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _command(argv: Sequence[str], port: int) -> list[str]:
    # Appended flags win over earlier ones, the environment and the file. -P: the working
    # directory does not go first on sys.path, so a checkout there cannot replace the code
    # this supervisor runs (its package root is on PYTHONPATH).
    return [
        sys.executable,
        "-P",
        "-m",
        "lockserver",
        *argv,
        "--processes",
        "1",
        "--port",
        str(port),
    ]


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(_PACKAGES_ROOT) + (os.pathsep + path if path else "")
    return env


class _Stop(Exception):
    """Leave the loop: the exit code to return."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Supervisor:
    """Starts, watches and stops the shards of one ``lockserver --processes N``."""

    def __init__(self, config: ServerConfig, argv: Sequence[str]) -> None:
        self._config = config
        self._argv = list(argv)
        self._shards: list[_Shard] = []
        self._selector = selectors.DefaultSelector()
        self._signalled: signal.Signals | None = None

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        previous_fd = signal.set_wakeup_fd(wake_w)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self._selector.register(wake_r, selectors.EVENT_READ, None)
        try:
            self._start()
            self._wait_listening()
            for shard in self._shards:
                print(f"lockserver listening on {shard.address}", flush=True)
            addresses = [s.address for s in self._shards if s.address is not None]
            print(f"lockserver shards: {server_list(addresses)}", flush=True)
            log.info("%d shards listening: %s", len(self._shards), server_list(addresses))
            self._watch()
        except _Stop as stop:
            return stop.code
        finally:
            self._stop_all()
            for s, handler in previous.items():
                signal.signal(s, handler)
            signal.set_wakeup_fd(previous_fd)
            self._selector.close()
            os.close(wake_r)
            os.close(wake_w)
        return 0  # pragma: no cover - _watch only leaves by _Stop

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signalled = signal.Signals(signum)

    def _check_signal(self) -> None:
        if self._signalled is not None:
            log.info("received %s: stopping %d shards", self._signalled.name, len(self._shards))
            raise _Stop(0)

    def _start(self) -> None:
        config, env = self._config, _environment()
        linux = sys.platform.startswith("linux")
        for i in range(config.processes):
            port = config.port + i if config.port else 0
            proc = subprocess.Popen(
                _command(self._argv, port),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                env=env,
                process_group=0,
                preexec_fn=_die_with_parent if linux else None,  # noqa: PLW1509 - no threads here
            )
            shard = _Shard(i, proc)
            self._shards.append(shard)
            os.set_blocking(shard.stdout.fileno(), False)
            self._selector.register(shard.stdout, selectors.EVENT_READ, shard)
            self._check_signal()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while any(s.address is None for s in self._shards):
            self._check_signal()
            self._check_exits(starting=True)
            if time.monotonic() > deadline:
                waiting = ", ".join(s.describe() for s in self._shards if s.address is None)
                log.error("no listening line within %.0f s from %s", START_TIMEOUT, waiting)
                raise _Stop(1)
            self._pump(_POLL)

    def _watch(self) -> None:
        while True:
            self._check_signal()
            self._check_exits(starting=False)
            self._pump(_POLL)

    def _pump(self, timeout: float) -> None:
        """Read what the shards wrote on stdout: the listening line names a shard's address;
        anything else is passed on (a shard prints nothing else today)."""
        for key, _ in self._selector.select(timeout):
            shard = key.data
            if shard is None:  # the signal wake-up pipe
                with contextlib.suppress(BlockingIOError):
                    os.read(key.fd, 512)
                continue
            assert isinstance(shard, _Shard)
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not data:  # EOF: the shard is exiting, _check_exits reports it
                self._selector.unregister(shard.stdout)
                continue
            *lines, shard.pending = (shard.pending + data).split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                match = _LISTENING.match(line)
                if match is not None and shard.address is None:
                    shard.address = match.group(1)
                else:
                    print(line, flush=True)

    def _check_exits(self, *, starting: bool) -> None:
        for shard in self._shards:
            code = shard.proc.poll()
            if code is None:
                continue
            if starting and shard.address is None and code in (1, 2):
                # It printed its own one-line error (cannot listen, bad TLS file).
                log.error("%s could not start: stopping the other shards", shard.describe())
                raise _Stop(code)
            log.error(
                "%s stopped (%s): stopping the other shards; restart the whole set",
                shard.describe(),
                _exit_status(code),
            )
            raise _Stop(1)

    def _stop_all(self) -> None:
        running = [s for s in self._shards if s.proc.poll() is None]
        for shard in running:
            with contextlib.suppress(ProcessLookupError):
                shard.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for shard in running:
            try:
                shard.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("%s did not stop within %.0f s: killed", shard.describe(), STOP_GRACE)
                shard.proc.kill()
                shard.proc.wait()
        for shard in self._shards:
            shard.stdout.close()


def supervise(config: ServerConfig, argv: Sequence[str]) -> int:
    """Run ``config.processes`` shard processes of the command line ``argv`` until a signal
    (exit code 0) or until one of them stops on its own (1; a shard that could not start: its
    own exit code). Every shard has stopped when this returns."""
    return _Supervisor(config, argv).run()

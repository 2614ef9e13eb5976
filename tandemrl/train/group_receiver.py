"""The trainer's door for environment processes (rollout.env_port): they push scored groups, it queues them.

``POST /groups`` takes one group (tandemrl/train/group_wire.py): 200 once it is queued, 503 while the queue is full
(push it again later), 400 naming the field of a malformed one. ``GET /status`` says where the trainer is: its policy
version, the queue's depth and capacity, ``max_staleness``, and ``finished`` once the run is over. Plain stdlib HTTP
on 127.0.0.1: nothing to install on either side beyond what the trainer has.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tandemrl.train.group_wire import GroupFormatError, group_from_json
from tandemrl.train.rollout_queue import QueuedGroups, RolloutQueue, oldest_version

PUT_WAIT_S = 1.0  # how long a push waits for room before it is answered 503
SILENT_S = 120.0  # the trainer waits and no environment has asked or pushed for this long: say so


class GroupReceiver:
    """A rollout producer for :class:`AsyncRollouts` whose groups come from environments over HTTP."""

    mirror = None  # the environments' server gets the weights through the trainer's sync.kind

    def __init__(self, out: RolloutQueue, max_staleness: int, port: int = 0, host: str = "127.0.0.1") -> None:
        self.out, self.max_staleness = out, max_staleness
        self.trainer_version = 0
        self.pushed = 0
        self.finished = False
        self.silent_s = SILENT_S
        self._last_contact = time.monotonic()
        self._silence_reported = False
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="tandemrl-groups", daemon=True)
        self._thread.start()

    def status(self) -> dict[str, Any]:
        return {"trainer_version": self.trainer_version, "queue_groups": self.out.depth_groups,
                "capacity_groups": self.out.capacity_groups, "max_staleness": self.max_staleness,
                "groups_received": self.pushed, "finished": self.finished}

    def receive(self, body: Any) -> tuple[int, dict[str, Any]]:
        try:
            scored = group_from_json(body)
        except GroupFormatError as exc:
            return 400, {"error": str(exc)}
        queued = QueuedGroups(scored, oldest_version(scored), source=scored.samples[0].source)
        if not self.out.put(queued, timeout=PUT_WAIT_S):
            return 503, {"error": "the trainer's queue is full: push again later", **self.status()}
        self.pushed += 1
        return 200, {"accepted": True, **self.status()}

    # the producer protocol of AsyncRollouts
    def submit(self, job: Any) -> None:
        """Environments draw their own prompts."""

    def contact(self) -> None:
        """An environment asked or pushed: it is there."""
        self._last_contact, self._silence_reported = time.monotonic(), False

    def gone(self) -> str | None:
        """Asked every second while the trainer waits. The receiver stopping ends the run; environments that all
        went quiet are reported once (the run waits: any environment started then feeds it)."""
        if not self._thread.is_alive():
            return f"the group receiver at {self.url} stopped"
        silent = time.monotonic() - self._last_contact
        if silent > self.silent_s and not self._silence_reported:
            self._silence_reported = True
            print(f"the trainer waits for groups and no environment has reached {self.url} for {silent:.0f} s "
                  f"({self.pushed} groups received so far): did they stop? The run goes on with any environment "
                  f"started now (python -m tandemrl.envs --trainer {self.url} ...)", flush=True)
        return None

    def stop(self) -> None:
        self.finished = True
        self.out.close()
        self._server.shutdown()
        self._server.server_close()


def _handler(receiver: GroupReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            receiver.contact()
            if self.path.rstrip("/") == "/status":
                self._answer(200, receiver.status())
            else:
                self._answer(404, {"error": f"no route {self.path}: GET /status, POST /groups"})

        def do_POST(self) -> None:  # noqa: N802
            receiver.contact()
            if self.path.rstrip("/") != "/groups":
                self._answer(404, {"error": f"no route {self.path}: GET /status, POST /groups"})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            except (ValueError, UnicodeDecodeError) as exc:
                self._answer(400, {"error": f"the body is not JSON: {exc}"})
                return
            self._answer(*receiver.receive(body))

        def _answer(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: the trainer's console is its own
            pass

    return Handler

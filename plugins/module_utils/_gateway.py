# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SGLang's model gateway (the ``smg`` package, pinned ``PINNED``) as a switch
drives it: its worker API, read and changed through the control-plane key.

What the API does, read off smg 1.13.0 running here in front of the lab's
servers (tests/unit/plugins/module_utils/test_gateway.py runs it again):

- ``POST /workers {"url": U}`` answers 202 with the new ``worker_id`` at once;
  a job then probes U and reads its server and model info. About 0.5 s later
  the worker is listed in ``GET /workers`` with ``status`` ``ready`` and
  ``is_healthy`` true, and ``GET /readiness`` turns from 503 ("insufficient
  healthy workers") to 200. A URL that does not answer is dropped by the job
  (``detect_connection_mode`` fails): it is never listed as ready.
- The same URL twice is 409 ``WORKER_ALREADY_EXISTS``; ``U`` and ``U/`` are two
  workers, so URLs are sent here without a trailing slash, always.
- ``DELETE /workers/{id}`` answers 202; the worker is listed as ``draining``
  (not healthy: new requests go elsewhere, or get 503 when it was the only
  one) for a fixed settle time (5 s; the Python launcher cannot change it),
  then is gone. An unknown id is 404 ``WORKER_NOT_FOUND``.
- The gateway does not drain: a stream in flight through a removed worker
  goes on to its end on its own connection (1500 tokens over 12.6 s, the
  worker removed 6 s in). A switch waits for the old server's own in-flight
  count (``_drain``) before it stops it.
- A worker added without its ``api_key`` is probed without one, even when
  the gateway itself has ``--api-key``: a server that requires a key is
  never registered (its ``/v1/models`` answers 401, the job retries, then
  drops it). ``add`` sends the server's key with its URL.
- Without the key the worker API is 401 ("Missing or invalid Authorization
  header"; a wrong key "Invalid authentication token"); ``/liveness``,
  ``/readiness`` and ``/health`` need none.

Order that costs clients nothing: add the new worker, wait until the gateway
itself lists it ready (``wait_ready``), then remove the old one: removing
first leaves the gateway with no healthy worker for the settle time.

The launcher that starts smg with its keys is ``_gateway_launch`` (the one file a gateway host
needs besides the gateway's venv).
"""

from __future__ import annotations

import time

from ansible_collections.inferops.sglang.plugins.module_utils._http import Response

PINNED = "1.13.0"
WORKERS = "/workers"
READY = "ready"


class GatewayError(Exception):
    """The gateway refused or did not answer; the message says what it said (never the key)."""


def worker_url(url: str) -> str:
    """A worker's URL as the gateway is given it: no trailing slash (``U`` and ``U/`` are two workers)."""
    return (url or "").strip().rstrip("/")


def _said(resp: Response) -> str:
    body = resp.body
    if isinstance(body, dict):
        detail = body.get("error") or body.get("message") or body
        if isinstance(detail, dict):  # the OpenAI-shaped error of the serving routes
            detail = detail.get("message") or detail
        return f"{resp.describe()}: {str(detail)[:300]}"
    return f"{resp.describe()}: {str(body)[:300]}" if body else resp.describe()


class Gateway:
    """One gateway, through a ``_http.Client`` that carries its control-plane key."""

    def __init__(self, client, clock=time.monotonic, sleep=time.sleep) -> None:
        self.client, self.clock, self.sleep = client, clock, sleep

    def workers(self) -> list[dict]:
        """Every worker the gateway lists: ``id``, ``url``, ``status``, ``healthy``."""
        resp = self.client.call("GET", WORKERS)
        if resp.kind != "ok" or not isinstance(resp.body, dict) or not isinstance(resp.body.get("workers"), list):
            raise GatewayError(f"GET {WORKERS} failed: {_said(resp)}")
        listed = []
        for item in resp.body["workers"]:
            if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not isinstance(item.get("url"), str):
                raise GatewayError(f"GET {WORKERS} listed a worker without an id and a URL: {str(item)[:200]}")
            listed.append(dict(id=item["id"], url=item["url"], status=str(item.get("status", "")),
                               healthy=item.get("is_healthy") is True))
        return listed

    def find(self, url: str) -> dict | None:
        """The listed worker at ``url`` (compared without a trailing slash), or None."""
        wanted = worker_url(url)
        return next((w for w in self.workers() if worker_url(w["url"]) == wanted), None)

    def add(self, url: str, api_key: str | None = None) -> str:
        """Ask the gateway to add the worker at ``url``, which requires ``api_key`` when set; its id.
        A worker already listed at that URL is not added twice (a switch run again after its
        controller was killed): its id is returned."""
        url = worker_url(url)
        resp = self.client.call("POST", WORKERS, dict(url=url, **({"api_key": api_key} if api_key else {})))
        if resp.status == 202 and isinstance(resp.body, dict) and isinstance(resp.body.get("worker_id"), str):
            return resp.body["worker_id"]
        if resp.status == 409:
            found = self.find(url)
            if found:
                return found["id"]
        raise GatewayError(f"POST {WORKERS} for {url} failed: {_said(resp)}")

    def remove(self, worker_id: str) -> bool:
        """Ask the gateway to remove a worker: True when asked, False when it was not there."""
        resp = self.client.call("DELETE", f"{WORKERS}/{worker_id}")
        if resp.status == 202:
            return True
        if resp.status == 404:
            return False
        raise GatewayError(f"DELETE {WORKERS}/{worker_id} failed: {_said(resp)}")

    def readiness(self) -> Response:
        """``GET /readiness``: 200 once the gateway has a healthy worker, else 503 with its reason."""
        return self.client.call("GET", "/readiness", auth=False)

    def _poll(self, check, timeout: float, interval: float, failure) -> float:
        """Call ``check()`` until it is true or ``timeout`` seconds have passed (then raise GatewayError with
        ``failure()``); the seconds it took."""
        started = self.clock()
        while not check():
            waited = self.clock() - started
            if waited >= timeout:
                raise GatewayError(failure())
            self.sleep(min(interval, timeout - waited))
        return round(self.clock() - started, 2)

    def wait_up(self, timeout: float, interval: float = 0.25) -> float:
        """Wait until the gateway answers its ``/liveness`` (it listens; it may have no worker yet);
        the seconds it took."""
        last = []

        def up() -> bool:
            last[:] = [self.client.call("GET", "/liveness", auth=False)]
            return last[0].status == 200
        return self._poll(up, timeout, interval,
                          lambda: f"the gateway did not answer /liveness within {timeout:g} s: {_said(last[0])}")

    def wait_ready(self, url: str, timeout: float, interval: float = 0.25) -> dict:
        """Wait until the gateway lists the worker at ``url`` as ready and healthy and its own
        readiness is 200: then it routes to it. Returns the worker and the seconds it took; a
        timeout raises with the last thing the gateway said of it."""
        state = {"last": "not listed", "worker": None}

        def routed() -> bool:
            found = self.find(url)
            if not found:
                return False
            state["last"] = f"listed as {found['status'] or 'no status'}{'' if found['healthy'] else ', not healthy'}"
            if found["status"] != READY or not found["healthy"]:
                return False
            resp = self.readiness()
            if resp.status != 200:
                state["last"] = f"ready, but the gateway's /readiness said {_said(resp)}"
                return False
            state["worker"] = found
            return True
        seconds = self._poll(routed, timeout, interval, lambda: (
            f"the gateway did not route to {worker_url(url)} within {timeout:g} s: {state['last']}"))
        return dict(worker=state["worker"], seconds=seconds)

    def wait_gone(self, worker_id: str, timeout: float, interval: float = 0.25) -> float:
        """Wait until the gateway no longer lists ``worker_id`` (a removed worker drains for a
        settle time first); the seconds it took."""
        return self._poll(lambda: not any(w["id"] == worker_id for w in self.workers()), timeout, interval,
                          lambda: f"the gateway still lists worker {worker_id} after {timeout:g} s")

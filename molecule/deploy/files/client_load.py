"""TEST DEVICE of molecule/deploy (tune.yml): a constant client load on the live server while a tune
runs beside it. Three loops of POST /generate (two of 4 tokens, one streamed of 64) against the URL
given, until SIGTERM; then it writes {"answered": N, "failed": N, "first_failure": text} to the
file given. A failed request is counted and sent again 50 ms later.

    python3 client_load.py URL OUT
"""

import json
import signal
import sys
import threading
import time
import urllib.request

URL, OUT = sys.argv[1], sys.argv[2]
STOP = threading.Event()
COUNTS = {"answered": 0, "failed": 0, "first_failure": None}
LOCK = threading.Lock()


def one(tokens: int, stream: bool) -> None:
    body = json.dumps({"text": "Say something about the sea.", "stream": stream,
                       "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}}).encode()
    request = urllib.request.Request(URL + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode()
        if response.status != 200 or (stream and "[DONE]" not in text):
            raise RuntimeError(f"status {response.status}, ended early: {text[-120:]!r}")


def loop(tokens: int, stream: bool) -> None:
    while not STOP.is_set():
        try:
            one(tokens, stream)
            with LOCK:
                COUNTS["answered"] += 1
        except Exception as exc:  # noqa: BLE001 - every failure is the figure
            with LOCK:
                COUNTS["failed"] += 1
                COUNTS["first_failure"] = COUNTS["first_failure"] or repr(exc)[:300]
            time.sleep(0.05)


def stop(_signum, _frame) -> None:
    STOP.set()


signal.signal(signal.SIGTERM, stop)
threads = [threading.Thread(target=loop, args=args) for args in ((4, False), (4, False), (64, True))]
for thread in threads:
    thread.start()
while not STOP.is_set():
    STOP.wait(0.5)
for thread in threads:
    thread.join(timeout=90)
with open(OUT, "w", encoding="utf-8") as handle:
    json.dump(COUNTS, handle)

"""The server soak (issue 16 item 1): one driver for the short CI test (`tests/test_sglang_soak.py`)
and the long runs (`benches/serving/soak.py`, CPU or an H200 server from `benches/serving`).

`run(server, knobs)` drives a live server with `knobs.clients` threads for at most
`knobs.requests` client operations and `knobs.minutes` minutes, while a monitor thread samples
`/server_info`; `settle_and_check(server)` then waits for the server to go idle and checks its
state; `control(server)` is the control conversation run before and after. Every operation is one
of `KINDS` (weights in `Knobs.weights`):

- `chat`: a 2-3-turn conversation through `/v1/chat/completions` sharing one system prompt (each turn
  is one request; later turns reuse the sealed pages of the earlier ones);
- `generate`: `/generate` over the shared prefix, some with logprobs, some `ignore_eos`;
- `stream_close`: a streamed `/generate` whose connection the client closes after 1-2 chunks;
- `abort`: a streamed `/generate` with a `rid`, aborted through `/abort_request` after its first chunk;
- `disconnect`: a `/generate` request sent on a raw socket that is closed without reading a byte;
- `bad`: the next of `BAD` (round robin): empty prompts, token ids out of the vocabulary, invalid
  UTF-8 in the JSON body, prompts longer than the pool or the context, `max_tokens` 0 and 1, a huge
  `n`, an unknown model name, malformed JSON;
- `burst`: `knobs.burst` long distinct prompts at once with `ignore_eos`: more than the pool holds,
  so the radix cache evicts and the scheduler retracts.

A bad request must get a 4xx or a valid answer; any 5xx, connection error or timeout is
`unexpected`. `knobs.text=False` (a server without a tokenizer: `--skip-tokenizer-init`, dummy
weights) sends token ids only and skips the text-only kinds.

The server gets the test-only plug-in `server_hooks/` on its PYTHONPATH (`hooks_env`): it reports
evicted tokens, SGLang's running / waiting requests and free slots, and the sha256 of each sealed
page in the radix tree (the control conversation's sealed bytes) under `/server_info`.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

HOOKS_DIR = Path(__file__).resolve().parent / "server_hooks"

#: The CPU server of the CI soak and of `benches/serving/soak.py`: 32 pages of 32 tokens, 8 running
#: requests.
CPU_ARGS = ("--kv-cache", "oscar", "--oscar-bits", "2", "--oscar-page-size", "32", "--oscar-k-group", "32",
            "--max-running-requests", "8", "--enable-metrics", "--enable-cache-report")
CPU_POOL_TOKENS = 1024
#: SGLang's own retraction test switch: every `INTERVAL`-th forward, when the scheduler checks the
#: decode batch's memory, it retracts requests as if the pool were full (scheduler.py
#: `TEST_RETRACT`), through the same code as a real retraction. SGLang's admission reserves room
#: for the decode of what it admits, so on a short run the pool alone rarely forces one.
RETRACT_ENV = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "20"}


SYSTEM = ("You are a concise assistant for a travel agency. Answer in one short sentence. You know the capitals, "
          "rivers and mountains of every European country, the main train routes, typical travel times, and the "
          "best seasons to visit. Never invent facts; say 'I do not know' instead.")
QUESTIONS = ["What is the capital of France?", "Which river flows through Vienna?", "Name a mountain in Italy.",
             "How long is the train from Paris to Lyon?", "When should I visit Norway?", "What is 2 + 2?",
             "Which sea borders Croatia?", "Name one famous museum in Madrid.", "Is Bern a capital?",
             "What language is spoken in Portugal?", "Tell me about the Alps.", "Where is the Danube?"]
FOLLOW_UPS = ["Why?", "Say more.", "And in winter?", "Which one is closest?", "Thanks. Anything else?"]
CONTROL_1 = SYSTEM + "\nQuestion: Which river flows through Paris, and which sea does it reach?\nAnswer:"
CONTROL_2 = "\nQuestion: And which river flows through London?\nAnswer:"

KINDS = ("chat", "generate", "stream_close", "abort", "disconnect", "bad", "burst")
TEXT_ONLY_KINDS = {"chat"}
#: Bad requests, sent in turn: (name, needs a tokenizer).
BAD = [("empty_text", True), ("empty_ids", False), ("oov_id", False), ("negative_id", False),
       ("bad_utf8", True), ("bad_utf8_chat", True), ("too_long_pool", False), ("too_long_context", False),
       ("max_tokens_0", False), ("max_tokens_1", False), ("chat_max_tokens_0", True), ("huge_n", False),
       ("unknown_model", True), ("malformed_json", False), ("negative_max_tokens", False)]


@dataclass
class Knobs:
    requests: int = 200  # client operations at most (a conversation turn, a burst request: one each)
    minutes: float = 2.0  # and wall-clock bound
    clients: int = 6
    seed: int = 0
    text: bool = True  # the server has a tokenizer (text and chat endpoints)
    vocab: int = 49152
    max_new: int = 24  # generated tokens of an ordinary request, at most
    huge_n: int = 64
    # A burst: `burst` distinct prompts of `burst_len` tokens at once, each generating `burst_new`
    # (ignore_eos): 8 x 5 pages of 32 tokens, more than the 32-page CPU pool holds with its cache.
    burst: int = 8
    burst_len: int = 120
    burst_new: int = 24
    timeout: float = 240.0  # per HTTP request
    monitor_s: float = 2.0
    cover: bool = True  # first every kind once and every bad request once (even past `minutes`), then random
    weights: dict[str, float] = field(default_factory=lambda: {
        "chat": 3, "generate": 3, "stream_close": 1, "abort": 1, "disconnect": 1, "bad": 2, "burst": 0.4})


@dataclass
class Outcome:
    kind: str
    result: str  # ok | http_4xx | aborted | unexpected
    status: int | None = None
    detail: str = ""


def hooks_env(env: dict[str, str], *, retract: bool = True, retract_interval: int | None = None) -> dict[str, str]:
    """`env` with the test-only plug-in first on PYTHONPATH (and `RETRACT_ENV` unless not `retract`;
    `retract_interval`: another `SGLANG_TEST_RETRACT_INTERVAL` than `RETRACT_ENV`'s)."""
    old = env.get("PYTHONPATH")
    retract_env = dict(RETRACT_ENV, **({} if retract_interval is None else
                                       {"SGLANG_TEST_RETRACT_INTERVAL": str(retract_interval)}))
    return {**env, **(retract_env if retract else {}),
            "PYTHONPATH": os.pathsep.join([str(HOOKS_DIR)] + ([old] if old else []))}


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------


def post_raw(url: str, path: str, body: bytes, timeout: float) -> tuple[int | None, Any]:
    """POST raw bytes: (status, parsed JSON or text); (None, repr of the error) when no HTTP answer."""
    req = urllib.request.Request(url + path, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, data = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, data = e.code, e.read()
    except Exception as e:  # noqa: BLE001 - connection refused / reset / timeout: reported
        return None, repr(e)
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data.decode(errors="replace")


def post(url: str, path: str, payload: dict[str, Any], timeout: float) -> tuple[int | None, Any]:
    return post_raw(url, path, json.dumps(payload).encode(), timeout)


def get(url: str, path: str, timeout: float = 60) -> Any:
    with urllib.request.urlopen(url + path, timeout=timeout) as r:
        body = r.read().decode()
    try:
        return json.loads(body)
    except ValueError:
        return body


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


def stream_chunks(url: str, payload: dict[str, Any], timeout: float, keep: int | None,
                  on_first: Callable[[], None] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """A streamed `/generate`: (status, the `data:` chunks read). With `keep`, the connection is
    closed after that many chunks (the client goes away mid-stream)."""
    host, port = _host_port(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    chunks: list[dict[str, Any]] = []
    try:
        conn.request("POST", "/generate", body=json.dumps({**payload, "stream": True}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            resp.read()
            return resp.status, chunks
        while True:
            line = resp.fp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunks.append(json.loads(line[5:]))
            if len(chunks) == 1 and on_first is not None:
                on_first()
            if keep is not None and len(chunks) >= keep:
                break
        return 200, chunks
    finally:
        conn.close()


def send_and_close(url: str, payload: dict[str, Any]) -> None:
    """Send a whole `/generate` request on a raw socket and close it without reading the answer."""
    host, port = _host_port(url)
    body = json.dumps(payload).encode()
    head = (f"POST /generate HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(head + body)


# ---------------------------------------------------------------------------------------------
# The soak
# ---------------------------------------------------------------------------------------------


class Soak:
    """One soak of one live server (`server.url`, `server.log()`); see the module docstring."""

    def __init__(self, server: Any, knobs: Knobs) -> None:
        self.server, self.k, self.url = server, knobs, server.url
        self.lock = threading.Lock()
        self.outcomes: list[Outcome] = []
        self.started = 0
        self.bad_next = 0
        self.plan: list[str] = []
        self.local = threading.local()  # .planned: this thread runs a planned operation
        self.t0 = 0.0
        self.deadline = 0.0
        self.stop = threading.Event()
        self.samples: list[dict[str, Any]] = []
        self.retractions_seen = 0
        info = get(self.url, "/server_info")
        self.pool_tokens = pool_tokens(info)
        self.page_size = int(find_key(info, "page_size") or 1)
        self.context_len = int(find_key(info, "context_length") or 0) or self._context_from_models()
        self.system_ids = self._ids(10**6, 100)  # the shared prefix of the token-id requests

    def _context_from_models(self) -> int:
        try:
            return int(get(self.url, "/v1/models")["data"][0]["max_model_len"])
        except Exception:  # noqa: BLE001
            return 8192

    # -- bookkeeping ---------------------------------------------------------------------------
    def _take(self, n: int = 1) -> bool:
        """Reserve `n` operations of the budget; False once the budget or the time is spent."""
        with self.lock:
            late = time.monotonic() > self.deadline and not getattr(self.local, "planned", False)
            if self.started + n > self.k.requests or late or self.stop.is_set():
                return False
            self.started += n
            return True

    def _record(self, o: Outcome) -> None:
        with self.lock:
            self.outcomes.append(o)

    def _ids(self, key: int, n: int) -> list[int]:
        r = random.Random(self.k.seed * 1_000_003 + key)
        return [r.randrange(100, self.k.vocab - 1) for _ in range(n)]

    def _gen_ok(self, kind: str, status: int | None, body: Any, n: int = 1) -> Outcome:
        if status == 200:
            items = body if isinstance(body, list) else [body]
            if len(items) == n and all(isinstance(x, dict) and "meta_info" in x and
                                       ("text" in x or "output_ids" in x) for x in items):
                with self.lock:
                    self.retractions_seen += sum(int(x["meta_info"].get("num_retractions", 0) or 0) for x in items)
                return Outcome(kind, "ok", status)
            return Outcome(kind, "unexpected", status, f"invalid body: {str(body)[:300]}")
        if status is not None and 400 <= status < 500:
            return Outcome(kind, "http_4xx", status, str(body)[:300])
        return Outcome(kind, "unexpected", status, str(body)[:300])

    def _chat_ok(self, kind: str, status: int | None, body: Any, n: int = 1) -> Outcome:
        if status == 200:
            if isinstance(body, dict) and len(body.get("choices") or []) == n:
                return Outcome(kind, "ok", status)
            return Outcome(kind, "unexpected", status, f"invalid body: {str(body)[:300]}")
        if status is not None and 400 <= status < 500:
            return Outcome(kind, "http_4xx", status, str(body)[:300])
        return Outcome(kind, "unexpected", status, str(body)[:300])

    def _prompt(self, r: random.Random) -> dict[str, Any]:
        """A prompt over the shared prefix: text, or token ids without a tokenizer."""
        if self.k.text:
            return {"text": f"{SYSTEM}\nQuestion: {r.choice(QUESTIONS)}\nAnswer:"}
        return {"input_ids": self.system_ids + self._ids(r.randrange(10**9), r.randrange(4, 40))}

    # -- operations ------------------------------------------------------------------------------
    def op_chat(self, r: random.Random) -> None:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r.choice(QUESTIONS)}]
        for turn in range(r.randrange(2, 4)):
            if not self._take():
                return
            payload = {"model": "default", "messages": messages, "max_tokens": r.randrange(1, self.k.max_new + 1),
                       "temperature": r.choice([0, 0.7])}
            status, body = post(self.url, "/v1/chat/completions", payload, self.k.timeout)
            o = self._chat_ok("chat", status, body)
            self._record(o)
            if o.result != "ok":
                return
            messages = messages + [{"role": "assistant", "content": body["choices"][0]["message"]["content"] or "ok"},
                                   {"role": "user", "content": r.choice(FOLLOW_UPS)}]

    def op_generate(self, r: random.Random) -> None:
        if not self._take():
            return
        long_ = r.random() < 0.3
        sp = {"max_new_tokens": r.randrange(8, 2 * self.k.max_new) if long_ else r.randrange(1, self.k.max_new + 1),
              "temperature": r.choice([0, 0.8]), "ignore_eos": long_}
        payload = {**self._prompt(r), "sampling_params": sp, "return_logprob": r.random() < 0.3}
        status, body = post(self.url, "/generate", payload, self.k.timeout)
        self._record(self._gen_ok("generate", status, body))

    def op_stream_close(self, r: random.Random) -> None:
        if not self._take():
            return
        payload = {**self._prompt(r), "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}
        try:
            status, chunks = stream_chunks(self.url, payload, self.k.timeout, keep=r.randrange(1, 3))
        except Exception as e:  # noqa: BLE001
            self._record(Outcome("stream_close", "unexpected", None, repr(e)))
            return
        ok = status == 200 and chunks
        self._record(Outcome("stream_close", "aborted" if ok else "unexpected", status, "" if ok else "no chunk"))

    def op_abort(self, r: random.Random) -> None:
        if not self._take():
            return
        rid = f"soak-{self.k.seed}-{r.randrange(10**12)}"
        payload = {**self._prompt(r), "rid": rid, "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}
        aborted: list[Any] = []

        def abort() -> None:
            aborted.append(post(self.url, "/abort_request", {"rid": rid}, 60))

        try:
            status, chunks = stream_chunks(self.url, payload, self.k.timeout, keep=None, on_first=abort)
        except Exception as e:  # noqa: BLE001
            self._record(Outcome("abort", "unexpected", None, repr(e)))
            return
        last = chunks[-1]["meta_info"].get("finish_reason") or {} if chunks else {}
        if status != 200 or not aborted or aborted[0][0] != 200:
            self._record(Outcome("abort", "unexpected", status, f"abort_request answered {aborted}"))
        elif last.get("type") == "abort":
            self._record(Outcome("abort", "aborted", status))
        else:  # it finished before the abort reached the scheduler: a valid answer
            self._record(Outcome("abort", "ok", status, f"finished first: {last}"))

    def op_disconnect(self, r: random.Random) -> None:
        if not self._take():
            return
        payload = {**self._prompt(r), "sampling_params": {"max_new_tokens": 32, "ignore_eos": True}}
        try:
            send_and_close(self.url, payload)
        except Exception as e:  # noqa: BLE001
            self._record(Outcome("disconnect", "unexpected", None, repr(e)))
            return
        self._record(Outcome("disconnect", "aborted"))

    def op_bad(self, r: random.Random) -> None:
        if not self._take():
            return
        with self.lock:
            choices = [name for name, needs_text in BAD if self.k.text or not needs_text]
            name = choices[self.bad_next % len(choices)]
            self.bad_next += 1
        self._record(self.bad_request(name, r))

    def bad_request(self, name: str, r: random.Random) -> Outcome:
        u, t = self.url, self.k.timeout
        sp1 = {"max_new_tokens": 1}
        kind = f"bad:{name}"
        if name == "empty_text":
            return self._gen_ok(kind, *post(u, "/generate", {"text": "", "sampling_params": sp1}, t))
        if name == "empty_ids":
            return self._gen_ok(kind, *post(u, "/generate", {"input_ids": [], "sampling_params": sp1}, t))
        if name == "oov_id":
            ids = self._ids(r.randrange(10**9), 8) + [self.k.vocab + r.randrange(0, 10**6)]
            return self._gen_ok(kind, *post(u, "/generate", {"input_ids": ids, "sampling_params": sp1}, t))
        if name == "negative_id":
            ids = [-r.randrange(1, 1000)] + self._ids(r.randrange(10**9), 8)
            return self._gen_ok(kind, *post(u, "/generate", {"input_ids": ids, "sampling_params": sp1}, t))
        if name == "bad_utf8":  # raw bytes that are not UTF-8 inside a JSON string
            body = b'{"text": "Hello \xff\xfe\xc3\x28 there", "sampling_params": {"max_new_tokens": 2}}'
            return self._gen_ok(kind, *post_raw(u, "/generate", body, t))
        if name == "bad_utf8_chat":
            body = (b'{"model": "default", "messages": [{"role": "user", "content": "Hi \xc3\x28\xa0\xa1"}], '
                    b'"max_tokens": 2}')
            return self._chat_ok(kind, *post_raw(u, "/v1/chat/completions", body, t))
        if name == "too_long_pool":
            ids = self._ids(r.randrange(10**9), self.pool_tokens + self.page_size)
            return self._gen_ok(kind, *post(u, "/generate", {"input_ids": ids, "sampling_params": sp1}, t))
        if name == "too_long_context":
            ids = self._ids(r.randrange(10**9), self.context_len + 8)
            return self._gen_ok(kind, *post(u, "/generate", {"input_ids": ids, "sampling_params": sp1}, t))
        if name in ("max_tokens_0", "max_tokens_1"):
            sp = {"max_new_tokens": int(name[-1]), "temperature": 0}
            return self._gen_ok(kind, *post(u, "/generate", {**self._prompt(r), "sampling_params": sp}, t))
        if name == "chat_max_tokens_0":
            payload = {"model": "default", "messages": [{"role": "user", "content": r.choice(QUESTIONS)}],
                       "max_tokens": 0}
            return self._chat_ok(kind, *post(u, "/v1/chat/completions", payload, t))
        if name == "huge_n":
            sp = {"max_new_tokens": 1, "n": self.k.huge_n, "temperature": 0.8}
            return self._gen_ok(kind, *post(u, "/generate", {**self._prompt(r), "sampling_params": sp}, t),
                                n=self.k.huge_n)
        if name == "unknown_model":
            payload = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            return self._chat_ok(kind, *post(u, "/v1/chat/completions", payload, t))
        if name == "malformed_json":
            return self._gen_ok(kind, *post_raw(u, "/generate", b'{"text": "Hi", "sampling_params": {', t))
        if name == "negative_max_tokens":
            sp = {"max_new_tokens": -5}
            return self._gen_ok(kind, *post(u, "/generate", {**self._prompt(r), "sampling_params": sp}, t))
        raise ValueError(f"unknown bad request {name!r}")

    def op_burst(self, r: random.Random) -> None:
        n = self.k.burst
        if not self._take(n):
            return
        base = r.randrange(10**9)

        def one(i: int) -> None:
            ids = self._ids(base + i, self.k.burst_len)
            sp = {"max_new_tokens": self.k.burst_new, "ignore_eos": True, "temperature": 0}
            self._record(self._gen_ok("burst", *post(self.url, "/generate", {"input_ids": ids, "sampling_params": sp},
                                                     self.k.timeout)))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    # -- the run ---------------------------------------------------------------------------------
    def client(self, index: int) -> None:
        r = random.Random(self.k.seed * 7919 + index)
        kinds = [k for k in KINDS if self.k.text or k not in TEXT_ONLY_KINDS]
        weights = [self.k.weights.get(k, 0) for k in kinds]
        while not self.stop.is_set() and self.started < self.k.requests:
            with self.lock:
                planned = self.plan.pop(0) if self.plan else None
            if planned is None and time.monotonic() > self.deadline:
                break
            self.local.planned = planned is not None  # planned operations run even past the deadline
            kind = planned or r.choices(kinds, weights)[0]
            try:
                getattr(self, f"op_{kind}")(r)
            except Exception as e:  # noqa: BLE001 - a driver error is reported, never hidden
                self._record(Outcome(kind, "unexpected", None, f"driver: {e!r}"))

    def monitor(self) -> None:
        while not self.stop.wait(self.k.monitor_s):
            try:
                self.samples.append(sample(self.url))
            except Exception as e:  # noqa: BLE001
                self.samples.append({"error": repr(e)})

    def run(self) -> dict[str, Any]:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + 60 * self.k.minutes
        if self.k.cover:  # every kind once (a burst and a conversation first), then every bad request
            self.plan = [k for k in ("burst", "chat", "generate", "stream_close", "abort", "disconnect")
                         if self.k.text or k not in TEXT_ONLY_KINDS]
            self.plan += ["bad"] * sum(1 for _, needs_text in BAD if self.k.text or not needs_text)
        mon = threading.Thread(target=self.monitor, daemon=True)
        mon.start()
        threads = [threading.Thread(target=self.client, args=(i,)) for i in range(self.k.clients)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.stop.set()
        mon.join(timeout=60)
        wall = time.monotonic() - self.t0
        by_kind: dict[str, Counter] = {}
        for o in self.outcomes:
            by_kind.setdefault(o.kind, Counter())[o.result if o.status is None or o.result != "http_4xx"
                                                  else f"http_{o.status}"] += 1
        good = [s for s in self.samples if "error" not in s]
        results = Counter(o.result for o in self.outcomes)
        return {
            "knobs": asdict(self.k), "wall_s": round(wall, 1), "operations": len(self.outcomes),
            "served": results["ok"], "aborted": results["aborted"], "http_4xx": results["http_4xx"],
            "unexpected": results["unexpected"],
            "unexpected_detail": [asdict(o) for o in self.outcomes if o.result == "unexpected"][:20],
            "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
            "pool_tokens": self.pool_tokens, "page_size": self.page_size,
            "peak_pages_in_use": max((s["sealed"] + s["open"] for s in good), default=None),
            "peak_open_pages": max((s["open"] for s in good), default=None),
            "peak_staging_in_use": max((s["staging"] for s in good), default=None),
            "peak_running_reqs": max((s["running"] for s in good), default=None),
            "peak_waiting_reqs": max((s["waiting"] for s in good), default=None),
            "monitor_samples": len(good), "monitor_errors": len(self.samples) - len(good),
            "retractions_in_answers": self.retractions_seen,
        }


def find_key(obj: Any, key: str) -> Any:
    """The first value of ``key`` in a nested JSON answer (`/server_info`), depth first; None if absent."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        obj = list(obj.values())
    if isinstance(obj, list):
        for v in obj:
            found = find_key(v, key)
            if found is not None:
                return found
    return None


def pool_tokens(info: dict[str, Any]) -> int:
    """Tokens in the KV pool as the server reports them (`/server_info`)."""
    v = find_key(info, "token_capacity")
    if v is None:
        v = find_key(info, "max_total_num_tokens")
    if v is None:
        raise KeyError("no token_capacity / max_total_num_tokens in /server_info")
    return int(v)


def sample(url: str) -> dict[str, Any]:
    """The pool and scheduler state now (rank 0)."""
    st = get(url, "/server_info")["internal_states"][0]
    o, t = st["oscar"], st.get("oscar_test") or {}
    return {"sealed": o["pages"]["sealed"], "open": o["pages"]["open"], "free": o["pages"]["free"],
            "tree": o["tree_pages"], "locked": o["locked_pages"], "staging": o["staging_pages_in_use"],
            "staging_total": o["staging_pages_total"], "seals_total": o["seals_total"],
            "running": t.get("running_reqs", 0), "waiting": t.get("waiting_reqs", 0),
            "available_tokens": t.get("available_tokens"), "total_tokens": t.get("total_tokens"),
            "evicted_tokens": t.get("evicted_tokens"), "sealed_pages": t.get("sealed_pages"),
            "usable_pages": o["token_capacity"] // o["page_size"]}


def metrics(url: str) -> dict[str, float]:
    """`/metrics` as {sample name with labels: value} (only `oscar:` and `sglang:` samples)."""
    out: dict[str, float] = {}
    for line in get(url, "/metrics").splitlines():
        m = re.match(r"^((?:oscar|sglang):[^ ]+) ([-+0-9.eE]+|NaN)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def metric(ms: dict[str, float], name: str, **labels: str) -> float | None:
    """The sum of the samples `name{...}` whose labels include `labels`."""
    vals = [v for k, v in ms.items() if k.split("{", 1)[0] == name
            and all(f'{a}="{b}"' in k for a, b in labels.items())]
    return sum(vals) if vals else None


def wait_idle(url: str, timeout: float = 300) -> dict[str, Any]:
    """Wait (bounded) until nothing runs or waits and the pool holds no open page, no lock and no
    staging page in use (requests aborted by a disconnect go asynchronously); return that sample.
    Raises with the last sample on timeout."""
    deadline = time.monotonic() + timeout
    s: dict[str, Any] = {}
    while time.monotonic() < deadline:
        s = sample(url)
        if (s["running"], s["waiting"], s["open"], s["locked"], s["staging"]) == (0, 0, 0, 0, 0):
            return s
        time.sleep(1.0)
    raise AssertionError(f"the server did not go idle within {timeout:.0f}s: {s}")


def flush_cache(url: str, timeout: float = 120) -> None:
    """`/flush_cache` (SGLang refuses it while requests run or wait: retried, bounded)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = post_raw(url, "/flush_cache", b"", 60)
        if last[0] == 200:
            return
        time.sleep(1.0)
    raise AssertionError(f"/flush_cache kept failing: {last}")


def control(url: str, *, text: bool, vocab: int) -> dict[str, Any]:
    """The control conversation on an empty cache: turn 1, then turn 2 over turn 1's sealed pages
    (prompt = turn 1's prompt + answer + a new question), both greedy with logprobs; and the sha256
    of each sealed page in the tree afterwards (the pages of this conversation only)."""
    flush_cache(url)
    if text:
        p1: dict[str, Any] = {"text": CONTROL_1}
    else:
        r = random.Random(4242)
        p1 = {"input_ids": [r.randrange(100, vocab - 1) for _ in range(300)]}
    sp = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
    s1, a1 = post(url, "/generate", {**p1, "sampling_params": sp, "return_logprob": True}, 600)
    if s1 != 200:
        raise AssertionError(f"control turn 1: {s1} {a1}")
    if text:
        p2: dict[str, Any] = {"text": CONTROL_1 + a1["text"] + CONTROL_2}
    else:
        p2 = {"input_ids": p1["input_ids"] + a1["output_ids"] + [r.randrange(100, vocab - 1) for _ in range(20)]}
    s2, a2 = post(url, "/generate", {**p2, "sampling_params": sp, "return_logprob": True}, 600)
    if s2 != 200:
        raise AssertionError(f"control turn 2: {s2} {a2}")
    wait_idle(url)
    lp = lambda a: [(t[1], t[0]) for t in a["meta_info"]["output_token_logprobs"]]  # noqa: E731
    return {"turn1": lp(a1), "turn2": lp(a2), "cached_tokens_turn2": int(a2["meta_info"].get("cached_tokens", 0)),
            "sealed_pages": sample(url)["sealed_pages"]}


def settle_and_check(server: Any, *, log_from: int = 0, timeout: float = 300) -> dict[str, Any]:
    """After the soak: the server answers, goes idle with no open page, lock or staging page in use,
    every page free or cached, SGLang's allocator agrees, `/flush_cache` frees every page, a request
    is served, and the log since `log_from` holds no traceback. Returns the figures (`problems`: what
    failed)."""
    url = server.url
    problems: list[str] = []
    out: dict[str, Any] = {}
    try:
        get(url, "/health", timeout=30)
    except Exception as e:  # noqa: BLE001
        return {"problems": [f"server not answering /health after the soak: {e!r}"], "alive": False}
    out["alive"] = True
    idle = wait_idle(url, timeout)
    out["idle"] = {k: v for k, v in idle.items() if k != "sealed_pages"}
    if idle["sealed"] != idle["tree"]:
        problems.append(f"sealed pages outside the radix tree while idle: {idle}")
    if idle["sealed"] + idle["free"] != idle["usable_pages"]:
        problems.append(f"pages neither free nor cached: {idle}")
    ms = metrics(url)
    out["gauges"] = {"open": metric(ms, "oscar:pages", state="open"), "sealed": metric(ms, "oscar:pages", state="sealed"),
                     "free": metric(ms, "oscar:pages", state="free"),
                     "staging_in_use": metric(ms, "oscar:staging_pages_in_use")}
    if out["gauges"]["open"] != 0 or out["gauges"]["staging_in_use"] != 0:
        problems.append(f"/metrics shows open pages or staging in use while idle: {out['gauges']}")
    out["retractions"] = metric(ms, "sglang:num_retracted_requests_total")
    out["evicted_pages"] = (idle["evicted_tokens"] or 0) // max(1, server_page_size(url))
    flush_cache(url)
    after = wait_idle(url, 60)
    out["after_flush"] = {k: v for k, v in after.items() if k != "sealed_pages"}
    out["leaked_pages"] = after["usable_pages"] - after["free"]
    out["leaked_tokens_sglang"] = (after["total_tokens"] or 0) - (after["available_tokens"] or 0)
    if out["leaked_pages"] or after["sealed"] or after["tree"] or out["leaked_tokens_sglang"]:
        problems.append(f"pages not free after /flush_cache: {out['after_flush']}")
    status, body = post(url, "/generate", {"input_ids": [1000, 2000, 3000, 4000],
                                           "sampling_params": {"max_new_tokens": 2}}, 300)
    if status != 200:
        problems.append(f"a request after the soak failed: {status} {body}")
    out["tracebacks"] = tracebacks(server.log()[log_from:])
    if out["tracebacks"]:
        problems.append(f"{len(out['tracebacks'])} traceback(s) in the server log, the first:\n{out['tracebacks'][0]}")
    out["problems"] = problems
    return out


def server_page_size(url: str) -> int:
    return int(find_key(get(url, "/server_info"), "page_size") or 1)


def tracebacks(log: str) -> list[str]:
    """The tracebacks in a server log (each with 25 lines of context)."""
    lines = log.splitlines()
    return ["\n".join(lines[i:i + 25]) for i, line in enumerate(lines)
            if "Traceback (most recent call last)" in line or "Scheduler hit an exception" in line]


def compare_controls(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs between two control runs (empty: identical tokens, logprobs and sealed bytes)."""
    problems = []
    for key in ("turn1", "turn2", "cached_tokens_turn2", "sealed_pages"):
        if before[key] != after[key]:
            problems.append(f"control {key} differs: before {str(before[key])[:400]} after {str(after[key])[:400]}")
    if not before["cached_tokens_turn2"]:
        problems.append("control turn 2 reused no cached token: it did not read turn 1's sealed pages")
    if not before["sealed_pages"]:
        problems.append(f"control left no sealed page in the tree to compare: {before['sealed_pages']}")
    return problems


def soak(server: Any, knobs: Knobs) -> dict[str, Any]:
    """The whole protocol on one live server: control, soak, settle and check, control again.
    Returns the report; `report["problems"]` lists every failed check (empty: passed)."""
    t0 = time.monotonic()
    # The log from here on (SGLang logs a harmless /freeze_gc connection traceback while it starts).
    log_from = len(server.log())
    before = control(server.url, text=knobs.text, vocab=knobs.vocab)
    t1 = time.monotonic()
    report = Soak(server, knobs).run()
    t2 = time.monotonic()
    check = settle_and_check(server, log_from=log_from)
    report["timing_s"] = {"control": round(t1 - t0, 1), "soak": round(t2 - t1, 1),
                          "settle_and_check": round(time.monotonic() - t2, 1)}
    report.update({k: v for k, v in check.items() if k != "problems"})
    problems = list(check["problems"])
    if report["unexpected"]:
        problems.append(f"{report['unexpected']} unexpected outcome(s): {report['unexpected_detail'][:5]}")
    if check.get("alive"):
        after = control(server.url, text=knobs.text, vocab=knobs.vocab)
        problems += compare_controls(before, after)
        report["control"] = {"tokens_turn1": len(before["turn1"]), "tokens_turn2": len(before["turn2"]),
                             "cached_tokens_turn2": before["cached_tokens_turn2"],
                             "sealed_pages_compared": len(before["sealed_pages"] or []),
                             "identical": not compare_controls(before, after)}
    report["problems"] = problems
    return report

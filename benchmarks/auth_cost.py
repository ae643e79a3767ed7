"""What deciding who is calling costs per request, on one core: a client token verified, a
stream key checked against a key file of ``--keys`` entries, the browser policy (host, origin,
CORS) judged, the whole :class:`Authenticator` path for a token and for a key, and, per audio
output a checkpointed stream writes, one rows item sealed (AES-256-GCM), in one run.

Each is timed over ``--calls`` calls, ``--repeats`` times in alternating order; the figures
are each one's median calls per second, microseconds per call, and that time as a fraction of
one step budget (13.3 ms, a 75 Hz frame), so that the cost reads against what one stream's
single step costs the engine. Authentication runs once per request, not per step.

    .venv/bin/python benchmarks/auth_cost.py --calls 20000 --repeats 5

Authentication and the browser policy run once per request; a seal runs once per output
(every chunk, about 200 ms of audio) of a stream with checkpoints. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from collections.abc import Callable

from cadenza.config import AuthConfig
from cadenza.edge.auth.api_keys import ApiKeys
from cadenza.edge.auth.authenticator import Authenticator
from cadenza.edge.auth.client_tokens import ClientTokens, TokenScope
from cadenza.edge.auth.principal import Principal
from cadenza.edge.server.browser_policy import judge
from cadenza.edge.streams.checkpoint_seal import CheckpointSeal

SECRET = "benchmark-secret-of-more-than-thirty-two-characters"
STEP_BUDGET_US = 1e6 / 75


def _rate(call: Callable[[], object], calls: int) -> float:
    """Calls per second of ``call`` over ``calls`` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return calls / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=5, help="timings per path (median)")
    parser.add_argument("--keys", type=int, default=100, help="entries in the key file")
    args = parser.parse_args()

    keys = [f"key-{i:04d}" for i in range(args.keys)]
    api_keys = ApiKeys([hashlib.sha256(k.encode()).digest() for k in keys])
    tokens = ClientTokens(SECRET)
    minter = Principal(kind="stream_key", client="key:abc", holder="key:abc")
    scope = TokenScope(models=("orpheus",), max_audio_s=120, origin="https://app.example.com")
    token, _ = tokens.mint(minter, 3600, scope)
    auth = Authenticator(api_keys=api_keys, tokens=tokens)
    policy = AuthConfig(
        allowed_origins=["https://app.example.com", "https://other.example.com"],
        trusted_hosts=["voice.example.com"],
    )
    last_key = keys[-1]
    seal = CheckpointSeal.from_secret(SECRET).stream("resume-token")
    rows_item = bytes(range(256)) * 2  # a 200 ms output's rows and boundary, msgpacked

    paths: dict[str, Callable[[], object]] = {
        "token_verify": lambda: tokens.verify(token),
        "key_check": lambda: api_keys.check(last_key),
        "browser_policy": lambda: judge(
            policy,
            method="POST",
            origin="https://app.example.com",
            host="voice.example.com",
            preflight=False,
        ),
        "seal_output": lambda: seal.seal(rows_item, "rows/0"),
        "authenticate_token": lambda: auth.principal(token, "10.0.0.1", "https://app.example.com"),
        "authenticate_key": lambda: auth.principal(last_key, "10.0.0.1"),
    }
    rates: dict[str, list[float]] = {name: [] for name in paths}
    for repeat in range(args.repeats):
        order = list(paths) if repeat % 2 == 0 else list(reversed(paths))
        for name in order:
            rates[name].append(_rate(paths[name], args.calls))
    result = {
        name: {
            "per_second": round(statistics.median(values)),
            "us_per_call": round(1e6 / statistics.median(values), 2),
            "step_budgets": round(1e6 / statistics.median(values) / STEP_BUDGET_US, 5),
        }
        for name, values in rates.items()
    }
    print(json.dumps({"calls": args.calls, "repeats": args.repeats, "keys": args.keys, **result}))


if __name__ == "__main__":
    main()

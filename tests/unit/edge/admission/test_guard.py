import asyncio
import json
import logging

import pytest

from cadenza.config import GuardConfig
from cadenza.edge.admission.guard import (
    GuardError,
    GuardVerdict,
    PhraseListGuard,
    build_guard,
    run_guard,
)


def _run(coroutine):
    return asyncio.run(coroutine)


def test_phrase_list_matches_whole_words_case_insensitively():
    guard = PhraseListGuard(["# comment", "forbidden   phrase", "secret"])
    assert not _run(guard.check("This has a FORBIDDEN\nphrase in it")).allowed
    assert not _run(guard.check("my secret.")).allowed
    assert _run(guard.check("secretary and secrets are fine")).allowed


class SlowGuard:
    name = "slow"

    async def check(self, text):
        await asyncio.sleep(1)
        return GuardVerdict(True)


class BrokenGuard:
    name = "broken"

    async def check(self, text):
        raise RuntimeError("model server down")


@pytest.mark.parametrize("guard", [SlowGuard(), BrokenGuard()])
@pytest.mark.parametrize("fail_open", [True, False])
def test_timeouts_and_errors_fall_back_deterministically(guard, fail_open, caplog):
    config = GuardConfig(policy="none", timeout_s=0.05, fail_open=fail_open)
    with caplog.at_level(logging.INFO, logger="cadenza.audit"):
        verdict = _run(run_guard(guard, "some text", config, client="key:abc"))
    assert verdict.allowed is fail_open
    entry = json.loads(caplog.records[-1].getMessage())
    assert entry["policy"] == "fallback" and entry["client"] == "key:abc"
    assert "some text" not in caplog.text  # audited by hash only


def test_build_guard(tmp_path):
    assert build_guard(GuardConfig()) is None
    phrases = tmp_path / "phrases"
    phrases.write_text("nope\n")
    guard = build_guard(GuardConfig(policy="phrase_list", phrases_file=str(phrases)))
    assert guard is not None and not _run(guard.check("nope")).allowed
    policy = "python:tests.unit.edge.admission.test_guard:make_guard"
    plugin = build_guard(GuardConfig(policy=policy))
    assert plugin is not None and plugin.name == "slow"
    for bad in (
        GuardConfig(policy="phrase_list"),
        GuardConfig(policy="phrase_list", phrases_file=str(tmp_path / "missing")),
        GuardConfig(policy="python:no.such.module:x"),
        GuardConfig(policy="telepathy"),
    ):
        with pytest.raises(GuardError):
            build_guard(bad)


def make_guard(config):
    return SlowGuard()

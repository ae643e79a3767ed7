"""An engine process gets its configuration in a file only its user may read, never on its
command line (which every user of the machine may read): ``/proc/<pid>/cmdline`` holds neither
the Redis password nor the token secret, the file holds neither either (the engine needs
neither), and the engine reads it and starts."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

from cadenza.config import CadenzaConfig, load_config
from cadenza.contract import messages
from cadenza.ipc.edge_side.engine_client import EngineClient

REDIS_PASSWORD = "the-fleets-redis-password"
TOKEN_SECRET = "the fleet's token secret, 32 characters or more"


def _config() -> CadenzaConfig:
    return load_config(
        overrides={
            "limits": {"redis_url": f"redis://:{REDIS_PASSWORD}@127.0.0.1:6379/0"},
            "auth": {"token_secret": TOKEN_SECRET},
            "supervision": {"mode": "process"},
        }
    )


def test_the_engine_is_started_without_secrets_on_its_command_line() -> None:
    async def scenario() -> tuple[bytes, str, int, int, object]:
        client = EngineClient(_config())
        try:
            client._spawn()
            assert client._process is not None
            cmdline = Path(f"/proc/{client._process.pid}/cmdline")
            command = cmdline.read_bytes()
            for _ in range(200):  # the child shows the parent's command line until it execs
                if b"--config-file" in command.split(b"\0"):
                    break
                await asyncio.sleep(0.01)
                command = cmdline.read_bytes()
            config_file = command.split(b"\0")[command.split(b"\0").index(b"--config-file") + 1]
            path = Path(config_file.decode())
            text = path.read_text()
            file_mode = stat.S_IMODE(path.stat().st_mode)
            directory_mode = stat.S_IMODE(path.parent.stat().st_mode)
            first = None  # what the engine says once it has read its configuration
            for _ in range(1200):
                if await client._from_engine.poll(100):
                    first = messages.decode(await client._from_engine.recv())
                    break
            return command, text, file_mode, directory_mode, first
        finally:
            await client.close()

    command, text, file_mode, directory_mode, first = asyncio.run(scenario())
    for secret in (REDIS_PASSWORD, TOKEN_SECRET):
        assert secret.encode() not in command
        assert secret not in text
    assert file_mode == 0o600 and directory_mode == 0o700
    assert CadenzaConfig.model_validate(json.loads(text)).limits.redis_url is None
    assert isinstance(first, messages.Starting), first

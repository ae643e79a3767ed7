"""Random sequences of add / step / cancel on the paged engine keep every invariant, and
leave no page behind once all streams are done."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cadenza.config import EngineConfig
from cadenza.contract.errors import RequestRejected
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.kv.paged_kv_cache import KVSpec
from tests.unit.engine.llama_checkpoints import save_tiny_llama


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("prop-llama")
    save_tiny_llama(directory, "gqa3")
    return directory


actions = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 40), st.integers(1, 30), st.integers(0, 3)),
        st.tuples(st.just("step"), st.integers(1, 6)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
    ),
    min_size=1,
    max_size=25,
)


@pytest.mark.parametrize("reserve", [True, False])
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=actions)
def test_random_scripts_keep_the_pool_consistent(checkpoint, reserve, script):
    spec = KVSpec(2, 2, 16)
    config = EngineConfig(
        page_size=4,
        kv_cache_memory_bytes=20 * spec.bytes_per_page(4, torch.float32),
        max_num_batched_tokens=16,
        max_num_seqs=4,
        reserve_max_output=reserve,
    )
    engine = Engine.from_pretrained(str(checkpoint), engine_config=config)
    live: list[str] = []
    for index, action in enumerate(script):
        if action[0] == "add":
            _, prompt_len, max_new, family = action
            prompt = [[(family * 7 + i) % 200 + 3] for i in range(prompt_len)]
            try:
                engine.add_tokens(f"r{index}", prompt, max_new, SamplingParams(seed=index))
                live.append(f"r{index}")
            except RequestRejected:
                pass  # larger than the whole pool: refused up front
        elif action[0] == "step":
            for _ in range(action[1]):
                engine.step()
                engine.check_integrity()
        elif live:
            engine.abort_request(live.pop(action[1] % len(live)))
        engine.check_integrity()
    for _ in range(2000):
        if not engine.has_unfinished_requests():
            break
        engine.step()
        engine.check_integrity()
    assert not engine.has_unfinished_requests()
    assert engine.kv.pool.num_free_pages == engine.kv.pool.num_pages
    assert engine.kv.outstanding_pages == 0

"""Prompt logprobs through the engine on the GPU (the demo model, float32; skipped elsewhere): the checks of
test_prompt_logprobs.py with the device's score_rows kernel, decode graphs on."""
from __future__ import annotations

import pytest

from openinfer.testing.cuda import demo_engine_on_gpu, require_gpu
# the same tests, collected here against this module's `engine` fixture
from test_prompt_logprobs import (test_a_step_scores_at_most_max_num_seqs_rows,  # noqa: F401
                                  test_max_tokens_0_scores_and_generates_nothing, test_only_the_token_itself_at_zero,
                                  test_prompt_logprobs_match_the_full_forward, test_scored_prompts_skip_the_prefix_cache)

pytestmark = pytest.mark.cuda
cp = require_gpu()


@pytest.fixture(scope="module")
def engine():
    return demo_engine_on_gpu("graphs", max_model_len=256)   # max_num_seqs 4: four scored rows a step

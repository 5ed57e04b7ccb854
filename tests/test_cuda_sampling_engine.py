"""On-device sampling through the engine on the demo model (GPU only; skipped elsewhere): the
checks of test_device_sampling_engine.py, with the CUDA kernels instead of the numpy reference,
with decode CUDA graphs and eager."""
from __future__ import annotations

import pytest

from openinfer.testing.cuda import demo_engine_on_gpu, require_gpu
# the same tests, collected here against this module's `engine` fixture
from test_device_sampling_engine import (test_allowed_token_ids_are_masked_on_the_host,  # noqa: F401
                                         test_bad_words_mask_their_last_token, test_logprobs_and_min_tokens,
                                         test_seeded_requests_reproduce_in_any_batch,
                                         test_top_k_1_is_greedy, test_unseeded_requests_differ)

pytestmark = pytest.mark.cuda
cp = require_gpu()


@pytest.fixture(scope="module", params=["graphs", "eager"])
def engine(request):
    return demo_engine_on_gpu(request.param, max_model_len=256)   # (test_cuda_sampling covers bf16 logits)

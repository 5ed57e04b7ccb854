"""Structured outputs through the engine on the GPU (skipped elsewhere): the checks of
test_structured_engine.py on the CUDA backend, which samples on the device, so its constrained rows
take the host path beside device-sampled ones, with decode CUDA graphs and eager."""
from __future__ import annotations

import pytest

from openinfer.testing.cuda import demo_engine_on_gpu, require_gpu
# the same tests, collected here against this module's `engine` fixture
from test_structured_engine import (test_failing_matcher_fails_only_its_request, test_json_object,  # noqa: F401
                                    test_output_satisfies_the_schema,
                                    test_reasoning_is_free_and_the_answer_constrained,
                                    test_unconstrained_rows_are_untouched)

pytestmark = pytest.mark.cuda
cp = require_gpu()


@pytest.fixture(scope="module", params=["graphs", "eager"])
def engine(request):
    return demo_engine_on_gpu(request.param, max_model_len=512)

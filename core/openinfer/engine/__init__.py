"""The engine: requests and their event streams, the scheduler, the step executor and model runner, and the
per-step ForwardBatch."""

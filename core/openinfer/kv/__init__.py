"""KV management: the device pools of per-request state, block tables, the prefix cache."""

"""Benchmark instruments: `openinfer bench serve | latency | startup | prefix` (entry point: cli.add_parser)."""

"""An entry point that fails at import, to show one broken plugin never takes the others down."""
raise ImportError("openinfer_example.broken is broken on purpose")

"""The plugin contract: the hooks a plugin implements, plugin discovery, the ModelLine contract, and detection
of the line that serves a checkpoint."""

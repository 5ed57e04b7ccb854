"""A third-party model line: proof that `pip install` of a plugin is all openinfer needs."""

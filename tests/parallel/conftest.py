from __future__ import annotations

import ep_standin
import pytest

from openinfer.contract.plugins import Plugins


@pytest.fixture(scope="session")
def standin_plugins() -> Plugins:
    """The installed plugins plus the MoE stand-in line (worker processes register it too)."""
    plugins = Plugins().load()
    plugins.register("ep_standin", ep_standin)
    return plugins

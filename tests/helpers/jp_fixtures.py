"""pytest-jupyter's fixtures for ``jp_fetch``, imported by name (not its plugin, whose hooks
would take over pytest-asyncio's tests), with ``jp_asyncio_loop`` being the loop pytest-asyncio
runs the test on. Why: see the docstring of tests/fast/conftest.py, which star-imports this.
"""

from __future__ import annotations

import asyncio

import pytest
from pytest_jupyter.jupyter_core import (
    echo_kernel_spec,
    jp_config_dir,
    jp_data_dir,
    jp_env_config_path,
    jp_env_jupyter_path,
    jp_environ,
    jp_home_dir,
    jp_kernel_dir,
    jp_runtime_dir,
    jp_system_config_path,
    jp_system_jupyter_path,
)
from pytest_jupyter.jupyter_server import (
    jp_argv,
    jp_auth_header,
    jp_base_url,
    jp_configurable_serverapp,
    jp_fetch,
    jp_http_port,
    jp_logging_stream,
    jp_root_dir,
    jp_serverapp,
    jp_web_app,
)
from pytest_jupyter.pytest_tornasync import http_server, http_server_client, http_server_port


@pytest.fixture
async def jp_asyncio_loop() -> asyncio.AbstractEventLoop:
    """The loop pytest-asyncio runs this test on: pytest-jupyter's fixtures drive it too."""
    return asyncio.get_running_loop()


@pytest.fixture
def jp_nbconvert_templates() -> None:
    """No nbconvert templates (pytest-jupyter copies them for every server by default)."""


__all__ = [
    "echo_kernel_spec",
    "http_server",
    "http_server_client",
    "http_server_port",
    "jp_argv",
    "jp_asyncio_loop",
    "jp_auth_header",
    "jp_base_url",
    "jp_config_dir",
    "jp_configurable_serverapp",
    "jp_data_dir",
    "jp_env_config_path",
    "jp_env_jupyter_path",
    "jp_environ",
    "jp_fetch",
    "jp_home_dir",
    "jp_http_port",
    "jp_kernel_dir",
    "jp_logging_stream",
    "jp_nbconvert_templates",
    "jp_root_dir",
    "jp_runtime_dir",
    "jp_serverapp",
    "jp_system_config_path",
    "jp_system_jupyter_path",
    "jp_web_app",
]

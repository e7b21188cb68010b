"""Ray's Jobs client for one cluster's dashboard, as ``cluster.job_client()`` gives it: a
``JobSubmissionClient`` whose requests go to that dashboard only, straight, with the token
(with TLS, to the head's relay, whose certificate must be the cluster CA's).

Ray 2.60's client would otherwise send the token elsewhere in three ways, each closed here:
it replaces the address it is given with ``$RAY_API_SERVER_ADDRESS`` or ``$RAY_ADDRESS`` when
either is set; its requests (``requests.request``) honour ``http_proxy``/``https_proxy``/
``all_proxy``, ``.netrc`` and redirects (a custom header such as ``X-Ray-Authorization``
survives a redirect to another host); and in a process with Ray's token auth on (after a Ray
Client connect) it adds ``Authorization: Bearer`` beside the header it was given. Here every
request goes through a ``requests.Session`` that reads nothing from the environment, follows
no redirect, and sends ``dashhttp.token_headers`` only. Log tailing (aiohttp, which ignores
proxy variables unless asked) uses the same address and header.

Imports Ray: import this module only when a Jobs client is wanted.
"""

from __future__ import annotations

from typing import Any

import ray
import requests
from ray._private.authentication.http_token_authentication import (
    format_authentication_http_error,
)
from ray.dashboard.modules.dashboard_sdk import SubmissionClient
from ray.exceptions import AuthenticationError
from ray.job_submission import JobSubmissionClient

from ..bootstrap.dashhttp import CONNECT_TIMEOUT, token_headers

READ_TIMEOUT = 120.0  # a submit waits for Ray's job supervisor to start, a log may be long
# requests (urllib3 2) bounds sending a body by the *connect* timeout: an upload of a
# working_dir or py_modules package gets this many seconds more per MiB.
UPLOAD_SECONDS_PER_MIB = 1.0


class DirectJobSubmissionClient(JobSubmissionClient):
    """``JobSubmissionClient`` for the dashboard at ``address`` (``http://host:port``), direct,
    with the cluster's token in one header form."""

    def __init__(self, address: str, token: str, ca_file: str | None = None) -> None:
        self._direct_address = address.rstrip("/")
        self._direct_headers = token_headers(token)
        self._session = requests.Session()
        self._session.trust_env = False  # no proxy variables, no .netrc, no REQUESTS_CA_BUNDLE
        if ca_file is not None:  # the head's relay (https): its certificate, the cluster's CA
            self._session.verify = ca_file
        # JobSubmissionClient.__init__ resolves the address through $RAY_ADDRESS: its base's
        # __init__ instead, then the same version check.
        SubmissionClient.__init__(  # verify: the log tail's websocket checks the relay too
            self,
            address=self._direct_address,
            headers=dict(self._direct_headers),
            verify=ca_file if ca_file is not None else True,
        )
        self._address = self._direct_address
        self._headers = dict(self._direct_headers)  # not Ray's added Authorization header
        self._client_ray_version = ray.__version__
        self._check_connection_and_version(
            min_version="2.0",
            version_error_message="Jobs API is not supported on the Ray cluster: it must "
            "run Ray 2.0 or newer.",
        )

    def _do_request(
        self,
        method: str,
        endpoint: str,
        *,
        data: bytes | None = None,
        json_data: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> requests.Response:
        upload = len(data) / 2**20 * UPLOAD_SECONDS_PER_MIB if data else 0.0
        response = self._session.request(
            method,
            self._direct_address + endpoint,
            data=data,
            json=json_data,
            headers=self._direct_headers,
            timeout=(CONNECT_TIMEOUT + upload, READ_TIMEOUT),
            allow_redirects=False,
            **kwargs,
        )
        formatted = format_authentication_http_error(response.status_code, response.text)
        if formatted:
            raise AuthenticationError(formatted)
        return response

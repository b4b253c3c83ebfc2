"""A Hub repository on loopback for the offline and repository tests: the Hub stand-in
(``servers.HubStandIn``) over a folder the test fills, its LFS files on an nginx as its CDN, and
``HF_ENDPOINT`` pointing at it while in use."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from loopback.servers import HubStandIn, Nginx, environment
from conftest import require_nginx


@contextlib.contextmanager
def hub_origin(tmp_path: Path, repo_name: str,
               fill: Callable[[Path], None]) -> Iterator[tuple[HubStandIn, Nginx, Path]]:
    """(the stand-in, its CDN's nginx, the repository's folder), ``fill(folder)`` having written its files."""
    require_nginx()
    repo, cdn = tmp_path / "repo", tmp_path / "cdn"
    repo.mkdir()
    cdn.mkdir()
    fill(repo)
    with Nginx(cdn) as server:
        stand_in = HubStandIn({repo_name: repo}, cdn, server.url).start()
        try:
            with environment({"HF_ENDPOINT": stand_in.url, "HF_TOKEN": "", "HF_HUB_DISABLE_TELEMETRY": "1"}):
                yield stand_in, server, repo
        finally:
            stand_in.stop()

"""``asyncfl run``'s local SuperLink: runs started side by side must not share a Flower home."""

from __future__ import annotations

import tomllib

from asyncfl.deploy.simulation import CONNECTION, LocalSuperLink, run_failed


def _address(flwr_home) -> str:
    config = tomllib.loads((flwr_home / "config.toml").read_text())
    return config["superlink"][CONNECTION]["address"]


def test_two_local_superlinks_side_by_side_each_keep_their_own_address_and_clean_up(tmp_path):
    # Prepare: two SuperLinks started from the same app folder, the second while the first still runs
    # (the matrix benchmarks run studies in parallel this way).
    base = tmp_path / ".flwr"
    with LocalSuperLink(tmp_path, base) as first, LocalSuperLink(tmp_path, base) as second:
        # Assert: each `flwr` command gets a home whose connection points at its own SuperLink ...
        assert first.port != second.port and first.flwr_home != second.flwr_home
        assert _address(first.flwr_home) == f"127.0.0.1:{first.port}"
        assert _address(second.flwr_home) == f"127.0.0.1:{second.port}"
        assert first.env()["FLWR_HOME"] == str(first.flwr_home)
        # ... and asking a live SuperLink about its runs works (no run has failed).
        assert run_failed(tmp_path, first.env()) is False
        first_home, second_home = first.flwr_home, second.flwr_home
    # Stopping removes each home (state database included); the logs stay for a post-mortem.
    assert not first_home.exists() and not second_home.exists()
    assert sorted(p.name for p in base.iterdir()) == sorted(
        [f"superlink-{first.port}.log", f"superlink-{second.port}.log"])

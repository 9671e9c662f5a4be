"""Reaching a cluster the sweep did not start (dynamics.sweep.scheduler): check_scheduler's
refusals, and the TLS settings it reaches a cluster with."""

import re

import pytest

from dynamics.config import ConfigError


@pytest.mark.parametrize("content, needle", [
    ("{}", 'not a scheduler file (no "address" in its JSON)'),
    ("[1, 2]", 'not a scheduler file (no "address" in its JSON)'),
    ('{"address": ""}', 'not a scheduler file (no "address" in its JSON)'),
    ('{"address": null}', 'not a scheduler file (no "address" in its JSON)'),
    ('{"address": 5}', 'not a scheduler file (its "address" is 5, not a string)'),  # was "no address"
    ("", "not a readable scheduler file"),
    ("garbage", "not a readable scheduler file"),
])
def test_a_damaged_scheduler_file_is_refused_in_one_line(tmp_path, content, needle):
    # Dask's own reading of these raised a bare AssertionError (or TypeError): a traceback, exit 1
    from dynamics.sweep.scheduler import check_scheduler

    (tmp_path / "scheduler.json").write_text(content)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        check_scheduler(str(tmp_path / "scheduler.json"))


def test_a_scheduler_address_dask_cannot_use_is_refused_in_one_line():
    from dynamics.sweep.scheduler import check_scheduler

    # tls:// without TLS settings: Dask raised a TypeError, not a connection error
    with pytest.raises(ConfigError, match="cannot reach a Dask scheduler there .*TLS"):
        check_scheduler("tls://127.0.0.1:1")


def test_an_address_that_answers_but_is_no_scheduler_is_refused_not_waited_on():
    # The dashboard's port (or any socket that accepts and says nothing): the Client's timeout
    # covered the connection, not Dask's handshake after it, and the sweep waited for ever, silent.
    import socket

    from distributed import LocalCluster

    from dynamics.sweep.scheduler import check_scheduler

    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        with pytest.raises(ConfigError, match=f"^--scheduler tcp://127.0.0.1:{port}: no Dask scheduler answered "
                                              f"there within 1 s$"):
            check_scheduler(f"tcp://127.0.0.1:{port}", timeout=1.0)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"}) as cluster:
        [worker] = cluster.workers.values()
        with pytest.raises(ConfigError, match="a Dask Worker answers there, not a scheduler"):
            check_scheduler(worker.address)
        check_scheduler(cluster.scheduler_address)


def test_an_address_that_answers_with_other_bytes_is_no_scheduler():
    # An SSH server's banner read as Dask's frame length: "cannot reach a Dask scheduler there
    # (Unable to allocate 2.82 EiB for an array ...)"
    import socket
    import threading

    from dynamics.sweep.scheduler import check_scheduler

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def banner():
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6p1 Debian-4\r\n" * 4)
                conn.recv(1)  # held open until the client hangs up

        threading.Thread(target=banner, daemon=True).start()
        with pytest.raises(ConfigError, match=rf"^--scheduler tcp://127.0.0.1:{port}: something answers there, not a "
                                              r"Dask scheduler \(its reply is no Dask message\)$"):
            check_scheduler(f"tcp://127.0.0.1:{port}", timeout=5.0)


def test_check_scheduler_reaches_a_tls_cluster_and_runs_inside_an_event_loop(tmp_path):
    # Asked without the TLS settings of Dask's config, a tls:// cluster the sweep reaches was
    # refused; and asyncio.run inside a running loop (run_sweep in a notebook) was "cannot reach".
    import asyncio

    import dask
    from distributed import LocalCluster
    from distributed.security import Security

    from dynamics.sweep.scheduler import check_scheduler

    ca, cert, key = _tls_files(tmp_path)
    tls = {"distributed.comm.tls.ca-file": ca}
    for role in ("client", "scheduler", "worker"):
        tls |= {f"distributed.comm.tls.{role}.cert": cert, f"distributed.comm.tls.{role}.key": key}
    with dask.config.set(tls), LocalCluster(n_workers=0, processes=False, protocol="tls://", security=Security(),
                                            dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"}) as cluster:
        assert cluster.scheduler_address.startswith("tls://")
        check_scheduler(cluster.scheduler_address)

        async def in_a_loop() -> None:
            check_scheduler(cluster.scheduler_address)

        asyncio.run(in_a_loop())


LOADED: list = []  # the addresses tls_loader was asked for
LOADED_SECURITY: list = []  # what it returns


def tls_loader(info: dict):
    """A security loader as Dask's ``distributed.client.security-loader`` names one."""
    LOADED.append(info["address"])
    return LOADED_SECURITY[0]


def _tls_files(tmp_path) -> tuple[str, str, str]:
    """(CA, certificate, key) files of a temporary TLS identity, Dask's own."""
    from distributed.security import Security

    made = Security.temporary()
    files = []
    for name, text in (("ca", made.tls_ca_file), ("cert", made.tls_client_cert), ("key", made.tls_client_key)):
        (tmp_path / f"{name}.pem").write_text(text)
        files.append(str(tmp_path / f"{name}.pem"))
    return tuple(files)


def _temporary_tls(tmp_path):
    from distributed.security import Security

    ca, cert, key = _tls_files(tmp_path)
    return Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, tls_scheduler_cert=cert,
                    tls_scheduler_key=key, tls_worker_cert=cert, tls_worker_key=key, require_encryption=True)


def test_a_configured_security_loader_gives_the_tls_settings_as_the_sweeps_client_takes_them(tmp_path):
    # A scheduler file's Client, given the file, called no loader: the check passed, then the
    # sweep failed after making its store
    import json

    import dask
    from distributed import LocalCluster

    from dynamics.sweep.launcher import _client
    from dynamics.sweep.scheduler import check_scheduler

    security = _temporary_tls(tmp_path)
    LOADED.clear()
    LOADED_SECURITY[:] = [security]
    with LocalCluster(n_workers=0, processes=False, protocol="tls://", security=security, dashboard_address=None,
                      scheduler_kwargs={"dashboard_address": ":0"}) as cluster:
        with pytest.raises(ConfigError, match="cannot reach a Dask scheduler there"):  # no TLS settings: refused
            check_scheduler(cluster.scheduler_address, timeout=5.0)
        file = tmp_path / "scheduler.json"
        file.write_text(json.dumps({"address": cluster.scheduler_address}))
        with dask.config.set({"distributed.client.security-loader": f"{__name__}.tls_loader"}):
            check_scheduler(cluster.scheduler_address, timeout=5.0)
            check_scheduler(str(file), timeout=5.0)
            client, none = _client(str(file), 0)  # as the sweep reaches it
            try:
                assert none is None and client.scheduler_info()["address"] == cluster.scheduler_address
            finally:
                client.close()
    assert LOADED[:2] == [cluster.scheduler_address] * 2 and set(LOADED) == {cluster.scheduler_address}


def test_a_security_loader_that_cannot_be_imported_is_named_not_read_as_an_unreachable_scheduler():
    import dask
    from distributed import LocalCluster

    from dynamics.sweep.scheduler import check_scheduler

    with LocalCluster(n_workers=0, processes=False, dashboard_address=None,
                      scheduler_kwargs={"dashboard_address": ":0"}) as cluster, \
            dask.config.set({"distributed.client.security-loader": "no_such_module.loader"}):
        with pytest.raises(ConfigError, match=r"^distributed.client.security-loader 'no_such_module.loader': cannot "
                                              r"import it \(ModuleNotFoundError: "):
            check_scheduler(cluster.scheduler_address, timeout=5.0)

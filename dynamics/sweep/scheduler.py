"""Reaching a cluster the sweep did not start (``--scheduler``): :func:`check_scheduler` asks
what answers at an address or scheduler file, once, before the store is touched, with the TLS
settings the sweep's Client will use."""

from __future__ import annotations

import os

from dynamics.config import ConfigError


def check_scheduler(scheduler: str, timeout: float = 10.0) -> None:
    """Connect to an existing cluster once and hang up, so that a wrong ``--scheduler`` is one
    clear error before the store is touched, not a traceback from inside the sweep.

    Raises
    ------
    ConfigError
        Neither a ``tcp://`` style address nor an existing scheduler file, nothing answers within
        `timeout` seconds, or what answers is no Dask scheduler.
    """
    # As the launcher's _client: an existing file is a scheduler file, anything else an address (host:port too)
    as_file = "://" not in scheduler and os.path.isfile(scheduler)
    if not as_file and ":" not in scheduler:
        raise ConfigError(f"--scheduler {scheduler}: neither an address (tcp://host:port) nor a scheduler file")
    address = scheduler_file_address(scheduler) if as_file else scheduler
    try:
        info = _identity(address, timeout)
    except TimeoutError:
        raise ConfigError(f"--scheduler {scheduler}: no Dask scheduler answered there within {timeout:g} s") from None
    except MemoryError:
        # bytes that are no Dask message (an SSH banner read as a frame length: "Unable to allocate
        # 2.82 EiB"): something answered, and it is not Dask (a ValueError is a malformed address)
        raise ConfigError(f"--scheduler {scheduler}: something answers there, not a Dask scheduler "
                          f"(its reply is no Dask message)") from None
    except ConfigError:  # a security loader that cannot be imported: said as itself, not as "cannot reach"
        raise
    # Any failure to connect is the same bad input: Dask also raises TypeError (tls:// without TLS
    # settings, ucx:// without ucx) and AssertionError (an address without a host) from deep inside.
    except Exception as e:  # noqa: BLE001
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"--scheduler {scheduler}: cannot reach a Dask scheduler there ({reason})") from None
    kind = info.get("type") if isinstance(info, dict) else None
    if kind != "Scheduler":  # a worker's address: the sweep's Client would have waited on it for ever
        raise ConfigError(f"--scheduler {scheduler}: {f'a Dask {kind}' if kind else 'something'} answers there, "
                          f"not a scheduler")


def _identity(address: str, timeout: float) -> dict:
    """What answers at a Dask address says it is, within `timeout` seconds in all (TimeoutError).

    Asked directly, not through a Client: a Client's own timeout covers connecting, not Dask's
    handshake after it, so an address that accepts the connection and says nothing (a cluster's
    dashboard port) kept `dynamics sweep` waiting, silent, for ever."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from distributed import rpc

    security = _client_security(address)

    async def ask() -> dict:
        remote = rpc(address, timeout=timeout, connection_args=security.get_connection_args("client"))
        try:
            return await remote.identity()
        finally:
            await remote.close_rpc()

    def once() -> dict:
        return asyncio.run(asyncio.wait_for(ask(), timeout))

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # none here: the usual case, a command
        return once()
    # called from a running loop (run_sweep in a notebook): asyncio.run refuses one inside another
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(once).result()


def _client_security(address: str):
    """The TLS settings the sweep's Client uses for `address`: what Dask's configured security
    loader (``distributed.client.security-loader``) returns for it, else Dask's config
    (``distributed.comm.tls``). Without them a tls:// cluster the sweep reaches was refused.

    Read here as the Client reads them, not through distributed's private helper for it: were that
    renamed, a user's loader would have been skipped without a word.

    Raises
    ------
    ConfigError
        The configured loader cannot be imported.
    """
    import dask
    from distributed.security import Security
    from distributed.utils import import_term

    term = dask.config.get("distributed.client.security-loader", None)
    if not term:
        return Security()
    try:
        load = import_term(term)
    except Exception as e:  # noqa: BLE001 - any failure to import it is the same bad setting
        raise ConfigError(f"distributed.client.security-loader {term!r}: cannot import it "
                          f"({type(e).__name__}: {e})") from None
    return load({"address": address}) or Security()  # None: the loader leaves this address to the config


def scheduler_file_address(file: str) -> str:
    """The scheduler address a scheduler file (the JSON that ``dask scheduler --scheduler-file``
    writes) holds: Dask itself fails on a damaged one with a bare AssertionError or KeyError."""
    import json

    try:
        with open(file, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"--scheduler {file}: not a readable scheduler file ({e})") from None
    address = info.get("address") if isinstance(info, dict) else None
    if address is not None and not isinstance(address, str):  # "there is none" misled about one that is there
        raise ConfigError(f"--scheduler {file}: not a scheduler file (its \"address\" is {json.dumps(address)}, "
                          f"not a string)")
    if not address:
        raise ConfigError(f"--scheduler {file}: not a scheduler file (no \"address\" in its JSON)")
    return address

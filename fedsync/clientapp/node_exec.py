"""A warm executor for a SuperNode in ``--isolation process``: every task in one process.

Flower 1.39's SuperNode hands ClientApp work to an executor over its Runtime API. In the
default ``--isolation subprocess`` it starts ``flower-superexec`` itself, which starts a
fresh ``flwr-clientapp`` process per message (Python start, Flower and torch imports, the
data, torch warming up: seconds per task). With ``--isolation process`` the SuperNode
starts no executor and waits for one to connect; this module is that executor, and it
stays up::

    flower-supernode ... --isolation process --host 127.0.0.1 --port 9094
    python -m fedsync.clientapp.node_exec --runtime-api-address 127.0.0.1:9094 --supervise

It asks the SuperNode for a ClientApp task every ``--poll`` seconds, pulls the message,
its ``Context`` and the FAB through Flower's own runtime client functions, runs the
ClientApp in this process (loaded once per FAB), and pushes the reply and the updated
context back. Imports, the data partition and torch's warm state (a CUDA context on a
GPU node) stay between tasks. A task whose ClientApp raises is answered with Flower's
error reply, as a fresh process would; the executor goes on with the next one.

``--supervise`` runs the executor as a child and starts it again whenever it dies (a
crash mid-task: the SuperNode's task expires and the server's retry or TTL handles it;
``context.state`` lives in the SuperNode, and node config ``state-dir`` keeps the
error-feedback residual on disk, so nothing is lost). The executor leaves when the
SuperNode's process group is gone.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from logging import ERROR, INFO, WARNING
from typing import Any

from flwr.app import Error, Message
from flwr.common.logger import log

from fedsync.compat import flower139


def group_alive() -> bool:
    """Whether the leader of this process group (the SuperNode) still runs."""
    try:
        os.kill(os.getpgrp(), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WarmExecutor:
    """Acquire ClientApp tasks from one SuperNode's Runtime API and run them here.

    Parameters
    ----------
    runtime_api_address : str
        ``host:port`` of the SuperNode's Runtime API (its ``--host``/``--port``).
    poll : float
        Seconds between task requests while idle.
    """

    def __init__(self, runtime_api_address: str, poll: float = 0.05) -> None:
        self.address = runtime_api_address
        self.poll = poll
        # The SuperNode hands a task out before its message's objects have arrived; pull
        # them again after ``poll``, not after Flower's 1 s, and at most
        # LOCAL_PULL_RETRY_CAP_S apart while a slow downlink delivers them.
        if not flower139.shorten_object_pulls(poll, cap=flower139.LOCAL_PULL_RETRY_CAP_S):
            log(WARNING, "[fedsync] object pulls keep Flower's 1 s retry (unknown layout)")
        self.tasks = 0
        self._apps: dict[str, Any] = {}
        self._load = flower139.get_load_client_app_fn(
            default_app_ref="", app_path=None, multi_app=True
        )
        self._client = flower139.RuntimeHttpClient.from_server_address(
            server_address=runtime_api_address,
            insecure=True,
            root_certificates=None,
            interceptors=[flower139.RuntimeVersionHttpInterceptor(component_name="SuperExec")],
            retry_invoker=flower139.make_simple_http_retry_invoker(),
        )

    def serve_forever(self) -> None:
        """Acquire and run tasks until the SuperNode's process group is gone."""
        log(INFO, "[fedsync] warm executor pid %d serves %s", os.getpid(), self.address)
        while group_alive():
            response = self._client.AcquireTask(
                flower139.AcquireTaskRequest(
                    supported_task_types=[flower139.TaskType.CLIENT_APP.value],
                    agentapp_fab_hashes=[],
                )
            )
            if response.HasField("task") and response.token:
                self.run_task(response.token)
            else:
                time.sleep(self.poll)

    def run_task(self, token: str) -> None:
        """Run one acquired task (the steps of ``flwr-clientapp``, in this process)."""
        client = flower139.RuntimeHttpClient.from_server_address(
            server_address=self.address,
            insecure=True,
            root_certificates=None,
            interceptors=[
                flower139.RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                flower139.RuntimeTokenHttpInterceptor(token),
            ],
            retry_invoker=flower139.make_simple_http_retry_invoker(),
        )
        heartbeat = flower139.HeartbeatSender(flower139.make_task_heartbeat_fn_http(client))
        heartbeat.start()
        message = context = reply = None
        status, details = flower139.SubStatus.FAILED, "ClientApp task failed"
        try:
            message, context, run, fab = flower139.pull_task_input(client)
            app = self._apps.get(fab.hash_str)
            if app is None:
                flower139.install_from_fab(fab.content, skip_prompt=True)
                app = self._load(run.fab_id, run.fab_version, fab.hash_str)
                self._apps[fab.hash_str] = app
            reply = app(message=message, context=context)
            status, details = flower139.SubStatus.COMPLETED, ""
        except Exception as err:
            log(ERROR, "[fedsync] ClientApp raised %s: %s", type(err).__name__, err)
            details = f"{type(err)}:<'{err}'>"
            if message is not None:
                reply = Message(
                    Error(code=flower139.ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details),
                    reply_to=message,
                )
        try:
            if reply is not None and context is not None:
                flower139.push_message(client, reply, context)
        finally:
            flower139.push_task_output(
                client=client, context=context, sub_status=status, details=details
            )
            heartbeat.stop()
            client.close()
        self.tasks += 1


def supervise(argv: list[str]) -> int:
    """Run the executor as a child; start it again whenever it dies."""
    child_args = [sys.executable, "-m", "fedsync.clientapp.node_exec", *argv]
    while group_alive():
        started = time.monotonic()
        code = subprocess.call(child_args)
        if not group_alive():
            break
        log(
            WARNING,
            "[fedsync] warm executor exited with code %d after %.0fs; starting it again",
            code,
            time.monotonic() - started,
        )
        time.sleep(0.5)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m fedsync.clientapp.node_exec``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m fedsync.clientapp.node_exec", description=__doc__
    )
    parser.add_argument("--runtime-api-address", required=True)
    parser.add_argument("--poll", type=float, default=0.05)
    parser.add_argument("--supervise", action="store_true")
    args = parser.parse_args(argv)
    problem = flower139.warm_executor_problem()
    if problem:
        sys.stderr.write(f"the warm executor needs Flower 1.39's runtime modules: {problem}\n")
        return 2
    if args.supervise:
        return supervise([a for a in argv if a != "--supervise"])
    WarmExecutor(args.runtime_api_address, args.poll).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

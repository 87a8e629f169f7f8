"""Helpers shared by the sandbox tests (a plain module: conftest.py is not importable by name)."""

import json
import os
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

import bubblewrap
from wmrl_sandbox import cgroups
from wmrl_sandbox.local import LocalServer

DEPLOYED_UID = 61900  # a numeric non-root uid, as the image runs the server; below the root-mode slot uids (62000+)
SECRET = "wmrl-server-secret-5f1c"
# Small limits keep hostile cases fast; the server's defaults are larger.
TEST_ARGS = ("--memory-mb", "512", "--nproc", "32", "--file-size-mb", "16", "--max-output-bytes", "65536",
             "--max-body-bytes", str(1 << 20))


def run(server, code: str, timeout: float = 30, **fields) -> dict:
    body = {"code": code, "language": "python", "run_timeout": fields.pop("run_timeout", 5), **fields}
    resp = httpx.post(f"{server.url}/run_code", json=body, timeout=timeout)
    assert resp.status_code == 200, resp.text
    return resp.json()


def live_processes_of(uids) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid in uids:
                found.append(int(name))
        except FileNotFoundError:
            pass
    return found


def zombie_children_of(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == pid:
            found.append(int(name))
    return found


class DelegatedCgroups:
    """What a node gives a uid when it delegates cgroups (systemd's ``Delegate=``): for each of
    memory, pids and cpu, a fresh cgroup under this process's, owned by ``uid`` (the directory and
    the files that move processes into it). Removed, with whatever the server made in it, by
    :meth:`remove`."""

    def __init__(self, uid: int):
        self.directories = []
        name = f"wmrl-delegated-{uid}-{secrets.token_hex(4)}"
        for controller in cgroups.CONTROLLERS:
            version, own = cgroups.locate(controller)
            directory = os.path.join(own, name)
            if directory in self.directories:
                continue
            os.mkdir(directory)
            self.directories.append(directory)
            for entry in (directory, *(os.path.join(directory, f) for f in ("cgroup.procs", "tasks", "cgroup.threads",
                                                                             "cgroup.subtree_control"))):
                if os.path.exists(entry):
                    os.chown(entry, uid, uid)

    def prefix(self) -> tuple[str, ...]:
        """A command prefix that starts the command inside these cgroups."""
        here = os.path.dirname(os.path.abspath(__file__))
        return (sys.executable, os.path.join(here, "in_cgroups.py"),
                *(os.path.join(d, "cgroup.procs") for d in self.directories), "--")

    def remove(self) -> None:
        for directory in self.directories:
            assert cgroups.remove_tree(directory), directory


class _DelegatedServer(LocalServer):
    """A deployed-mode server started inside cgroups delegated to its uid."""

    def __init__(self, delegated: DelegatedCgroups, **kwargs):
        self.delegated = delegated
        try:
            super().__init__(**kwargs)
        except BaseException:
            delegated.remove()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.delegated.remove()


def start_server(mode: str, tmp_path_factory, slots: int = 1, *, uid: int, args: tuple[str, ...] = TEST_ARGS,
                 env: dict | None = None, delegate_cgroups: bool = False) -> LocalServer:
    """A server in ``mode``: ``root`` or ``deployed`` (as the non-root ``uid``, with bubblewrap, as the
    image runs it), each ``-cold`` with ``--no-warm``. Starting either needs root.

    A deployed server's cgroup is not delegated to it by default (a Pod's is not);
    ``delegate_cgroups`` starts it inside cgroups of its own that its uid owns. A root server
    can write to every cgroup, as root on a node can."""
    if os.geteuid() != 0:
        raise RuntimeError("these tests start servers as root and as another uid: run them as root")
    if mode.endswith("-cold"):
        args += ("--no-warm",)
    if mode in ("root", "root-cold"):
        return LocalServer(slots=slots, args=args, env=env)
    base = tmp_path_factory.mktemp(f"deployed-{uid}")
    for directory in (base, base.parent, base.parent.parent):
        os.chmod(directory, 0o755)
    work = base / "work"
    work.mkdir()
    os.chown(work, uid, uid)
    # setpriv looks the venv's interpreter up with root's access (it lives under /root here); the
    # executions use the system interpreter, which the server's uid can reach.
    prefix = ("setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups")
    options = dict(slots=slots, work_root=str(work), env=env,
                   args=args + ("--python", "/usr/bin/python3", "--bwrap", bubblewrap.copy_for(base)))
    if delegate_cgroups:
        delegated = DelegatedCgroups(uid)
        return _DelegatedServer(delegated, prefix=delegated.prefix() + prefix, **options)
    return LocalServer(prefix=prefix, **options)


def execution_processes(server) -> list[int]:
    """Live processes that can only be an execution's: of the slot uids (root mode), or of the
    server's own uid other than the server itself and its fork servers (deployed mode, where
    executions run as that uid in their own namespaces)."""
    health = server.healthz()
    if health["isolation"]["uid_per_slot"]:
        return live_processes_of(set(health["uids"]))
    servers = {server.pid, *health["warm"]["pids"]}
    # A PID namespace's first process can linger a moment as a zombie of the machine's init after
    # the kernel ended the namespace: dead, holding nothing of the execution.
    return [pid for pid in live_processes_of({os.stat(f"/proc/{server.pid}").st_uid})
            if pid not in servers and not _zombie(pid)]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True  # gone


def assert_contained(server) -> None:
    """After a hostile case: the server answers, nothing of the execution is left, the next one works."""
    health = server.healthz()
    assert health["status"] == "ok" and health["busy"] == 0 and health["queued"] == 0
    assert execution_processes(server) == []
    assert zombie_children_of(server.pid) == []
    assert os.listdir(server.work_root) == []
    nxt = run(server, "print('next ok')")
    assert nxt["status"] == "Success" and nxt["run_result"]["stdout"] == "next ok\n"


class Scripted:
    """A stand-in sandbox on loopback answering /run_code from a script of (status, headers, body)."""

    def __init__(self, script):
        self.script, self.calls = list(script), 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, headers, body = outer.script[min(outer.calls, len(outer.script) - 1)]
                outer.calls += 1
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


OK_BODY = {"status": "Success", "message": "", "compile_result": None, "files": {},
           "run_result": {"status": "Finished", "execution_time": 0.01, "return_code": 0, "stdout": "ok\n",
                          "stderr": ""}}

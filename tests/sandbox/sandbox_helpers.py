"""Helpers shared by the sandbox tests (a plain module: conftest.py is not importable by name)."""

import os

import httpx

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


def assert_contained(server) -> None:
    """After a hostile case: the server answers, nothing of the execution is left, the next one works."""
    health = server.healthz()
    assert health["status"] == "ok" and health["busy"] == 0
    assert live_processes_of(set(health["uids"])) == []
    assert zombie_children_of(server.pid) == []
    assert os.listdir(server.work_root) == []
    nxt = run(server, "print('next ok')")
    assert nxt["status"] == "Success" and nxt["run_result"]["stdout"] == "next ok\n"

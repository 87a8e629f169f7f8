"""What each --isolation promises, and the words a server that cannot keep it refuses with."""

from wmrl_sandbox.isolation import Isolation, missing
from wmrl_sandbox.server import isolation_refusal


def test_namespaces_as_root_needs_each_of_root_modes_namespaces():
    full = Isolation(as_root=True, network_namespace=True, mount_namespace=True, ipc_namespace=True)
    assert missing(full) == []
    no_net = Isolation(as_root=True, network_namespace=False, mount_namespace=True, ipc_namespace=False)
    assert missing(no_net) == ["a network namespace per execution (unshare(CLONE_NEWNET) is refused here)",
                               "an IPC namespace per execution (unshare(CLONE_NEWIPC) is refused here)"]
    assert "a kernel and runtime that let root unshare" in isolation_refusal(no_net, missing(no_net))


def test_namespaces_as_another_uid_needs_a_working_bubblewrap():
    without = Isolation(as_root=False, network_namespace=False, mount_namespace=False,
                        bwrap_error="bubblewrap (/usr/bin/bwrap) cannot create an execution's namespaces here: "
                                    "bwrap: Can't mount proc on /newroot/proc: Operation not permitted")
    gaps = missing(without)
    assert gaps == [without.bwrap_error]
    said = isolation_refusal(without, gaps)
    assert said.startswith("isolation unavailable: --isolation namespaces needs bubblewrap (/usr/bin/bwrap)")
    assert "hostUsers: false, procMount: Unmasked" in said and "--isolation restricted" in said
    assert missing(Isolation(as_root=False, network_namespace=False, mount_namespace=False, bwrap="/x/bwrap")) == []


def test_restricted_promises_no_namespaces():
    assert missing(Isolation(as_root=False, network_namespace=False, mount_namespace=False,
                             requested="restricted")) == []
    assert Isolation(as_root=False, network_namespace=False, mount_namespace=False,
                     requested="restricted").mode == "unisolated"

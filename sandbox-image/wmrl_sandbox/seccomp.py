"""The seccomp filter every execution runs under: the kernel interfaces sandboxed code has no use for.

Refused with EPERM: ``ptrace`` and ``process_vm_readv/writev`` (reading or steering another
process), ``bpf``, ``perf_event_open``, ``userfaultfd`` and io_uring (large kernel attack
surfaces that bypass other filters), the key-management calls, new namespaces (``unshare``,
``setns``, and ``clone`` with a namespace flag), every mount call, module loading, kexec,
reboot, swap, accounting, quotas, the kernel log and handle-based opens. ``clone3`` gets
ENOSYS, so the C library falls back to ``clone``, whose flags a classic filter can inspect.
A system call from another architecture's ABI (32-bit ``int 0x80`` or x32 on x86-64) kills
the process: those numbers would otherwise slip past the table.

The filter is a classic BPF program built here (no libseccomp): :func:`program` for bubblewrap's
``--seccomp FD``, :func:`install` to load it into the calling process (it sets
``no_new_privs`` first, which the kernel requires of an unprivileged caller).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

from wmrl_sandbox.linux import PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, libc

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg 0's low word on little-endian)

# Every namespace flag of clone(2): CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
CLONE_NAMESPACE_FLAGS = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

BLOCKED_NAMES = (
    "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key",
    "unshare", "setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "open_by_handle_at",
    "name_to_handle_at",
)


_ARCHES = {
    # machine: (AUDIT_ARCH_*, first number of a foreign ABI to refuse or None, {name: number})
    "x86_64": (0xC000003E, 0x40000000, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321, "perf_event_open": 298,
        "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 250,
        "add_key": 248, "request_key": 249, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
        "pivot_root": 155, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "kexec_load": 246, "kexec_file_load": 320, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163,
        "quotactl": 179, "syslog": 103, "open_by_handle_at": 304, "name_to_handle_at": 303,
        "clone": 56, "clone3": 435}),
    "aarch64": (0xC00000B7, None, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280, "perf_event_open": 241,
        "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 219,
        "add_key": 217, "request_key": 218, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
        "pivot_root": 41, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "kexec_load": 104, "kexec_file_load": 294, "reboot": 142, "swapon": 224, "swapoff": 225, "acct": 89,
        "quotactl": 60, "syslog": 116, "open_by_handle_at": 265, "name_to_handle_at": 264,
        "clone": 220, "clone3": 435}),
}


def supported(machine: str | None = None) -> bool:
    return (machine or platform.machine()) in _ARCHES


def syscall_numbers(machine: str | None = None) -> dict[str, int]:
    """The numbers of the system calls the filter knows, on ``machine`` (empty where unsupported)."""
    arch = _ARCHES.get(machine or platform.machine())
    return dict(arch[2]) if arch else {}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter as ``struct sock_filter`` instructions (what bubblewrap's ``--seccomp`` reads)."""
    arch, foreign, numbers = _ARCHES[machine or platform.machine()]
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    out = [_insn(_LD_W_ABS, 0, 0, _ARCH), _insn(_JEQ_K, 1, 0, arch), _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
           _insn(_LD_W_ABS, 0, 0, _NR)]
    if foreign is not None:
        out += [_insn(_JGE_K, 0, 1, foreign), _insn(_RET_K, 0, 0, _RET_KILL_PROCESS)]
    for name in BLOCKED_NAMES:
        out += [_insn(_JEQ_K, 0, 1, numbers[name]), _insn(_RET_K, 0, 0, eperm)]
    out += [_insn(_JEQ_K, 0, 1, numbers["clone3"]), _insn(_RET_K, 0, 0, enosys)]
    # clone: refuse namespace flags (arg 0, the flags, on both architectures).
    out += [_insn(_JEQ_K, 0, 3, numbers["clone"]), _insn(_LD_W_ABS, 0, 0, _ARG0),
            _insn(_JSET_K, 0, 1, CLONE_NAMESPACE_FLAGS), _insn(_RET_K, 0, 0, eperm)]
    out.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    return b"".join(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]




def set_no_new_privs() -> None:
    """From now on no ``execve`` of this process or its descendants gains privileges (setuid bits,
    file capabilities); irreversible. Set for every execution, with or without the filter."""
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def install(machine: str | None = None) -> None:
    """Load the filter into this process (and everything it starts from now on); irreversible."""
    SECCOMP_MODE_FILTER = 2
    code = program(machine)
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    set_no_new_privs()  # the kernel requires it of an unprivileged caller
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")

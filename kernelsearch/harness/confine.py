"""Confining the process that runs candidate code (the child's worker, see `child.py`).

- When running as root it becomes an unprivileged user (`nobody` unless the caller names another,
  e.g. a dedicated uid): setgroups([]), setgid, setuid, in that order, and no way back.
- A Landlock ruleset (Linux >= 5.13; unprivileged, so it also confines non-root callers) leaves it
  write access to its own temp dir and the GPU device nodes only: it can still read the
  filesystem, but cannot create, change, truncate or remove anything else, cannot reach TCP, and
  (Landlock ABI >= 6) cannot signal processes outside its domain (the warden, the caller).
- TMPDIR, HOME and the Triton / CUDA / XDG caches point into its temp dir: nothing it writes
  survives it, and no cache a later trusted run would load is writable by it.
- No network: its own network namespace when root (only a loopback, down), and a seccomp
  filter that refuses inet/inet6/packet sockets and io_uring for every caller.
- Resource limits (`limits.py`: processes and threads, open files, file size, CPU time) are set
  last, as the sandbox user.

Where Landlock is missing the uid drop still holds; `status()` says which layers are active.
"""
from __future__ import annotations

import ctypes
import glob
import os
import pwd
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from kernelsearch.harness.limits import Limits

DEFAULT_USER = "nobody"
USER_ENV = "KERNELSEARCH_SANDBOX_USER"  # name or numeric uid of the unprivileged account

# Landlock (include/uapi/linux/landlock.h), x86_64 / aarch64 syscall numbers are the same
_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1
# access rights that change the filesystem, by the ABI version that introduced them
_FS_WRITE = [
    (1, (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10)
        | (1 << 11) | (1 << 12)),  # write_file, remove_dir/file, make_char/dir/reg/sock/fifo/block/sym
    (2, 1 << 13),  # refer (rename/link across directories)
    (3, 1 << 14),  # truncate
]
_FILE_RIGHTS = (1 << 1) | (1 << 14)  # rights that apply to a file (not a directory) rule
_NET_TCP = (1 << 0) | (1 << 1)  # bind_tcp, connect_tcp (ABI 4)
_SCOPE = (1 << 0) | (1 << 1)  # abstract unix sockets, signals (ABI 6)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: unavailable or disabled)."""
    try:
        r = _libc().syscall(_SYS_CREATE, None, ctypes.c_size_t(0),
                            ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(r), 0)


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when `parent` (the thread that started it) dies, and exit now if it
    already has: a child in a session of its own is reached by no signal to its parent's group.
    The kernel clears this on any change of uid, so a process sets it again after its drop."""
    import signal

    if _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_PDEATHSIG failed")
    if os.getppid() != parent:  # it died before the line above: nobody would signal us
        os._exit(1)


NO_DROP = "none"  # explicit opt-out: keep the caller's uid (Landlock and the rest still hold)


def sandbox_user(name: Optional[str] = None) -> Optional[tuple[int, int]]:
    """(uid, gid) of the unprivileged account candidates run as; None if the operator opted out
    (`none`). KeyError if it does not exist or is root."""
    name = name or os.environ.get(USER_ENV) or DEFAULT_USER
    if name == NO_DROP:
        return None
    pw = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    if pw.pw_uid == 0:
        raise KeyError(f"{name}: the sandbox user must not be root")
    return pw.pw_uid, pw.pw_gid


def install_paths(device: str = "cpu") -> list[str]:
    """What the judge's worker reads after it has become the sandbox user, as the paths Python
    opens (a symlink into a 0700 dir still has to be walked through it): every folder of its
    module search path outside the standard library (site-packages, a venv's, PYTHONPATH's:
    where a package's lazy imports such as `triton.experimental` come from) and the packages
    the judge imports, located but not imported. The standard library is imported before the
    drop (`preload`); on a GPU Triton also runs the compiler on the interpreter's headers and
    its own ptxas, so the interpreter, its library and its include dirs count too."""
    import importlib.util
    import sysconfig

    sp = sysconfig.get_paths()
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    std = sorted({os.path.abspath(base[k]) for k in ("stdlib", "platstdlib") if k in base})
    paths = [p for p in sys.path if p and os.path.isdir(p)
             and not any((os.path.abspath(p) + os.sep).startswith(d + os.sep) for d in std)]
    for mod in ("torch", "triton", "kernelsearch"):
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            paths.append(os.path.dirname(spec.origin))
    if device == "cuda":
        paths += [sys.executable] + std + [sp[k] for k in ("include", "platinclude") if k in sp]
    out: list[str] = []
    for p in map(os.path.abspath, paths):
        if p not in out:
            out.append(p)
    return out


def unreadable_install(user: tuple[int, int], device: str = "cpu",
                       paths: Optional[list[str]] = None) -> Optional[str]:
    """The first of `paths` (default `install_paths(device)`) that the sandbox user cannot read (a
    venv or conda under a 0700 /root), or None. Asked of the kernel itself: a forked process
    becomes the user and tries (os.access as that uid: modes, ACLs and every parent dir count)."""
    paths = install_paths(device) if paths is None else paths
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only reports, then exits
        bad = b""
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(user[1], user[1], user[1])
            os.setresuid(user[0], user[0], user[0])
            for p in paths:
                if not os.access(p, os.R_OK | os.X_OK):
                    bad = p.encode()
                    break
        except BaseException as e:  # noqa: BLE001 - a failed drop is a failed check
            bad = f"(could not become uid {user[0]}: {e})".encode()
        finally:
            os.write(w, bad or b"-")
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return None if got in ("", "-") else got


def prepare_dir(work: Path, uid: Optional[int], gid: Optional[int]) -> None:
    """Called by the (privileged) caller: the worker's temp dir, owned by the worker, 0700."""
    for sub in ("tmp", "cache"):
        (work / sub).mkdir(mode=0o700, exist_ok=True)
    if uid is not None:
        for p in (work, work / "tmp", work / "cache"):
            os.chown(p, uid, gid if gid is not None else -1)
    os.chmod(work, 0o700)


def _env(work: Path) -> None:
    tmp, cache = str(work / "tmp"), str(work / "cache")
    os.environ.update({
        "TMPDIR": tmp, "TEMP": tmp, "TMP": tmp, "HOME": str(work), "XDG_CACHE_HOME": cache,
        "TRITON_CACHE_DIR": os.path.join(cache, "triton"), "TRITON_HOME": cache,
        "TRITON_DUMP_DIR": os.path.join(cache, "triton-dump"),
        "TRITON_OVERRIDE_DIR": os.path.join(cache, "triton-override"),
        "CUDA_CACHE_PATH": os.path.join(cache, "nv"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor"),
    })
    import tempfile

    tempfile.tempdir = None  # recomputed from TMPDIR on next use


def _drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getegid() != gid:
        raise OSError("privilege drop did not take")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise OSError("privilege drop is reversible")


def _landlock(work: Path, abi: int) -> None:
    libc = _libc()
    fs = 0
    for ver, bits in _FS_WRITE:
        if abi >= ver:
            fs |= bits
    attr = _RulesetAttr(fs, _NET_TCP if abi >= 4 else 0, _SCOPE if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    rs = libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rs < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        # device nodes the GPU runtime opens read-write, and /dev/null
        paths = [(str(work), fs)] + [(p, fs & _FILE_RIGHTS) for p in
                                     ["/dev/null"] + sorted(glob.glob("/dev/nvidia*"))
                                     + sorted(glob.glob("/dev/dri/*"))]
        for path, rights in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    rights &= _FILE_RIGHTS
                rule = _PathBeneath(rights, fd)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(rs), ctypes.c_int(_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path} failed")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
        if libc.syscall(_SYS_RESTRICT, ctypes.c_int(rs), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(rs)


# -- no network: its own network namespace when root, a seccomp filter on inet sockets always --
_CLONE_NEWNET = 0x40000000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
_EACCES = 13
# (audit arch, socket nr, io_uring_setup nr): io_uring can open sockets without socket(2)
_ARCH = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}
_DENIED_FAMILIES = (2, 10, 17)  # AF_INET, AF_INET6, AF_PACKET
_X32_BIT = 0x40000000


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _no_inet_filter(arch: int, sock_nr: int, uring_nr: int) -> list[tuple[int, int, int, int]]:
    """A classic-BPF seccomp program: socket(AF_INET|AF_INET6|AF_PACKET, ...), io_uring_setup,
    x32 calls and calls of another architecture fail with EACCES; everything else runs."""
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, RET|K
    deny, allow = _SECCOMP_RET_ERRNO | _EACCES, _SECCOMP_RET_ALLOW
    fams = list(_DENIED_FAMILIES)
    n = len(fams)
    # indices: 0 ld arch, 1 jeq arch, 2 ld nr, 3 jge x32, 4 jeq uring, 5 jeq socket,
    # 6 ret allow, 7 ld arg0, 8.. jeq fam (n), 8+n ret allow, 9+n ret deny
    d = 9 + n
    prog = [(ld, 0, 0, 4), (jeq, 0, d - 2, arch), (ld, 0, 0, 0), (jge, d - 4, 0, _X32_BIT),
            (jeq, d - 5, 0, uring_nr), (jeq, 1, 0, sock_nr), (ret, 0, 0, allow),
            (ld, 0, 0, 16)]
    for i, f in enumerate(fams):
        here = 8 + i
        prog.append((jeq, d - here - 1, 0, f))
    prog += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return prog


def _seccomp_no_inet() -> None:
    import platform

    machine = platform.machine()
    if machine not in _ARCH:
        raise OSError(f"no seccomp network filter for {machine}: refusing to run unfenced")
    prog = _no_inet_filter(*_ARCH[machine])
    arr = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), arr)
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter (no inet sockets) failed")


def _own_netns() -> None:
    """A network namespace of its own: only a loopback, and that one down."""
    if _libc().unshare(_CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")


def fence_network(privileged: bool) -> list[str]:
    """No network at all for candidate code (Landlock fences TCP only): its own network
    namespace when we may make one (root with CAP_SYS_ADMIN; a container's root without it
    gets the filter alone, said in the verdict), and always a seccomp filter refusing inet and
    packet sockets and io_uring. Raises if the filter cannot be put in place (fail closed).
    Returns the layers that hold."""
    layers = []
    if privileged:
        try:
            _own_netns()
            layers.append("netns")
        except OSError as e:  # root without CAP_SYS_ADMIN (a container): seccomp still holds
            if e.errno not in (1, 22):  # EPERM, EINVAL (no netns support)
                raise
            layers.append(f"no netns ({os.strerror(e.errno)})")
    _seccomp_no_inet()
    layers.append("seccomp")
    return layers


def preload(family: str, device: str) -> None:
    """Import what the judge needs while the install is still readable: a Python under a 0700
    home (pyenv in /root) is not readable by the sandbox user, and nothing it imports later
    comes from candidate-controlled paths anyway."""
    import importlib

    for m in ("statistics", "random", "functools", "psutil", "numpy", "torch", "torch.overrides",
              "triton", "triton.language", "triton.runtime.interpreter",
              "kernelsearch.families", "kernelsearch.families.base", "kernelsearch.runtime",
              "kernelsearch.harness.judge", "kernelsearch.harness.correctness",
              "kernelsearch.harness.random_shapes",
              "kernelsearch.harness.timing", "kernelsearch.harness.sandbox",
              "kernelsearch.harness.limits"):
        try:
            importlib.import_module(m)
        except ImportError:
            pass
    from kernelsearch.families import get
    from kernelsearch.runtime import ensure_scratch_allocator

    try:
        get(family)
    except Exception:
        pass  # the judge reports an unknown family itself
    if device == "cuda":
        import torch

        torch.cuda.init()
    ensure_scratch_allocator()


def enter(work: Path, user: Optional[tuple[int, int]], family: str = "",
          device: str = "cpu", limits: Optional["Limits"] = None) -> dict:
    """Confine this process (the worker, before it imports candidate code). `user`: (uid, gid)
    to become when root, None to keep the current one; `limits`: the resource limits to set
    last (`limits.py`). Raises if a layer that should hold cannot be put in place (fail
    closed). Returns what holds, for the verdict."""
    _env(work)
    os.chdir(work)
    os.umask(0o077)
    drop = user is not None and os.geteuid() == 0
    if drop or device == "cuda":
        # the GPU runtime opens, creates and maps what it needs (device nodes, its shared
        # memory) at its first call: done before the fences go up, or CUDA cannot start in them
        preload(family, device)
    net = fence_network(privileged=os.geteuid() == 0)
    abi = landlock_abi()
    if abi:
        _landlock(work, abi)
    if drop:
        assert user is not None
        _drop_privileges(*user)
    report: dict = {"landlock_abi": abi, "uid": os.geteuid(), "network": net}
    if limits is not None:  # after the drop: RLIMIT_NPROC counts the tasks of the real uid
        from kernelsearch.harness.limits import apply

        report["limits"] = apply(limits)
    return report

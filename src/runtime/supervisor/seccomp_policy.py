"""The system calls a sandbox process may not make, as a libseccomp filter (Debian's
python3-seccomp binds libseccomp). Everything else is allowed: the kernel's own permission
checks (the sandbox's user namespace, its capabilities) still apply to it.

The list (docs/sandbox-isolation.md explains each group):
- kernel keyrings, BPF, perf events, kernel modules and kexec: interfaces with a long record of
  privilege escalations, and none a sandboxed program needs;
- open_by_handle_at / name_to_handle_at: open files by handle, bypassing the mount namespace;
- userfaultfd and io_uring: widely used to exploit kernel races; programs fall back without them;
- every way to mount, unmount, pivot or make new mount/user/other namespaces (mount, umount2,
  pivot_root, the new mount API, unshare and clone with a CLONE_NEW* flag, setns; clone3 answers
  ENOSYS so the C library falls back to clone, whose flags the filter can see);
- clock, swap, reboot, accounting, quota, kernel log and other host-wide settings;
- vsock sockets (a path to the hypervisor or host, never the sandbox's to use), EAFNOSUPPORT;
- personality flags other than the plain Linux ones and UNAME26 (READ_IMPLIES_EXEC,
  ADDR_NO_RANDOMIZE and the like weaken what protects the sandbox's own programs).
Calls on this list fail with EPERM (ENOSYS for clone3); the process goes on.
"""
import errno
import sys

# Imported here, on the host, before the supervisor ever looks at the sandbox's files: the
# sandbox's own /usr (which its root may change) must never provide this module.
sys.path.append('/usr/lib/python3/dist-packages')
try:
    import seccomp
except ImportError:
    seccomp = None
finally:
    sys.path.pop()

DENIED = [
    # Keyrings, BPF, perf.
    'add_key', 'request_key', 'keyctl', 'bpf', 'perf_event_open',
    # Kernel modules and kexec.
    'init_module', 'finit_module', 'delete_module', 'create_module', 'kexec_load', 'kexec_file_load',
    # File handles that bypass mount namespaces.
    'open_by_handle_at', 'name_to_handle_at',
    # Exploit primitives.
    'userfaultfd', 'io_uring_setup', 'io_uring_enter', 'io_uring_register',
    # Mounts and namespaces.
    'mount', 'umount', 'umount2', 'pivot_root', 'open_tree', 'move_mount', 'fsopen', 'fsconfig',
    'fsmount', 'fspick', 'mount_setattr', 'setns',
    # Host-wide settings.
    'swapon', 'swapoff', 'reboot', 'acct', 'quotactl', 'quotactl_fd', 'syslog', 'settimeofday', 'stime',
    'clock_settime', 'clock_adjtime', 'adjtimex', 'iopl', 'ioperm', 'lookup_dcookie', 'nfsservctl',
    'uselib', 'ustat', 'sysfs', '_sysctl', 'vm86', 'vm86old', 'get_kernel_syms', 'query_module',
    'fanotify_init',
]
AF_VSOCK = 40
# personality() may set no flag but UNAME26 (0x0008) and the LINUX32 persona (0x20000), or ask
# (0xffffffff, every bit).
PERSONALITY_BITS = 0x20008


def personality_denials():
    """(mask, datum) pairs, any one matching refuses the call: all of them together let
    through exactly the values above. libseccomp takes one comparison per argument and rule,
    so "not in a set" is spelled with bit 0 (clear in every allowed value but the query):
    bit 0 clear and a flag outside PERSONALITY_BITS set; or bit 0 set and any other bit clear.
    """
    denials = []
    for bit in range(1, 32):
        flag = 1 << bit
        if not flag & PERSONALITY_BITS:
            denials.append((flag | 1, flag))
        denials.append((flag | 1, 1))
    return denials

NAMESPACE_FLAGS = [
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
]


def available():
    return seccomp is not None


def load():
    """Installs the filter on this process (inherited by everything it starts). Needs no_new_privs."""
    policy = seccomp.SyscallFilter(seccomp.ALLOW)
    # A binary tree of system call numbers instead of a list: every allowed call pays a few
    # comparisons, not one per rule.
    policy.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED:
        policy.add_rule(deny, name)
    policy.add_rule(seccomp.ERRNO(errno.ENOSYS), 'clone3')
    policy.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), 'socket', seccomp.Arg(0, seccomp.EQ, AF_VSOCK))
    for mask, datum in personality_denials():
        policy.add_rule(deny, 'personality', seccomp.Arg(0, seccomp.MASKED_EQ, mask, datum))
    for flag in NAMESPACE_FLAGS:
        policy.add_rule(deny, 'unshare', seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        # x86_64, arm64 and most others pass clone's flags first (s390 second: not supported).
        policy.add_rule(deny, 'clone', seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    policy.load()

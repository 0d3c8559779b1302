#!/usr/bin/env python3
"""Where a loaded BPF program's time goes, by source line: perf samples inside its JITed
code, and in the helpers it calls, attributed through the program's jited line info to
the lines of bypass-ebpf (and of the libraries inlined into it).

  skmsg-lines.py record PROG SECONDS OUT   # root, while a workload runs: perf record -g -a
                                           # for SECONDS, and bpf_stats runs/ns over them
  skmsg-lines.py report PROG OUT           # the tables (the program must still be loaded)

Needs perf and bpftool (Debian: linux-perf, bpftool). Used for results/research/skmsg-lines.txt.
"""
import bisect, collections, ctypes, json, os, re, struct, subprocess, sys

libc = ctypes.CDLL(None, use_errno=True)
SYS_BPF, PROG_GET_FD_BY_ID, OBJ_GET_INFO_BY_FD, INFO_LEN = 321, 13, 15, 232


def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 128)
    r = libc.syscall(SYS_BPF, cmd, buf, 128)
    if r < 0:
        raise OSError(ctypes.get_errno(), f"bpf command {cmd}")
    return r


def prog_fd(name):
    out = subprocess.run(["bpftool", "prog", "show"], capture_output=True, text=True, check=True).stdout
    ids = {m.group(2): int(m.group(1)) for m in re.finditer(r"^(\d+): \S+\s+name (\S+)", out, re.M)}
    if name not in ids:
        sys.exit(f"no loaded program named {name}: start the agent first")
    return ids[name], bpf(PROG_GET_FD_BY_ID, struct.pack("I", ids[name]))


def prog_info(fd, lines=0, jlines=0):
    raw = ctypes.create_string_buffer(INFO_LEN)
    bufs = []
    if lines:
        for cnt_off, n, ptr_off, size in ((148, lines, 152, 16), (168, jlines, 160, 8)):
            b = ctypes.create_string_buffer(n * size)
            bufs.append(b)
            struct.pack_into("I", raw, cnt_off, n)
            struct.pack_into("Q", raw, ptr_off, ctypes.addressof(b))
        struct.pack_into("II", raw, 172, 16, 8)
    bpf(OBJ_GET_INFO_BY_FD, struct.pack("IIQ", fd, INFO_LEN, ctypes.addressof(raw)))
    return raw, bufs


def stats(fd):
    raw, _ = prog_info(fd)
    return struct.unpack_from("QQ", raw, 192)  # run_time_ns, run_cnt


def record(name, secs, out):
    _, fd = prog_fd(name)
    subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"], check=True)
    try:
        ns0, n0 = stats(fd)
        subprocess.run(["perf", "record", "-q", "-g", "-a", "-o", out, "--", "sleep", str(secs)], check=True)
        ns1, n1 = stats(fd)
    finally:
        subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=0"], check=True)
    with open(out + ".json", "w") as f:
        json.dump({"runs": n1 - n0, "ns": ns1 - ns0}, f)


FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:unsafe\s+)?fn\s+(\w+)")
_files = {}


def enclosing(path, line):
    """The function of this repository that a line is in (None for a library's line)."""
    if "/.cargo/" in path or "/rustlib/" in path or not os.path.exists(path):
        return None
    if path not in _files:
        _files[path] = open(path).read().splitlines()
    for l in reversed(_files[path][:line]):
        m = FN.match(l)
        if m:
            return f"{os.path.basename(path)}:{m.group(1)}"
    return None


def report(name, data):
    pid, fd = prog_fd(name)
    raw, _ = prog_info(fd)
    nr_line, nr_jline = struct.unpack_from("I", raw, 148)[0], struct.unpack_from("I", raw, 168)[0]
    tag = bytes(raw[8:16]).hex()
    _, (lbuf, jbuf) = prog_info(fd, nr_line, nr_jline)
    insn_of = [struct.unpack_from("I", lbuf, i * 16)[0] for i in range(nr_line)]
    jaddr = [struct.unpack_from("Q", jbuf, i * 8)[0] for i in range(nr_jline)]
    order = sorted(range(nr_jline), key=lambda i: jaddr[i])
    addrs = [jaddr[i] for i in order]
    src, cur = {}, None
    dump = subprocess.run(["bpftool", "prog", "dump", "xlated", "id", str(pid), "linum"],
                          capture_output=True, text=True, check=True).stdout
    for l in dump.splitlines():
        m = re.match(r"; (.*) \[file:(\S+) line_num:(\d+)", l)
        if m:
            cur = (m.group(2), int(m.group(3)), m.group(1).strip()[:64])
        elif (m := re.match(r"\s*(\d+): ", l)) and cur:
            src[int(m.group(1))] = cur
    sym = f"bpf_prog_{tag}_{name}"
    script = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym"],
                            capture_output=True, text=True, check=True).stdout
    per, helper, total = collections.Counter(), collections.Counter(), 0
    for block in script.split("\n\n"):
        frames = [f.split(None, 1) for f in block.strip().splitlines() if f.strip()]
        if not frames:
            continue
        leaf = frames[0][1] if len(frames[0]) > 1 else ""
        for f in frames:
            if len(f) > 1 and f[1].startswith(sym):
                k = bisect.bisect_right(addrs, int(f[0], 16)) - 1
                where = src.get(insn_of[order[k]], ("?", 0, "?")) if k >= 0 else ("?", 0, "?")
                per[where] += 1
                total += 1
                if not leaf.startswith(sym):
                    helper[(where, leaf.split("+")[0])] += 1
                break
    if not total:
        sys.exit(f"no sample in {sym} or a helper it called")
    meta = json.load(open(data + ".json")) if os.path.exists(data + ".json") else {"runs": 0, "ns": 0}
    ns = meta["ns"] / meta["runs"] if meta["runs"] else 0
    print(f"{name}: {total} samples in the program or the helpers it called; "
          f"bpf_stats over the window: {ns:.0f} ns/run, {meta['runs']} runs")
    print("-- by line (library lines are inlined code; a helper's samples count at the line that calls it):")
    for w, n in per.most_common(25):
        print(f"{100*n/total:5.1f}%  {ns*n/total:4.0f} ns  {os.path.basename(w[0])}:{w[1]}  {w[2]}")
    print("-- in helpers, by the line that calls them:")
    for (w, h), n in helper.most_common(14):
        print(f"{100*n/total:5.1f}%  {ns*n/total:4.0f} ns  {h:28s} from {os.path.basename(w[0])}:{w[1]}")
    by_fn = collections.Counter()
    for w, n in per.items():
        by_fn[enclosing(w[0], w[1]) or "(library code inlined, helpers)"] += n
    print("-- by function of bypass-ebpf and bypass-common (inlined code counts where it is written):")
    for f, n in by_fn.most_common(20):
        print(f"{100*n/total:5.1f}%  {ns*n/total:4.0f} ns  {f}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "record":
        record(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 4 and sys.argv[1] == "report":
        report(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)

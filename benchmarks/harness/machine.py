"""The machine a run measured: its CPU, cores, memory; pinning to cores; memory faulted in."""

import os
import platform
import resource

PAGE = os.sysconf("SC_PAGE_SIZE")
HUGE_PAGE = 2 << 20


def cpu_description():
    """The CPU's model and the widest vectors the library's hot loops use on it: results differ by CPU."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    vectors = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model}, {vectors}"


def platform_description():
    """'x86_64, 2 CPUs, Linux-...': the machine in one line."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}"


def numa_nodes():
    """{"node0": "0-7", ...}: the machine's NUMA nodes and their CPUs (sysfs); {} where it cannot be read."""
    nodes = {}
    try:
        for name in sorted(os.listdir("/sys/devices/system/node")):
            if name.startswith("node") and name[4:].isdigit():
                with open(f"/sys/devices/system/node/{name}/cpulist") as f:
                    nodes[name] = f.read().strip()
    except OSError:
        pass
    return nodes


def pin(cores):
    """Pins this process to its first `cores` allowed CPUs (children started later inherit them) and
    returns them as taskset's list ("0,1")."""
    cpus = sorted(os.sched_getaffinity(0))[:cores]
    os.sched_setaffinity(0, cpus)
    return ",".join(map(str, cpus))


def taskset(cpu_list, command):
    """The command pinned to cpu_list (taskset), or as is without a list."""
    return (["taskset", "-c", cpu_list] if cpu_list else []) + list(command)


def available_bytes():
    """MemAvailable (8 GiB where /proc/meminfo cannot say)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def huge_page_faults():
    """Transparent huge pages faulted in, machine-wide (/proc/vmstat; 0 where there is none)."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                name, value = line.split()
                if name == "thp_fault_alloc":
                    return int(value)
    except OSError:
        pass
    return 0


def faulted_bytes():
    """Bytes this process has faulted in so far: each minor fault maps a page, or 2 MB where it made a huge
    page (the pool's large storages ask for them: counted as pages, their faults would look 512x rarer)."""
    huge = huge_page_faults()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - huge) * PAGE + huge * HUGE_PAGE


def gpu_slug(name):
    """A GPU's name as a file name part: 'NVIDIA H200' -> 'nvidia_h200'."""
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()

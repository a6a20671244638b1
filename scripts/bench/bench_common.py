"""What the PyTorch sides of the benchmarks (scripts/bench/*_torch.py) share:
the timing method of scripts/bench/common.lua, so that both sides measure
alike. Each script prints "name value" lines for its Lua side to read."""
import statistics
import time


def median_time(fn, reps, warmup=3):
    """Seconds for one call: warmup untimed calls, then the median of reps
    timed calls."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def per_iter(fn, n, reps=5, warmup=0):
    """Seconds per call: warmup untimed calls, then the median over reps runs
    of n calls each."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t0) / n)
    return statistics.median(ts)


def peak_rss_mb():
    """This process's peak resident set (VmHWM of /proc/self/status) in MB;
    getrusage's ru_maxrss where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

"""Timing helpers shared by the Python benchmarks (imported as a sibling
module: the benchmarks run as scripts from this folder)."""


def calibrate(timer, min_time, max_number=1 << 30):
    """How many statements one measurement of ``timer`` (a timeit.Timer) runs
    so that it takes about ``min_time`` seconds: the count grows fourfold
    until a run takes a tenth of that (or reaches ``max_number``), then is
    scaled up."""
    number = 1
    while True:
        elapsed = timer.timeit(number)
        if elapsed >= min_time / 10 or number >= max_number:
            break
        number *= 4
    return max(1, int(number * min_time / max(elapsed, 1e-9)))

"""The training loop's batches, drawn ahead: each by a background thread while the one before it trains."""

from concurrent.futures import ThreadPoolExecutor


def prefetched(draw, starts):
    """draw(first) for each `first` of `starts`, in order, each drawn by a background thread while the
    micro-batch before it trains (numpy and torch let go of the GIL in their kernels), so that drawing a
    batch is off the step's path."""
    with ThreadPoolExecutor(1) as pool:
        ahead = None
        for first in starts:
            now, ahead = ahead, pool.submit(draw, first)
            if now:
                yield now.result()
        if ahead:
            yield ahead.result()

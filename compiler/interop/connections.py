"""The connections of a program given by its transfers alone, as the MSCCL and MSCCL++ exporters
cut it: a connection is a (sender, receiver, channel) triple, each carrying the transfers of that
pair on that channel. Both engines' up-front checks count from here (``msccl_limits``,
``mscclpp_limits``), so that a program can be weighed before it is built."""
from __future__ import annotations

import numpy as np


def connections(src, dst, channel, nranks: int) -> tuple[np.ndarray, np.ndarray]:
    """``(pair, count)`` of every connection of the transfers ``src[i] -> dst[i]`` on channel
    ``channel[i]`` (None: one channel) among ``nranks`` ranks: ``pair = sender * nranks +
    receiver`` (a pair on several channels appears once per channel) and the transfers it carries,
    in the order of (pair, channel). Empty arrays for no transfer."""
    n = int(nranks)
    src = np.asarray(src, np.int64)
    dst = np.asarray(dst, np.int64)
    if not src.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ch = np.zeros(src.size, np.int64) if channel is None else np.asarray(channel, np.int64)
    C = int(ch.max()) + 1
    keys, count = np.unique((src * n + dst) * C + ch, return_counts=True)
    return keys // C, count.astype(np.int64)


__all__ = ["connections"]

"""Test helper: the oracle of which AllToAllv calls with device counts the kernels run and which
they refuse (``hccc_launch_init``'s checks, kernel ABI 9's ``vlens``), in Python integers."""
from __future__ import annotations


def fit_verdict(c, send_len, recv_len, inplace, k, slot):
    """The oracle of a call with device counts and packed displacements: None when every block
    fits, else (why, entry) of the first refusal in the kernels' documented order (a negative
    count or one whose pieces, ``k`` a block, pass a scratch slot of ``slot`` elements, row by row;
    in place, an asymmetric pair, row by row; a block past its sender's send buffer, row by row;
    past its receiver's receive buffer, column by column). Python integers: no sum wraps."""
    n = len(c)
    c = [[int(v) for v in row] for row in c]
    for s in range(n):
        for d in range(n):
            if c[s][d] < 0 or -(-c[s][d] // k) > slot:
                return "COUNT", s * n + d
    if inplace:
        for s in range(n):
            for d in range(n):
                if c[s][d] != c[d][s]:
                    return "ASYM", s * n + d
    for s in range(n):
        for d in range(n):
            if c[s][d] > 0 and sum(c[s][:d + 1]) > send_len[s]:
                return "SEND", s * n + d
    for d in range(n):
        for s in range(n):
            if c[s][d] > 0 and sum(c[i][d] for i in range(s + 1)) > recv_len[d]:
                return "RECV", s * n + d
    return None
